"""Writers roll their stats up into one file per process, and readers stay exact."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
from flushed_writers import Add, live_beside_stopped, record_flushed

import capture
from capture import schema
from capture.record.writer import StoreWriter


def _stats_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / schema.STATS).rglob("*.parquet"))


def _counts(root: Path) -> tuple[int, int]:
    """(calls rows, calls the signatures count)."""
    with capture.open_store(root) as store:
        rows = store.query("SELECT count(*) AS n FROM calls").to_pylist()[0]["n"]
        counted = store.query("SELECT sum(calls) AS n FROM signatures").to_pylist()[0]["n"]
    return int(rows), int(counted)


def test_each_flush_replaces_the_previous_rollup_and_claims_it(tmp_path: Path) -> None:
    model = Add()
    seen: list[list[str]] = []
    with capture.Recorder(model, tmp_path, name="add", flush_seconds=3600) as rec:
        for b in (1, 2, 3):
            model(torch.ones(b, 2))
            rec.flush()
            seen.append([p.name for p in _stats_files(tmp_path)])
    # one file at any time: each flush writes a new one and deletes the one it holds
    assert [len(names) for names in seen] == [1, 1, 1]
    (last,) = _stats_files(tmp_path)
    meta = pq.read_metadata(last).metadata
    assert json.loads(meta[b"capture.replaces"]) == seen[-1]  # the open one before close
    assert json.loads(meta[b"capture.replaces_rows"]) == {seen[-1][0]: 3}
    assert pq.read_table(last).num_rows == 3  # three signatures, one row each
    assert _counts(tmp_path) == (3, 3)


def test_a_writer_idle_too_long_starts_a_new_rollup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # past ROLLUP_CONTINUE_S a compaction may have taken the old rollup (it waits
    # ROLLUP_GRACE_S): the writer must not claim it again
    monkeypatch.setattr(schema, "ROLLUP_CONTINUE_S", 0.0)
    record_flushed(tmp_path, [1, 2, 3])
    files = _stats_files(tmp_path)
    assert len(files) == 3
    assert all(b"capture.replaces" not in pq.read_metadata(p).metadata for p in files)
    assert _counts(tmp_path) == (3, 3)


def test_a_full_rollup_is_left_and_a_new_one_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema, "ROLLUP_ROWS", 2)
    record_flushed(tmp_path, [1, 2, 3, 4, 5])
    rows = sorted(pq.read_table(p).num_rows for p in _stats_files(tmp_path))
    assert rows == [1, 2, 2]  # at most ROLLUP_ROWS signatures per file
    assert _counts(tmp_path) == (5, 5)


def test_a_rollup_removed_by_someone_else_is_not_carried_on(tmp_path: Path) -> None:
    model = Add()
    with capture.Recorder(model, tmp_path, name="add", flush_seconds=3600) as rec:
        model(torch.ones(1, 2))
        rec.flush()
        for path in _stats_files(tmp_path):  # e.g. an operator cleaning up by hand
            path.unlink()
        for path in (tmp_path / schema.CALLS).rglob("*.parquet"):
            path.unlink()
        model(torch.ones(2, 2))
        rec.flush()
    # the new rollup holds only the call whose calls file is still there
    assert _counts(tmp_path) == (1, 1)


class _NoDelete:
    """A filesystem whose deletes of stats files fail (a flaky object store)."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs
        self.failing = True

    def delete_file(self, path: str) -> None:
        if self.failing and f"/{schema.STATS}/" in path:
            raise OSError("injected: delete refused")
        self.fs.delete_file(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


def test_a_rollup_whose_delete_failed_is_claimed_again(tmp_path: Path) -> None:
    writer_fs: list[_NoDelete] = []
    real_init = StoreWriter.__init__

    def init(self: StoreWriter, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        self.fs = _NoDelete(self.fs)  # type: ignore[assignment]
        writer_fs.append(self.fs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(StoreWriter, "__init__", init)
        model = Add()
        with capture.Recorder(model, tmp_path, name="add", flush_seconds=3600) as rec:
            for b in (1, 2):
                model(torch.ones(b, 2))
                rec.flush()
            assert len(_stats_files(tmp_path)) == 2  # the first could not be deleted
            writer_fs[0].failing = False
            model(torch.ones(3, 2))
            rec.flush()
            # the third rollup claimed both earlier files and deleted them
            (third,) = _stats_files(tmp_path)
            claimed = json.loads(pq.read_metadata(third).metadata[b"capture.replaces"])
            assert len(claimed) == 2
    assert _counts(tmp_path) == (3, 3)


def test_readers_beside_a_rolling_writer_never_lose_or_double_count(tmp_path: Path) -> None:
    model = Add()
    stop = threading.Event()
    rec = capture.Recorder(model, tmp_path, name="add", flush_seconds=0.01, flush_rows=4)
    rec.start()
    model(torch.ones(1, 2))
    rec.flush()

    def traffic() -> None:
        while not stop.is_set():
            model(torch.ones(1 + threading.get_ident() % 3, 2))
            time.sleep(0.001)

    thread = threading.Thread(target=traffic)
    thread.start()
    counted: list[int] = []
    try:
        for _ in range(15):
            # filterwarnings=error: a stats file deleted between listing and reading would be
            # "skipped" (a warning) and its calls lost; the reader lists again instead
            with capture.open_store(tmp_path) as store:
                n = store.query("SELECT sum(calls) AS n FROM signatures").to_pylist()[0]["n"]
            counted.append(int(n))
    finally:
        stop.set()
        thread.join()
        rec.stop()
    assert counted == sorted(counted)  # never fewer calls than an earlier open saw
    rows, total = _counts(tmp_path)
    assert rows == total == rec.stats()["written"]


def test_a_rollup_keeps_one_row_per_signature_and_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the report's calls over time read these rows: a rollup spanning hours in one row per
    # signature would smear them; a "minute" of 50 ms here
    monkeypatch.setattr(schema, "ROLLUP_BUCKET_S", 0.05)
    model = Add()
    with capture.Recorder(model, tmp_path, name="add", flush_seconds=3600) as rec:
        for _ in range(3):
            model(torch.ones(1, 2))
            rec.flush()
            time.sleep(0.06)
    (stats,) = _stats_files(tmp_path)
    rows = pq.read_table(stats).to_pylist()
    assert [r["calls"] for r in rows] == [1, 1, 1]  # one signature, three minutes
    assert [r["first_ts"] for r in rows] == sorted(r["first_ts"] for r in rows)
    assert _counts(tmp_path) == (3, 3)


def test_compaction_leaves_a_live_writers_rollup_until_it_is_old(tmp_path: Path) -> None:
    with live_beside_stopped(tmp_path):  # the stopped writer's rollup is closed
        assert len(_stats_files(tmp_path)) == 2
        result = capture.compact(tmp_path)
        # the live writer may replace its open rollup (claiming it) at its next flush;
        # merged now, its rows would be counted twice
        assert result.tables["stats"].files_before == 1
        (live,) = [
            p
            for p in _stats_files(tmp_path)
            if pq.read_metadata(p).metadata[schema.METADATA_ROLLUP] == b"open"
        ]
        old = live.stat().st_mtime - schema.ROLLUP_GRACE_S - 1
        os.utime(live, (old, old))  # as if its writer had been idle for ten minutes
        assert capture.compact(tmp_path).tables["stats"].files_before == 2
        assert len(_stats_files(tmp_path)) == 1
    assert _counts(tmp_path) == (3, 3)
