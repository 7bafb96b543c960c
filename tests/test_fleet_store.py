"""Stores of many files and compactions beside readers (issue 14): batches, re-listing, locks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import capture
from capture import compaction, compaction_lock, layout
from capture.errors import CaptureError
from fixtures.models import run_generate, tiny_llama

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_SQL = {
    "calls": "SELECT * EXCLUDE (date) FROM calls ORDER BY call_id",
    "signatures": "SELECT * FROM signatures ORDER BY ALL",
    "structures": "SELECT * FROM structures ORDER BY ALL",
}


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-Llama traffic written 2 calls per file: 12 calls, stats and structures files."""
    root = tmp_path_factory.mktemp("many-files") / "store"
    model = tiny_llama(0)
    with capture.Recorder(model, root, flush_rows=2, flush_seconds=3600):
        for _ in range(2):
            run_generate(model, [(1, 5), (2, 7)], max_new_tokens=5, seed=0)
    return root


@pytest.fixture
def store(many_files: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(many_files, copy)
    return copy


def _snapshot(root: Path) -> dict[str, Any]:
    with capture.open_store(root) as opened:
        out = {k: opened.query(sql).to_pylist() for k, sql in SNAPSHOT_SQL.items()}
        out["dims"] = opened.dims().to_pylist()
    return out


def test_merging_in_batches_gives_the_merge_of_everything(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _snapshot(store)
    assert len(list((store / "stats").rglob("*.parquet"))) > 5
    monkeypatch.setattr(compaction, "_BATCH_FILES", 2)  # many batches of 2 files each
    result = capture.compact(store)
    assert result.tables["stats"].files_after == 1
    assert _snapshot(store) == before  # bounded-memory merge, same answer (issue 14)


def test_footers_read_in_parallel_keep_the_listing_order(store: Path) -> None:
    import pyarrow.fs as pafs

    fs = pafs.LocalFileSystem()
    paths = [i.path for i in layout.list_files(fs, str(store), "calls")]
    assert len(paths) >= 8  # the thread pool is used from 8 files on
    rows = layout.read_footers(fs, paths, lambda f, p: layout.read_footer(f, p, "calls"))
    serial = [layout.read_footer(fs, p, "calls") for p in paths]
    assert [(m.path, m.rows) for m in rows] == [(m.path, m.rows) for m in serial]  # type: ignore[union-attr]


def test_store_opened_before_a_compaction_reads_its_merged_file(store: Path) -> None:
    with capture.open_store(store) as opened:
        before = opened.query("SELECT count(*) AS n, count(DISTINCT call_id) AS d FROM calls")
        capture.compact(store)  # deletes the files `opened` listed
        # re-listed once: the merged file's calls, each once (issue 14: 20/66 queries failed)
        after = opened.query("SELECT count(*) AS n, count(DISTINCT call_id) AS d FROM calls")
    assert after.to_pylist() == before.to_pylist()


# A compaction's lock, held by a process that is then SIGKILLed (as a killed compaction).
_HOLDER = r"""
import sys, time
import pyarrow.fs as pafs
from capture.compaction_lock import CompactionLock
lock = CompactionLock(pafs.LocalFileSystem(), sys.argv[1], dry_run=False)
lock.__enter__()
print("locked", flush=True)
time.sleep(600)
"""


def _hold_lock(store: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(store)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def _reap(proc: subprocess.Popen[str]) -> None:
    proc.wait(30)
    if proc.stdout is not None:
        proc.stdout.close()


def test_lock_of_a_sigkilled_compaction_is_taken_over(store: Path) -> None:
    holder = _hold_lock(store)
    holder.send_signal(signal.SIGKILL)
    _reap(holder)
    assert (store / compaction_lock.LOCK_NAME).exists()  # left behind, as in issue 14
    result = capture.compact(store)
    assert result.tables["calls"].files_after == 1
    assert not (store / compaction_lock.LOCK_NAME).exists()


def test_lock_of_a_running_compaction_is_respected(store: Path) -> None:
    holder = _hold_lock(store)
    try:
        with pytest.raises(CaptureError, match=f"pid {holder.pid}"):
            capture.compact(store)
    finally:
        holder.kill()
        _reap(holder)


def test_old_lock_of_another_host_is_taken_over(store: Path) -> None:
    note = {"host": socket.gethostname() + "-elsewhere", "pid": 1, "since": time.time() - 1e6}
    (store / compaction_lock.LOCK_NAME).write_text(json.dumps(note))
    assert capture.compact(store).tables["calls"].files_after == 1


def test_recent_lock_of_another_host_is_respected(store: Path) -> None:
    note = {"host": socket.gethostname() + "-elsewhere", "pid": 1, "since": time.time()}
    (store / compaction_lock.LOCK_NAME).write_text(json.dumps(note))
    with pytest.raises(CaptureError, match="another compaction holds"):
        capture.compact(store)
