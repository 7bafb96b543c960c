"""Recorder(payloads=...): the real tensors of sampled calls, as safetensors files.

Real recorder, real files, a real tiny Llama under generate(); no pickle anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch
from click.testing import CliRunner

import capture
from capture.cli.main import cli
from capture.errors import CaptureError
from capture.record.recorder_options import Payloads
from capture.store.payload_files import list_payloads, read_payload
from fixtures.models import run_generate, tiny_llama
from fixtures.names import cache_argument


class Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor, factor: float = 2.0) -> torch.Tensor:
        return x * factor


class AddsInPlace(torch.nn.Module):
    """Changes its input in place, as a static cache's update does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        return x * 2


def _record(root: Path, model: Any, calls: list[torch.Tensor], **options: Any) -> dict[str, int]:
    with capture.Recorder(model, root, flush_seconds=3600, **options) as rec:
        for x in calls:
            model(x)
    return rec.stats()


def _payloads(root: Path) -> list[Any]:
    fs = pafs.LocalFileSystem()
    return [read_payload(fs, p.path) for p in list_payloads(root)]


def test_payloads_are_off_by_default(tmp_path: Path) -> None:
    stats = _record(tmp_path, Scale(), [torch.randn(2, 3)])
    assert stats["recorded"] == 1
    assert not (tmp_path / "payloads").exists()
    assert "payloads" not in stats


def test_payload_file_is_safetensors_not_pickle(tmp_path: Path) -> None:
    _record(tmp_path, Scale(), [torch.randn(2, 3)], payloads=1.0)
    (path,) = [p.path for p in list_payloads(tmp_path)]
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    assert header["__metadata__"]["capture.kind"] == "payload"
    assert header["in/0"]["dtype"] == "F32" and header["in/0"]["shape"] == [2, 3]
    assert not data.startswith(b"\x80")  # a pickle stream starts with the PROTO opcode
    assert not data.startswith(b"PK")  # torch.save writes a zip archive of pickles


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8]
)
def test_payload_file_reads_back_with_safetensors(tmp_path: Path, dtype: torch.dtype) -> None:
    from safetensors import safe_open

    x = (torch.randn(3, 5) * 4).to(dtype)
    _record(tmp_path, torch.nn.Identity(), [x, x[:0]], payloads=1.0)
    empty, full = sorted((p.path for p in list_payloads(tmp_path)), reverse=True)
    with safe_open(full, framework="pt") as f:
        assert torch.equal(f.get_tensor("in/0"), x) and torch.equal(f.get_tensor("out/0"), x)
        assert f.metadata()["outputs"] == "kept"
    with safe_open(empty, framework="pt") as f:
        assert f.get_tensor("in/0").shape == (0, 5)


def test_payload_holds_the_inputs_and_outputs_of_the_call(tmp_path: Path) -> None:
    x = torch.randn(3, 4)
    _record(tmp_path, Scale(), [x], payloads=1.0)
    (payload,) = _payloads(tmp_path)
    assert torch.equal(payload.inputs()[0], x)
    assert torch.equal(payload.outputs()[0], x * 2)


def test_payload_inputs_are_copied_before_forward_changes_them(tmp_path: Path) -> None:
    x = torch.zeros(2, 2)
    _record(tmp_path, AddsInPlace(), [x], payloads=1.0)
    (payload,) = _payloads(tmp_path)
    assert torch.equal(payload.inputs()[0], torch.zeros(2, 2))
    assert torch.equal(x, torch.ones(2, 2))  # the model's own effect is kept as it was


def test_payloads_do_not_change_generate_results(tmp_path: Path) -> None:
    model = tiny_llama()
    plain = run_generate(model, [(2, 6)], max_new_tokens=3)
    with capture.Recorder(model, tmp_path, flush_seconds=3600, payloads=1.0) as rec:
        kept = run_generate(model, [(2, 6)], max_new_tokens=3)
    assert rec.stats()["payloads"] == 3
    assert all(torch.equal(a, b) for a, b in zip(plain, kept, strict=True))


def test_generate_payload_keeps_every_cache_tensor(tmp_path: Path) -> None:
    model = tiny_llama()
    with capture.Recorder(model, tmp_path, flush_seconds=3600, payloads=1.0):
        run_generate(model, [(1, 5)], max_new_tokens=2)
    with capture.open_store(tmp_path) as store:
        rows = store.query(
            "SELECT leaf, path, shape FROM leaves WHERE side = 'input' "
            "AND kind = 'tensor' AND call_id = (SELECT max(call_id) FROM calls)"
        ).to_pylist()
    (payload,) = [p for p in _payloads(tmp_path) if p.call_id == max(_ids(tmp_path))]
    kept = payload.inputs()
    assert sum(cache_argument() in r["path"] for r in rows) == 4  # 2 layers x (keys, values)
    assert {r["leaf"]: r["shape"] for r in rows} == {i: list(t.shape) for i, t in kept.items()}


def _ids(root: Path) -> list[int]:
    with capture.open_store(root) as store:
        return store.query("SELECT call_id FROM calls").column(0).to_pylist()


def test_payload_over_the_call_cap_is_skipped_and_counted(tmp_path: Path) -> None:
    small, big = torch.randn(2, 2), torch.randn(100, 100)
    stats = _record(
        tmp_path, Scale(), [small, big, small], payloads=Payloads(1.0, max_call_bytes=1000)
    )
    assert stats["payloads_oversize"] == 1
    assert [p.inputs()[0].shape for p in _payloads(tmp_path)] == [(2, 2), (2, 2)]


def test_payloads_stop_at_the_store_budget(tmp_path: Path) -> None:
    calls = [torch.randn(10, 10) for _ in range(5)]  # 400 bytes in, 400 out per call
    stats = _record(tmp_path, Scale(), calls, payloads=Payloads(1.0, max_store_bytes=2000))
    # 800 + 800, then the third call's inputs still fit (its outputs do not), then nothing.
    assert (stats["payloads"], stats["payloads_over_budget"]) == (3, 2)
    assert [p.outputs() is None for p in _payloads(tmp_path)] == [False, False, True]


def test_store_budget_counts_what_the_store_already_holds(tmp_path: Path) -> None:
    _record(tmp_path, Scale(), [torch.randn(10, 10)] * 2, payloads=1.0)
    stats = _record(
        tmp_path, Scale(), [torch.randn(10, 10)], payloads=Payloads(1.0, max_store_bytes=2000)
    )
    assert stats["payloads_over_budget"] == 1


def test_payload_rate_keeps_a_fraction(tmp_path: Path) -> None:
    policy = Payloads(0.25, max_pending=200)  # the writer never falls behind here
    stats = _record(tmp_path, Scale(), [torch.randn(1)] * 200, payloads=policy)
    assert stats["payloads_dropped"] == 0
    assert 15 <= stats["payloads"] <= 100
    assert len(list_payloads(tmp_path)) == stats["payloads"]


@pytest.mark.parametrize("bad", [-0.1, 1.5, Payloads(0.5, max_call_bytes=0)])
def test_bad_payload_option_is_refused_at_construction(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(CaptureError, match="payloads|max_call_bytes"):
        capture.Recorder(Scale(), tmp_path, payloads=bad)


def test_payloads_without_safetensors_fail_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(CaptureError, match=r"pip install 'capture\[payloads\]'"):
        capture.Recorder(Scale(), tmp_path, payloads=0.1)


def test_recorder_without_safetensors_records_without_payloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    assert _record(tmp_path, Scale(), [torch.randn(2)])["recorded"] == 1


def test_no_temporary_file_is_left(tmp_path: Path) -> None:
    _record(tmp_path, Scale(), [torch.randn(2)] * 3, payloads=1.0)
    names = [n for _, _, files in os.walk(tmp_path / "payloads") for n in files]
    assert len(names) == 3 and not any(n.startswith(".") for n in names)


def _store_with_two_days(root: Path) -> None:
    _record(root, Scale(), [torch.randn(2)] * 2, payloads=1.0)
    first, second = sorted(p.path for p in list_payloads(root))
    old = Path(first).parent.parent / "date=2020-01-01"
    old.mkdir()
    shutil.move(first, old / Path(first).name)


def test_cli_lists_payloads_per_model_and_day(tmp_path: Path) -> None:
    _store_with_two_days(tmp_path)
    result = CliRunner().invoke(cli, ["--store", str(tmp_path), "payloads", "-f", "csv"])
    sizes = [p.size for p in list_payloads(tmp_path)]
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "model,date,files,bytes"
    assert [line.rsplit(",", 2)[0] for line in result.stdout.splitlines()[1:]] == [
        "Scale,2020-01-01",
        f"Scale,{list_payloads(tmp_path)[1].date}",
    ]
    assert len(sizes) == 2


def test_cli_deletes_payloads_before_a_day(tmp_path: Path) -> None:
    _store_with_two_days(tmp_path)
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path), "payloads", "--delete-before", "2021-01-01"]
    )
    assert result.exit_code == 0
    assert result.stderr.startswith("deleted 1 payload file(s)")
    assert [p.date for p in list_payloads(tmp_path)] != ["2020-01-01"]
    assert len(list_payloads(tmp_path)) == 1


def test_cli_dry_run_deletes_nothing(tmp_path: Path) -> None:
    _store_with_two_days(tmp_path)
    result = CliRunner().invoke(
        cli, ["--store", str(tmp_path), "payloads", "--delete-all", "--dry-run"]
    )
    assert result.exit_code == 0
    assert result.stderr.startswith("would delete 2 payload file(s)")
    assert len(list_payloads(tmp_path)) == 2


def test_cli_payloads_of_a_missing_store_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--store", str(tmp_path / "nope"), "payloads"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert (
        result.stderr
        == f"Error: no store at {tmp_path / 'nope'}; record into it first or pass --store\n"
    )


class Fails(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("bad input")


def test_call_that_raised_keeps_no_payload(tmp_path: Path) -> None:
    model = Fails()
    with capture.Recorder(model, tmp_path, payloads=1.0) as rec:
        with pytest.raises(ValueError, match="bad input"):
            model(torch.randn(2))
    assert rec.stats()["recorded"] == 1
    assert list_payloads(tmp_path) == []


def test_call_with_a_dtype_safetensors_lacks_is_dropped_and_counted(tmp_path: Path) -> None:
    stats = _record(tmp_path, Scale(), [torch.randn(2, dtype=torch.complex64)], payloads=1.0)
    assert stats["payloads_dropped"] == 1
    assert list_payloads(tmp_path) == []
