"""Crafted payload files: a payload is data, like the rest of a store.

Each test copies a real store whose 3 sampled calls kept their tensors, plants one hostile thing
under ``payloads/``, and checks that `replay.export` (through `replay.check.payload_rows`) answers
with one not-covered row or one warning, never an exception; that nothing outside the store is
read or deleted through a link; and that nothing ran (a marker file and `sys.modules`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.cli.main import cli
from capture.store import nofollow
from capture.store.payload_files import PayloadError, list_payloads, read_payload
from capture.store.reader import StoreReader
from replay.check.payload_rows import payload_rows

ROOT = Path(__file__).resolve().parents[1]
EVIL = "hostile_payload_mod"  # a module planted in the working directory by the tests


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store: 3 calls of `Tiny`, every one with its payload file."""
    root = tmp_path_factory.mktemp("hostile-payloads") / "store"
    model = Tiny()
    with capture.Recorder(model, root, name="tiny", flush_seconds=3600, payloads=1.0):
        for b in (2, 3, 4):
            model(torch.randn(b, 4))
    return root


@pytest.fixture(scope="module")
def exported(template: Path) -> tuple[Tiny, Any, Any]:
    """The model, its export inputs and programs: exported once, checked per test."""
    model = Tiny()
    result = replay.export(model, template, probes=0, max_payloads=0)
    assert result.complete
    return model, replay.export_inputs(template), result.programs


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(template, root, symlinks=True)
    return root


@pytest.fixture(autouse=True)
def evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module in the cwd (and on sys.path) that writes a marker file when imported."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "MARKER"
    (cwd / f"{EVIL}.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(str(cwd))
    before = set(sys.modules)
    yield marker
    assert not marker.exists()  # nothing from a payload ran
    assert EVIL not in set(sys.modules) - before  # nor was imported


def _payloads(root: Path) -> list[Path]:
    return sorted(Path(p.path) for p in list_payloads(root))


def _split(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path: Path, header: Any, data: bytes, length: int | None = None) -> None:
    text = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)


def _rows(exported: tuple[Tiny, Any, Any], root: Path) -> list[dict[str, Any]]:
    model, inputs, programs = exported
    with StoreReader(root) as store:
        rows, _ = payload_rows(model, store, inputs, programs, {})
    return [dataclasses.asdict(row) for row in rows]


def _bad_row(rows: list[dict[str, Any]], path: Path) -> str:
    """The one not-covered row of `path`; the other sampled calls still covered."""
    bad = [r for r in rows if not r["covered"]]
    assert len(bad) == 1, rows
    assert str(path) in bad[0]["error"] and "\n" not in bad[0]["error"]
    assert sum(r["covered"] for r in rows) == 2
    return str(bad[0]["error"])


def _renamed_tensor(name: str) -> Callable[[dict[str, Any]], None]:
    def change(header: dict[str, Any]) -> None:
        header[name] = header.pop("in/0")

    return change


def _meta(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(header: dict[str, Any]) -> None:
        header["__metadata__"][key] = value

    return change


def _spec(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(header: dict[str, Any]) -> None:
        header["in/0"][key] = value

    return change


# -- tampered headers: one not-covered row each, never an exception ----------------------------
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_renamed_tensor("in/../x"), "is not in/<leaf> or out/<i>"),
        (_renamed_tensor("in/01"), "is not in/<leaf> or out/<i>"),
        (_renamed_tensor("in/-1"), "is not in/<leaf> or out/<i>"),
        (_meta("call_id", "12abc"), "call_id '12abc' is not a 64-bit decimal integer"),
        (_meta("call_id", "99999999999999999999999"), "is not a 64-bit decimal integer"),
        (_meta("call_id", 7), "is not a string of bounded size"),
        (_meta("in_structure", ""), "is not a structure id"),
        (_meta("capture.payload_version", "99"), "upgrade capture"),
        (_meta("capture.kind", "pickle"), "not a capture payload file"),
        (_spec("dtype", "object"), "has dtype 'object'"),
        (_spec("shape", [True, 4]), "has shape"),
        (_spec("shape", [-2, 4]), "has shape"),
        (_spec("shape", [2**40, 2**40]), "takes"),
        (_spec("data_offsets", [0, 2**62]), "takes"),
        (_spec("data_offsets", ["0", "32"]), "has data_offsets"),
        (_spec("__import__", "os"), "has no dtype, shape and data_offsets"),
    ],
    ids=[
        "dotdot-name",
        "zero-padded-name",
        "negative-name",
        "call-id-text",
        "call-id-overflow",
        "call-id-number",
        "empty-structure",
        "newer-version",
        "other-kind",
        "dtype-object",
        "shape-bool",
        "shape-negative",
        "shape-huge",
        "offsets-huge",
        "offsets-text",
        "extra-key",
    ],
)
def test_a_tampered_header_is_one_not_covered_row(
    store: Path,
    exported: tuple[Tiny, Any, Any],
    change: Callable[[dict[str, Any]], None],
    reason: str,
) -> None:
    path = _payloads(store)[0]
    header, data = _split(path)
    change(header)
    _write(path, header, data)
    assert reason in _bad_row(_rows(exported, store), path)


@pytest.mark.parametrize(
    ("header", "length", "reason"),
    [
        (b"not json", None, "is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, None, "is not JSON"),  # too deep for the parser
        (b"[1, 2]", None, "not a JSON object"),
        (b"{}", 2**63, "truncated or not safetensors"),
        (b"{}", None, "not a capture payload file"),
    ],
    ids=["text", "deep", "array", "huge-length", "no-metadata"],
)
def test_a_header_that_is_not_ours_is_one_not_covered_row(
    store: Path, exported: tuple[Tiny, Any, Any], header: bytes, length: int | None, reason: str
) -> None:
    path = _payloads(store)[0]
    _write(path, header, b"", length)
    assert reason in _bad_row(_rows(exported, store), path)


def test_tensors_that_do_not_tile_the_data_are_refused(
    store: Path, exported: tuple[Tiny, Any, Any]
) -> None:
    path = _payloads(store)[0]
    header, data = _split(path)
    _write(path, header, data + b"\0" * 64)  # bytes no tensor claims
    assert "after its header" in _bad_row(_rows(exported, store), path)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak RSS read from /proc")
def test_a_payload_over_the_cap_is_refused_from_its_size(tmp_path: Path, store: Path) -> None:
    path = _payloads(store)[0]
    header, data = _split(path)
    big = 3 * 2**30  # a 3 GB sparse file: its declared tensor fills it
    header["in/0"] = {"dtype": "U8", "shape": [big], "data_offsets": [0, big]}
    header = {k: v for k, v in header.items() if k in ("in/0", "__metadata__")}
    _write(path, header, b"")
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size + big)
    # refused before it is read (3.5 GB of RSS otherwise); measured in a process of its own, by
    # its peak RSS since exec (VmHWM; ru_maxrss would count the forked test process too)
    probe = (
        "import sys, pyarrow.fs as fs\n"
        "from capture.store.payload_files import PayloadError, read_payload\n"
        "try:\n    read_payload(fs.LocalFileSystem(), sys.argv[1])\n"
        "except PayloadError as e:\n    print(e)\n"
        "status = open('/proc/self/status').read().split('VmHWM:')[1]\n"
        "print(int(status.split()[0]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout.splitlines()
    assert "more than a payload of at most 16,777,216 bytes" in out[0]
    assert int(out[1]) < 300 * 1024  # KiB: nothing of the file was read


def test_a_larger_cap_reads_what_a_larger_max_call_bytes_wrote(store: Path) -> None:
    import pyarrow.fs as pafs

    path = _payloads(store)[0]
    with pytest.raises(PayloadError, match="max_payload_bytes=8"):
        read_payload(pafs.LocalFileSystem(), str(path), max_bytes=8)
    assert read_payload(pafs.LocalFileSystem(), str(path), max_bytes=64).tensors


def test_replay_export_reports_every_tampered_payload_and_raises_nothing(store: Path) -> None:
    first, second, third = _payloads(store)
    header, data = _split(first)
    _renamed_tensor("in/../x")(header)
    _write(first, header, data)
    header, data = _split(second)
    _meta("call_id", "12abc")(header)
    _write(second, header, data)
    result = replay.export(Tiny(), store, probes=0)  # no ValueError escapes
    rows = [r for r in result.coverage.to_pylist() if r["kind"] == "payload"]
    assert [r["covered"] for r in rows] == [False, False, True]
    assert not result.complete


# -- links: never followed for listing, reading or deleting ---------------------------------
@pytest.fixture
def outside(tmp_path: Path, template: Path) -> Path:
    """A folder outside the store holding a genuine payload file of the same model."""
    folder = tmp_path / "outside"
    folder.mkdir()
    shutil.copy(_payloads(template)[0], folder / "victim.safetensors")
    return folder


def _untouched(outside: Path, template: Path) -> None:
    assert (outside / "victim.safetensors").read_bytes() == _payloads(template)[0].read_bytes()


def test_a_linked_payload_is_neither_listed_nor_read(
    store: Path, outside: Path, template: Path, exported: tuple[Tiny, Any, Any]
) -> None:
    folder = _payloads(store)[0].parent
    (folder / "planted.safetensors").symlink_to(outside / "victim.safetensors")
    with pytest.warns(RuntimeWarning, match="planted.safetensors.*symbolic link"):
        rows = _rows(exported, store)
    assert len(rows) == 3 and all(r["covered"] for r in rows)  # its call was not checked
    _untouched(outside, template)


def test_delete_all_deletes_nothing_through_a_linked_folder(
    store: Path, outside: Path, template: Path
) -> None:
    model_folder = _payloads(store)[0].parent.parent
    (model_folder / "date=2001-01-01").symlink_to(outside, target_is_directory=True)
    result = CliRunner().invoke(cli, ["--store", str(store), "payloads", "--delete-all"])
    assert result.exit_code == 0, result.output
    assert "deleted 3 payload file(s)" in result.stderr
    assert "date=2001-01-01" in result.stderr and "symbolic link" in result.stderr
    _untouched(outside, template)  # nothing deleted through the link


def test_delete_before_never_deletes_a_linked_file(
    store: Path, outside: Path, template: Path
) -> None:
    folder = _payloads(store)[0].parent
    (folder / "planted.safetensors").symlink_to(outside / "victim.safetensors")
    args = ["--store", str(store), "payloads", "--delete-before", "2999-01-01"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    _untouched(outside, template)
    assert (folder / "planted.safetensors").is_symlink()  # a link is not deleted either


def test_a_folder_swapped_for_a_link_after_listing_is_not_followed(
    store: Path, outside: Path, template: Path
) -> None:
    path = _payloads(store)[0]
    folder = path.parent
    shutil.copy(outside / "victim.safetensors", outside / path.name)
    shutil.rmtree(folder)
    folder.symlink_to(outside, target_is_directory=True)  # after the listing, before the call
    with pytest.raises(OSError):
        nofollow.unlink_under(str(store), str(path))
    with pytest.raises(OSError):
        nofollow.open_under(str(store), str(path))
    assert (outside / path.name).exists()
    _untouched(outside, template)


def test_a_delete_through_a_swapped_folder_is_one_error_line(
    store: Path, outside: Path, template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from capture.store import payload_files

    path = _payloads(store)[0]
    shutil.copy(outside / "victim.safetensors", outside / path.name)
    real = payload_files.list_payloads

    def listed_then_swapped(*args: Any, **kwargs: Any) -> Any:
        files = real(*args, **kwargs)
        shutil.rmtree(path.parent)  # the folder becomes a link after the listing
        path.parent.symlink_to(outside, target_is_directory=True)
        return files

    monkeypatch.setattr(payload_files, "list_payloads", listed_then_swapped)
    result = CliRunner().invoke(cli, ["--store", str(store), "payloads", "--delete-all"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: cannot delete {path}")
    assert (outside / path.name).exists()  # nothing outside the store deleted
    _untouched(outside, template)


def test_a_fifo_named_like_a_payload_is_not_listed(store: Path) -> None:
    fifo = _payloads(store)[0].parent / "pipe.safetensors"
    os.mkfifo(fifo)
    assert fifo not in _payloads(store)  # a read of it would block forever
    with pytest.raises(OSError, match="not a regular file"):
        nofollow.open_under(str(store), str(fifo))
