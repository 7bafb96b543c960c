"""A live store never breaks its readers or its compaction.

Writers commit a segment by its calls files (`capture.store.commits`); compaction skips what
vanished and rolls back what never committed; readers bind inside their retry and re-list on
facts (a file gone), not on an error's text.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch
from flushed_writers import Add, live_beside_stopped, record_flushed, stage_uncommitted_segment

import capture
from capture import schema
from capture.store import commits, compaction, layout
from capture.store.files import vanished
from capture.store.views import needs_calls

ROOT = Path(__file__).resolve().parents[1]


def _files(root: Path, table: str) -> list[Path]:
    return sorted((root / table).rglob("*.parquet"))


def _totals(root: Path) -> tuple[int, int]:
    """(calls rows, calls the summary counts)."""
    with capture.open_store(root) as store:
        rows = int(store.query("SELECT count(*) AS n FROM calls").to_pylist()[0]["n"])
        counted = sum(m.calls for m in store.summary().models)
    return rows, counted


def _age(path: Path, seconds: float) -> None:
    old = path.stat().st_mtime - seconds
    os.utime(path, (old, old))


# -- the writer's commit: rollup first, calls files commit it --------------------------------
def test_a_rollup_names_the_calls_files_of_its_segment(tmp_path: Path) -> None:
    model = Add()
    with capture.Recorder(model, tmp_path, name="add", flush_seconds=3600) as rec:
        model(torch.ones(2, 2))
        rec.flush()
        (rollup,) = _files(tmp_path, schema.STATS)
        days = json.loads(pq.read_metadata(rollup).metadata[schema.METADATA_SEGMENT_CALLS])
        (calls,) = _files(tmp_path, schema.CALLS)
    assert days == {calls.parent.name.removeprefix("date="): 1}
    assert calls.name == rollup.name  # the segment's calls files carry the rollup's name


def test_a_stopped_writers_last_rollup_names_no_segment(tmp_path: Path) -> None:
    model = Add()
    with capture.Recorder(model, tmp_path, name="add", flush_rows=2):
        for b in (1, 2, 3, 4):  # the last segment is written by stop()
            model(torch.ones(b, 2))
    (rollup,) = _files(tmp_path, schema.STATS)
    assert schema.METADATA_SEGMENT_CALLS not in pq.read_metadata(rollup).metadata
    # so compaction may merge every calls file at once (a named one waits for its rollup)
    assert capture.compact(tmp_path).tables["calls"].files_after == 1


# A writer killed between the two files of its second segment (its rollup and its calls file,
# in whichever order it writes them): the second write announces itself, then waits.
_KILLED_MID_SEGMENT = r"""
import sys, time, torch
import capture
from capture.record import writer
real = writer.write_parquet
second = []
def write_parquet(fs, folder, name, table, kind, *args, **kwargs):
    if second and kind in ("calls", "stats"):
        print("between", flush=True)
        time.sleep(600)
    path = real(fs, folder, name, table, kind, *args, **kwargs)
    if (kind, table.num_rows) in (("calls", 3), ("stats", 2)):  # the second segment's
        second.append(path)
    return path
writer.write_parquet = write_parquet
model = torch.nn.Linear(2, 2)
rec = capture.Recorder(model, sys.argv[1], name="lin", flush_seconds=3600)
rec.start()
model(torch.ones(1, 2)); model(torch.ones(1, 2))
rec.flush()
for _ in range(3):
    model(torch.ones(4, 2))
rec.flush(timeout=None)
"""


def _kill_mid_segment(root: Path) -> None:
    """Runs `_KILLED_MID_SEGMENT` into `root` and SIGKILLs it between its two files."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_SEGMENT, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "between"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()


def test_sigkill_between_rollup_and_calls_leaves_stats_and_calls_agreeing(
    tmp_path: Path,
) -> None:
    _kill_mid_segment(tmp_path)
    # a kill never leaves calls that no stats row counts
    assert _totals(tmp_path) == (2, 2)
    assert len(_files(tmp_path, schema.STATS)) == 2  # the committed rollup and the staged one


class _NoCallsWrites:
    """A filesystem on which calls files can be neither written nor deleted (a remount)."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    def open_output_stream(self, path: str, *args: Any, **kwargs: Any) -> Any:
        if f"/{schema.CALLS}/" in path:
            raise OSError("injected: read-only")
        return self.fs.open_output_stream(path, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


def test_a_segment_whose_calls_cannot_be_written_is_rolled_back(tmp_path: Path) -> None:
    model = Add()
    with capture.Recorder(model, tmp_path, name="add", flush_seconds=3600) as rec:
        model(torch.ones(1, 2))
        rec.flush()
        writer = rec._writer
        assert writer is not None
        writer.fs = _NoCallsWrites(writer.fs)  # type: ignore[assignment]
        model(torch.ones(2, 2))
        rec.flush()
        stats = rec.stats()
    assert (stats["written"], stats["dropped"]) == (1, 1)
    assert _totals(tmp_path) == (1, 1)  # the failed segment's rollup went with it


def test_an_uncommitted_rollup_hides_the_calls_that_landed(tmp_path: Path) -> None:
    staged, landed = stage_uncommitted_segment(tmp_path)
    with capture.open_store(tmp_path) as store:
        assert str(staged) not in store.files["stats"]  # not committed, not counted
        assert str(landed) not in store.files["calls"]  # and its landed calls hidden
    assert _totals(tmp_path) == (2, 2)


# -- compaction beside live writers ---------------------------------------------------------
def test_compaction_skips_a_rollup_replaced_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_flushed(tmp_path, [1])
    record_flushed(tmp_path, [2])
    first, second = _files(tmp_path, schema.STATS)
    for path in (first, second):  # open rollups of writers idle past the grace period
        table = pq.read_table(path)
        meta = {**table.schema.metadata, schema.METADATA_ROLLUP: b"open"}
        pq.write_table(table.replace_schema_metadata(meta), path)
        _age(path, schema.ROLLUP_GRACE_S + 1)
    moved = tmp_path / "elsewhere.parquet"
    real = compaction.uncommitted

    def replaced_meanwhile(fs: pafs.FileSystem, files: Any) -> Any:
        first.rename(moved)  # its writer replaced it after the listing
        return real(fs, files)

    monkeypatch.setattr(compaction, "uncommitted", replaced_meanwhile)
    result = capture.compact(tmp_path)  # no FileNotFoundError
    assert result.tables["stats"].files_before == 1
    assert second.exists() and not result.unreadable


def test_compaction_leaves_a_group_whose_file_vanished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record_flushed(tmp_path, [1, 2, 3])
    before = _totals(tmp_path)
    real = compaction.group_rows
    gone: list[Path] = []

    def vanishing(fs: pafs.FileSystem, table: str, folder: str, group: Any) -> Any:
        if table == schema.CALLS:
            path = Path(group[0].path)
            gone.append(path)
            path.rename(path.parent.parent / "moved.bin")  # deleted from under the merge
        return real(fs, table, folder, group)

    monkeypatch.setattr(compaction, "group_rows", vanishing)
    result = capture.compact(tmp_path)
    assert [s.split(": ")[1] for s in result.left] == [f"{gone[0]} was deleted meanwhile"]
    (gone[0].parent.parent / "moved.bin").rename(gone[0])
    assert _totals(tmp_path) == before  # nothing replaced, nothing lost


def test_compaction_rolls_back_an_old_uncommitted_segment(tmp_path: Path) -> None:
    _kill_mid_segment(tmp_path)
    staged = max(_files(tmp_path, schema.STATS))
    young = capture.compact(tmp_path)
    assert young.rolled_back == [] and staged.exists()  # its writer may still be writing
    for path in _files(tmp_path, schema.STATS):
        _age(path, schema.ROLLUP_GRACE_S + 1)
    result = capture.compact(tmp_path)
    assert result.rolled_back == [str(staged)] and not staged.exists()
    assert _totals(tmp_path) == (2, 2)


def test_compaction_leaves_the_calls_files_a_live_rollup_names(tmp_path: Path) -> None:
    with live_beside_stopped(tmp_path):
        (live,) = [
            p
            for p in _files(tmp_path, schema.STATS)
            if schema.METADATA_SEGMENT_CALLS in pq.read_metadata(p).metadata
            and pq.read_metadata(p).metadata[schema.METADATA_ROLLUP] == b"open"
        ]
        named = [p for p in _files(tmp_path, schema.CALLS) if p.name == live.name]
        result = capture.compact(tmp_path)
        # merged away, they would leave the live rollup uncommitted for good
        assert named and all(p.exists() for p in named)
        assert len(_files(tmp_path, schema.CALLS)) == result.tables["calls"].files_after
        assert _totals(tmp_path) == (3, 3)
    assert _totals(tmp_path) == (3, 3)


# -- readers ----------------------------------------------------------------------------------
def test_a_reader_binds_the_calls_views_again_after_a_compaction(tmp_path: Path) -> None:
    record_flushed(tmp_path, [1, 2, 3])
    with capture.open_store(tmp_path) as store:
        listed = store.files["calls"]  # checked, not yet bound
        capture.compact(tmp_path)  # deletes every file `store` listed
        assert not any(os.path.exists(p) for p in listed)
        # binding is inside the retry (else IOException: No files found)
        assert store.query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": 3}]


def test_vanished_is_decided_by_looking_not_by_the_message(tmp_path: Path) -> None:
    fs = pafs.LocalFileSystem()
    there = tmp_path / "there.parquet"
    there.write_bytes(b"x")
    # a message that says "not found" about a file that is there is not a vanished file
    assert not vanished(fs, str(there), OSError("NoSuchKey: not found"))
    assert vanished(fs, str(tmp_path / "gone.parquet"), OSError("some other words"))
    assert not vanished(fs, str(tmp_path / "gone.parquet"), ValueError("bad value"))


@pytest.mark.parametrize(
    ("sql", "needed"),
    [
        ("SELECT count(*) FROM calls", True),
        ("SELECT * FROM signatures WHERE calls > 2", False),  # a column named calls
        ("WITH x AS (SELECT * FROM Leaves) SELECT count(*) FROM x", True),
        ("SELECT 'FROM dims' AS text", False),  # a string is not a table
        ("SELECT * FROM stats WHERE model IN (SELECT model FROM main.dims)", True),
        ("SELECT * FROM stats WHERE dims = ?", False),
        ("PRAGMA table_info('calls')", False),  # not a SELECT: bound lazily when DuckDB asks
    ],
)
def test_calls_views_are_bound_from_duckdbs_parse(sql: str, needed: bool) -> None:
    con = duckdb.connect()
    try:
        assert needs_calls(con, sql) is needed
    finally:
        con.close()


def test_a_statement_the_parse_does_not_know_binds_the_calls_views_lazily(
    tmp_path: Path,
) -> None:
    record_flushed(tmp_path, [1, 2])
    with capture.open_store(tmp_path) as store:
        # DuckDB's catalog error (a fact) binds them; no text of the SQL is matched
        names = store.query("PRAGMA table_info('calls')").column("name").to_pylist()
    assert "call_id" in names


def test_segment_paths_stay_in_the_rollups_model_folder() -> None:
    info = layout.FileInfo(
        "/s/stats/model=a/w-1.parquet", "stats", 1, 9, {}, segment={"2026-01-01": 2}
    )
    assert commits.segment_paths(info) == ["/s/calls/model=a/date=2026-01-01/w-1.parquet"]


# -- S3: a vanished object is a plain OSError there -------------------------------------------
class _DeletedAfterOpen:
    """An S3 filesystem on which a file is deleted right after it is opened (a writer
    replacing its rollup between a reader's open and its read)."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    def open_input_file(self, path: str) -> Any:
        handle = self.fs.open_input_file(path)
        self.fs.delete_file(path)
        return handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


def test_an_s3_object_deleted_after_it_was_opened_counts_as_vanished(
    s3_server: Any, tmp_path: Path
) -> None:
    import uuid

    from capture.store import layout

    fs = s3_server.filesystem()
    bucket = s3_server.create_bucket(f"gone-{uuid.uuid4().hex[:12]}")
    record_flushed(tmp_path, [1])
    (rollup,) = _files(tmp_path, schema.STATS)
    key = f"{bucket}/stats/model=add/{rollup.name}"
    with fs.open_output_stream(key) as sink:
        sink.write(rollup.read_bytes())
    verdict, rows = layout.read_with_rows(_DeletedAfterOpen(fs), key, schema.STATS)  # type: ignore[arg-type]
    # a plain OSError (NO_SUCH_KEY) on S3 is a vanished file, listed again, not "skip it":
    # a replaced stats file is never left out
    assert (verdict, rows) == (layout.Skip(key, layout.VANISHED), None)
