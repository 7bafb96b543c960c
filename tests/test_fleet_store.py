"""Stores of many files and compactions beside readers: batches, re-listing, locks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

import capture
from capture import schema
from capture.errors import CaptureError
from capture.store import compaction_lock, file_merge, footer_cache, layout, many_reads
from fixtures.models import run_generate, tiny_llama

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_SQL = {
    "calls": "SELECT * EXCLUDE (date) FROM calls ORDER BY call_id",
    "signatures": "SELECT * FROM signatures ORDER BY ALL",
    "structures": "SELECT * FROM structures ORDER BY ALL",
}


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-Llama traffic written 2 calls per file by 6 recorders (a fleet's processes): 6
    stats files (one rollup per writer), more calls and structures files."""
    root = tmp_path_factory.mktemp("many-files") / "store"
    model = tiny_llama(0)
    for batch in (1, 2, 1, 2, 1, 2):
        with capture.Recorder(model, root, flush_rows=2, flush_seconds=3600):
            run_generate(model, [(batch, 5 + batch)], max_new_tokens=5, seed=0)
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
    monkeypatch.setattr(file_merge, "BATCH_FILES", 2)  # many batches of 2 files each
    result = capture.compact(store)
    assert result.tables["stats"].files_after == 1
    assert _snapshot(store) == before  # bounded-memory merge, same answer


def test_footers_read_in_parallel_keep_the_listing_order(store: Path) -> None:
    import pyarrow.fs as pafs

    fs = pafs.LocalFileSystem()
    paths = [i.path for i in layout.list_files(fs, str(store), "calls")]
    assert len(paths) >= 8  # the thread pool is used from 8 files on
    rows = many_reads.read_footers(fs, paths, lambda f, p: layout.read_footer(f, p, "calls"))
    serial = [layout.read_footer(fs, p, "calls") for p in paths]
    assert [(m.path, m.rows) for m in rows] == [(m.path, m.rows) for m in serial]  # type: ignore[union-attr]


def test_store_opened_before_a_compaction_reads_its_merged_file(store: Path) -> None:
    with capture.open_store(store) as opened:
        before = opened.query("SELECT count(*) AS n, count(DISTINCT call_id) AS d FROM calls")
        capture.compact(store)  # deletes the files `opened` listed
        # re-listed once: the merged file's calls, each once (no query fails)
        after = opened.query("SELECT count(*) AS n, count(DISTINCT call_id) AS d FROM calls")
    assert after.to_pylist() == before.to_pylist()


# A compaction's lock, held by a process that is then SIGKILLed (as a killed compaction).
_HOLDER = r"""
import sys, time
import pyarrow.fs as pafs
from capture.store.compaction_lock import CompactionLock
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
    assert (store / compaction_lock.LOCK_NAME).exists()  # left behind by the killed holder
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


# -- the reader's cache of checked files ------------------------------------------------------
@pytest.fixture
def cached(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the store, read with a cache of its own (small stores are cached too)."""
    monkeypatch.setenv("CAPTURE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(footer_cache, "MIN_FILES", 1)
    return store


def _answer(root: Path) -> dict[str, Any]:
    with capture.open_store(root) as opened:
        out = {k: opened.query(sql).to_pylist() for k, sql in SNAPSHOT_SQL.items()}
        out["summary"] = opened.summary()
    return out


def _uncached(root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    with monkeypatch.context() as m:
        m.setenv("CAPTURE_CACHE_DIR", "off")
        return _answer(root)


def _rewrite(path: Path, change: Any) -> None:
    """Writes `path` again, changed, keeping its footer metadata (a store file's)."""
    table = pq.read_table(path)
    time.sleep(0.01)  # another modification time even on coarse clocks
    pq.write_table(change(table).replace_schema_metadata(table.schema.metadata), path)


def test_cached_opens_give_the_uncached_answer(
    cached: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _uncached(cached, monkeypatch)
    first = _answer(cached)  # fills the cache
    assert list((tmp_path / "cache").glob("*-stats-rows.arrow"))
    assert _answer(cached) == first == expected  # the cache never changes an answer


def test_a_stats_file_written_again_after_caching_is_read_again(
    cached: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _answer(cached)
    path = sorted((cached / schema.STATS).rglob("*.parquet"))[0]
    _rewrite(
        path,
        lambda t: t.set_column(
            t.schema.get_field_index("calls"), "calls", pc.multiply(t.column("calls"), 10)
        ),
    )
    # a stale cache entry (another stamp) is ignored, the file's new rows count
    assert _answer(cached) == _uncached(cached, monkeypatch)


def test_a_calls_file_replaced_by_a_foreign_one_after_caching_is_skipped(cached: Path) -> None:
    _answer(cached)
    path = sorted((cached / schema.CALLS).rglob("*.parquet"))[0]
    time.sleep(0.01)
    pq.write_table(pa.table({"call_id": [1, 2]}), path)
    with pytest.warns(RuntimeWarning, match="not a capture file"):  # checked again
        with capture.open_store(cached) as opened:
            assert str(path) not in opened.files["calls"]  # calls are checked when first needed
            assert str(path) in [s.path for s in opened.skipped]


def test_a_damaged_cache_is_ignored(
    cached: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _answer(cached)
    for path in (tmp_path / "cache").iterdir():
        path.write_bytes(b"not parquet")
    assert _answer(cached) == expected


def test_a_cache_of_rows_without_its_index_pair_is_ignored(
    cached: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _answer(cached)
    rows = next((tmp_path / "cache").glob("*-stats-rows.arrow"))
    with pa.memory_map(str(rows)) as source:
        table = pa.ipc.open_file(source).read_all()
    # rows written by another reader (another token) beside this index: neither is used
    other = table.slice(0, 1).replace_schema_metadata({b"capture.cache_token": b"x"})
    with pa.OSFile(str(rows), "wb") as sink, pa.ipc.new_file(sink, other.schema) as out:
        out.write_table(other)
    assert _answer(cached) == expected


def test_summary_does_not_bind_the_calls_files(cached: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with capture.open_store(cached) as opened:
            opened.summary()
            for path in (cached / schema.CALLS).rglob("*.parquet"):
                os.remove(path)
            # summary reads stats and structures only; no view over 100,000 calls
            # files is bound for it, so the calls files are not touched
            assert opened.summary().models


def test_a_calls_file_with_a_column_of_a_later_version_is_read(cached: Path) -> None:
    count = "SELECT count(*) AS n FROM calls"
    with capture.open_store(cached) as opened:
        before = opened.query(count).to_pylist()
    path = sorted((cached / schema.CALLS).rglob("*.parquet"))[-1]
    _rewrite(path, lambda t: t.append_column("later", pa.array([7] * t.num_rows)))
    with capture.open_store(cached) as opened:
        # columns merged by name only when a file needs it, and then they are
        assert opened.query(count).to_pylist() == before
        assert opened.query("SELECT count(later) AS n FROM calls").to_pylist()[0]["n"] > 0


def test_resolve_store_takes_a_configured_filesystem_and_a_path(tmp_path: Path) -> None:
    import pyarrow.fs as pafs

    from capture.store.files import resolve_store, write_parquet

    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    fs, root = resolve_store("stores/one/", filesystem=sub)
    # a caller's filesystem (endpoint, credentials) is used as given, path on it
    assert (fs, root) == (sub, "stores/one")
    table = pa.table({"x": [1]})
    write_parquet(fs, f"{root}/calls", "a.parquet", table, "calls")
    assert (tmp_path / "stores" / "one" / "calls" / "a.parquet").exists()


def test_summary_never_reads_the_calls_files(store: Path) -> None:
    # at 100,000 calls files their check costs minutes; summary reads stats only
    folder = next((store / schema.CALLS).rglob("date=*"))
    (folder / "broken.parquet").write_bytes(b"PAR1 not a parquet file")
    with capture.open_store(store) as opened:
        opened.summary()  # filterwarnings=error: a check of the broken file would warn
        assert schema.CALLS not in opened._files
        with pytest.warns(RuntimeWarning, match="broken.parquet"):
            opened.query("SELECT count(*) FROM calls")
        assert str(folder / "broken.parquet") in [s.path for s in opened.skipped]
