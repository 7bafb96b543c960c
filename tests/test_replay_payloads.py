"""replay.export on sampled real calls: coverage rows of kind 'payload'.

The check runs the program on the calls production really made, and compares with eager and with
the outputs production got: it must be able to disagree where the rebuilt signatures agree.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch
import torch.utils._pytree as pytree

import capture
import replay
from capture.store.payload_files import list_payloads
from capture.store.reader import StoreReader
from fixtures.models import run_generate, tiny_llama
from fixtures.names import cache_argument
from replay.check.payload_rows import payload_rows


class Scaled:
    """An input container whose flattening drops its `scale` (as a lost `cumulative_length`
    of transformers' sliding-window layers would be): a rebuilt call always has scale 1."""

    def __init__(self, x: torch.Tensor, scale: float = 1.0) -> None:
        self.x, self.scale = x, scale


@pytest.fixture
def scaled_registered() -> Iterator[None]:
    pytree.register_pytree_node(
        Scaled,
        lambda s: ([s.x], None),
        lambda children, _: Scaled(children[0]),
        serialized_type_name="tests.test_replay_payloads.Scaled",
        flatten_with_keys_fn=lambda s: ([(pytree.GetAttrKey("x"), s.x)], None),
    )
    yield
    pytree._deregister_pytree_node(Scaled)


class UsesScaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, batch: Scaled) -> torch.Tensor:
        return self.lin(batch.x) * batch.scale


class Tiny(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * mask.unsqueeze(-1)


def _tiny_calls(model: Tiny) -> None:
    for b, s in ((2, 3), (3, 5), (2, 5)):
        model(torch.randn(b, s, 4), (torch.arange(s) < s - 1).long().expand(b, s))


def _record_tiny(root: Path, payloads: float = 1.0) -> Tiny:
    model = Tiny()
    with capture.Recorder(model, root, name="Tiny", flush_seconds=3600, payloads=payloads):
        _tiny_calls(model)
    return model


def _rows(result: replay.ExportResult, kind: str) -> list[dict[str, Any]]:
    return [r for r in result.coverage.to_pylist() if r["kind"] == kind]


def test_every_sampled_call_becomes_a_covered_payload_row(tmp_path: Path) -> None:
    model = _record_tiny(tmp_path)
    result = replay.export(model, tmp_path)
    rows = _rows(result, "payload")
    assert len(rows) == 3
    assert all(r["covered"] and r["calls"] == 1 for r in rows)
    assert result.complete


@pytest.mark.slow
def test_generate_payloads_are_covered(tmp_path: Path) -> None:
    model = tiny_llama()
    with capture.Recorder(model, tmp_path, flush_seconds=3600, payloads=1.0):
        run_generate(model, [(1, 5), (2, 7)], max_new_tokens=3)
    result = replay.export(model, tmp_path)
    rows = _rows(result, "payload")
    assert len(rows) == 6
    assert [r["error"] for r in rows if not r["covered"]] == []
    assert {r["group"] for r in rows} == set(result.programs)  # every group met a real call


def test_payload_row_catches_state_the_rebuilt_call_lost(
    tmp_path: Path, scaled_registered: None
) -> None:
    model = UsesScaled()
    with capture.Recorder(model, tmp_path, flush_seconds=3600, payloads=1.0), torch.no_grad():
        for b in (2, 3, 4):
            model(Scaled(torch.randn(b, 4), scale=3.0))
    result = replay.export(model, tmp_path)
    # The rebuilt signatures agree with eager (both lose the scale): they cannot tell.
    assert all(r["covered"] for r in _rows(result, "recorded"))
    payload = _rows(result, "payload")
    # the real calls, compared with what production got, disagree.
    assert [r["covered"] for r in payload] == [False, False, False]
    assert all("output production returned" in r["error"] for r in payload)
    assert not result.complete


def test_payload_row_catches_a_program_that_differs_from_eager(tmp_path: Path) -> None:
    model = _record_tiny(tmp_path)
    result = replay.export(model, tmp_path)
    other = Tiny(seed=1)  # eager is another model: the program (of `model`) disagrees with it
    with StoreReader(tmp_path) as store:
        rows, _ = payload_rows(other, store, result.inputs, result.programs, result.errors)
    assert [r.covered for r in rows] == [False, False, False]
    assert all((r.error or "").startswith("program vs eager on the real call") for r in rows)


def test_store_without_payloads_exports_no_payload_rows(tmp_path: Path) -> None:
    model = Tiny()
    with capture.Recorder(model, tmp_path, flush_seconds=3600):
        _tiny_calls(model)
    result = replay.export(model, tmp_path, probes=0)
    assert {r["kind"] for r in result.coverage.to_pylist()} == {"recorded"}  # no payload rows
    assert result.complete


def test_payload_of_an_unknown_structure_is_not_covered(tmp_path: Path) -> None:
    _record_tiny(tmp_path / "a")
    other = torch.nn.Linear(4, 3)
    with capture.Recorder(other, tmp_path / "b", name="Tiny", flush_seconds=3600):
        other(torch.randn(2, 4))
        other(torch.randn(3, 4))
    source = list_payloads(tmp_path / "a")[0].path
    target = Path(source.replace(str(tmp_path / "a"), str(tmp_path / "b")))
    target.parent.mkdir(parents=True)
    shutil.copy(source, target)
    result = replay.export(other, tmp_path / "b")
    (row,) = _rows(result, "payload")
    assert not row["covered"]
    assert "matches no exported group" in row["error"]
    assert not result.complete


def test_truncated_payload_is_reported_not_covered(tmp_path: Path) -> None:
    model = _record_tiny(tmp_path)
    path = Path(list_payloads(tmp_path)[0].path)
    path.write_bytes(path.read_bytes()[:20])
    result = replay.export(model, tmp_path)
    broken = [r for r in _rows(result, "payload") if r["group"] is None]
    assert len(broken) == 1 and "truncated or not safetensors" in broken[0]["error"]
    assert not result.complete


def test_payload_check_is_bounded(tmp_path: Path) -> None:
    model = _record_tiny(tmp_path)
    result = replay.export(model, tmp_path, max_payloads=2)
    assert len(_rows(result, "payload")) == 2
    assert "payloads: checked the newest 2 of 3 sampled calls" in result.notes


def test_real_call_rebuilds_the_dynamic_cache(tmp_path: Path) -> None:
    from transformers import DynamicCache

    from capture.store.payload_files import read_payload
    from replay.check.payload_rows import real_call

    model = tiny_llama()
    with capture.Recorder(model, tmp_path, flush_seconds=3600, payloads=1.0):
        run_generate(model, [(1, 4)], max_new_tokens=2)
    inputs = replay.export_inputs(tmp_path)
    decode = next(g for g in inputs.groups if g.name.startswith("decode"))
    files = [read_payload(pafs.LocalFileSystem(), p.path) for p in list_payloads(tmp_path)]
    payload = next(p for p in files if p.in_structure == decode.structure_id)
    _, kwargs = real_call(decode.structure, payload)
    cache = kwargs[cache_argument()]
    kept = [t for _, t in sorted(payload.inputs().items())]
    assert isinstance(cache, DynamicCache)
    rebuilt = [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]
    assert all(any(torch.equal(r, k) for k in kept) for r in rebuilt)
    assert torch.equal(kwargs["input_ids"], payload.inputs()[0])
