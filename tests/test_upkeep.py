"""A recording process compacts its store in the background (`capture.store.upkeep`): the store
keeps a bounded number of files without an operator, and no call is lost or counted twice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import capture
from capture import schema
from capture.errors import CaptureError
from capture.record.recorder import Recorder
from capture.store import upkeep
from capture.store.compaction_lock import LOCK_NAME

CALLS = 120


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def _files(root: Path, table: str) -> list[Path]:
    return sorted(p for p in (root / table).rglob("*.parquet") if not p.name.startswith("."))


def _counts(root: Path) -> tuple[int, int, int]:
    with capture.open_store(root) as store:
        row = store.query(
            "SELECT count(*) AS n, count(DISTINCT call_id) AS d FROM calls"
        ).to_pylist()[0]
        signatures = store.query("SELECT sum(calls) AS n FROM signatures").to_pylist()[0]["n"]
    return int(row["n"]), int(row["d"]), int(signatures)


def _record(root: Path, calls: int) -> upkeep.Upkeep:
    rec = Recorder(Double(), root, name="double", flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(calls):
            rec.model(torch.ones(1 + n % 7, 3))
            rec.flush()  # one segment (calls file) per call, as a fleet flushing often
            if n % 20 == 0:
                time.sleep(0.3)  # turns come due while recording
    found = upkeep._upkeeps[(("local"), str(root))]
    found.wait(60)
    return found


def test_a_recording_process_keeps_its_store_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPTURE_AUTO_COMPACT", "0.2")
    root = tmp_path / "store"
    done = _record(root, CALLS)
    assert done.runs > 0 and done.failures == 0
    calls_files = _files(root, schema.CALLS)
    # every flush wrote a calls file; the compactions merged them as they came
    assert len(calls_files) < CALLS // 4, calls_files
    assert _counts(root) == (CALLS, CALLS, CALLS)  # none lost, none twice, stats agree
    assert not (root / LOCK_NAME).exists()


def test_turned_off_it_compacts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPTURE_AUTO_COMPACT", "off")
    root = tmp_path / "store"
    rec = Recorder(Double(), root, name="double", flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(10):
            rec.model(torch.ones(1 + n, 3))
            rec.flush()
    assert len(_files(root, schema.CALLS)) == 10
    assert (str(root)) not in {key[1] for key in upkeep._upkeeps}


def test_a_turn_finding_the_lock_held_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAPTURE_AUTO_COMPACT", "off")
    root = tmp_path / "store"
    rec = Recorder(Double(), root, name="double", flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(4):
            rec.model(torch.ones(1 + n, 3))
            rec.flush()
    import pyarrow.fs as pafs

    from capture.store.compaction_lock import CompactionLock

    keeper = upkeep.Upkeep(pafs.LocalFileSystem(), str(root), 60.0)
    with CompactionLock(pafs.LocalFileSystem(), str(root), dry_run=False):  # another compactor
        keeper.run()
    assert (keeper.skipped, keeper.runs, len(_files(root, schema.CALLS))) == (1, 0, 4)
    keeper.run()
    assert (keeper.runs, len(_files(root, schema.CALLS))) == (1, 1)


def test_a_bad_setting_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPTURE_AUTO_COMPACT", "hourly")
    with pytest.raises(CaptureError, match="CAPTURE_AUTO_COMPACT='hourly'"):
        upkeep.interval()


def test_structures_of_an_older_store_version_are_compacted(tmp_path: Path) -> None:
    """Files of store version 1 lack the structures' ``schema_version`` column: compaction (and
    so the upkeep) merges them with newer ones, the column null on their rows."""
    import pyarrow.parquet as pq

    root = tmp_path / "store"
    for batch in (2, 3):  # two writers: two structures files
        with Recorder(Double(), root, name="double", flush_seconds=3600) as rec, torch.no_grad():
            rec.model(torch.ones(batch, 3))
    old = _files(root, schema.STRUCTURES)[0]
    table = pq.read_table(old)
    meta = dict(table.schema.metadata or {})
    meta[schema.METADATA_SCHEMA_VERSION] = b"1"
    pq.write_table(table.drop_columns(["schema_version"]).replace_schema_metadata(meta), old)
    result = capture.compact(root)
    assert result.tables[schema.STRUCTURES].files_after == 1
    assert _counts(root) == (2, 2, 2)
