"""compact(): merges a store's small Parquet files into big ones, without losing a row.

A server that flushes every few seconds leaves thousands of small files, and readers pay per
file (listing, footers) and per stats row (docs/benchmarks.md: 1M calls in 1,000-call files read
6-8x slower than in 100,000-call files). `compact` rewrites, in each partition folder:

- ``calls/model=M/date=D/``: the files with fewer than `target_rows` rows, concatenated into files
  of up to `target_rows` rows;
- ``stats/model=M/``: every file, merged into one whose signature rows are merged (one row per
  signature: call, error and duration counts summed, timestamps and integer ranges widened),
  as the ``signatures`` view would merge them; but a writer's open rollup younger than
  `schema.ROLLUP_GRACE_S` (10 minutes) is left for a later run: its writer may still replace it;
- ``structures/model=M/``: every file, merged into one without repeated (structure_id, leaf).

**Nothing recorded is lost, and readers never count a call twice.** Each new file is written
under a temporary dot-name, read back and checked (row count, or calls per signature), then
renamed into place; its Parquet metadata names the files it replaces (``capture.replaces``).
`open_store` skips every file that a file beside it replaces, so the switch is atomic for a
reader that opens the store at any moment. The replaced files are deleted afterwards; when the
process dies before that, the next `compact` deletes them. A `Store` opened before a compaction
may refer to deleted files: its next query lists the store again (once) and reads the merged
file instead.

One compaction at a time per store: ``<store>/.compact.lock`` is created exclusively and
removed at the end. It notes host, pid and start time: a lock left by a killed compaction
(its pid gone on this host, or older than ``CAPTURE_COMPACT_LOCK_TTL`` seconds, default 6 h,
from another host) is taken over. Writers may keep
recording meanwhile: they only add new files, which this run does not touch.

This module imports pyarrow (and duckdb to merge stats rows), never torch.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema
from capture.errors import CaptureError, EmptyStore
from capture.store.claims import verified_replaced
from capture.store.commits import segment_paths, uncommitted
from capture.store.compaction_lock import LOCK_NAME, CompactionLock
from capture.store.file_merge import BATCH_FILES, Corrupt, Vanished, collected, group_rows
from capture.store.files import safe_name, write_parquet
from capture.store.layout import (
    METADATA_REPLACES,
    METADATA_REPLACES_ROWS,
    VANISHED,
    FileInfo,
    Skip,
    list_files,
    open_root,
    read_footer,
)
from capture.store.many_reads import read_footers

__all__ = [
    "compact",
    "compact_root",
    "CompactResult",
    "TableResult",
    "METADATA_REPLACES",
    "LOCK_NAME",
]

DEFAULT_TARGET_ROWS = 1_000_000


@dataclass
class TableResult:
    """What compaction did to one table (calls, stats or structures)."""

    files_before: int = 0
    files_after: int = 0
    rows_before: int = 0
    rows_after: int = 0


@dataclass
class CompactResult:
    """What `compact` did, per table, and what it could not read."""

    tables: dict[str, TableResult] = field(default_factory=dict)
    deleted_leftovers: int = 0
    unreadable: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    """Files left as they are because their values are not a writer's (`capture.store.values`),
    each with why: ``path (reason)``."""
    refused_claims: list[str] = field(default_factory=list)
    """Files whose ``capture.replaces`` did not check out (nothing was deleted for them)."""
    rolled_back: list[str] = field(default_factory=list)
    """Rollups of segments that never committed (their writer died between the rollup and its
    calls files; `capture.store.commits`), removed with the calls files that did land."""
    left: list[str] = field(default_factory=list)
    """Groups left for the next run, and why (a file deleted meanwhile by a live writer)."""
    dry_run: bool = False


_File = FileInfo


def compact(
    store: str | os.PathLike[str],
    *,
    target_rows: int = DEFAULT_TARGET_ROWS,
    dry_run: bool = False,
) -> CompactResult:
    """Merges the store's small files (see the module docstring).

    Args:
        store: A store directory or pyarrow filesystem URI.
        target_rows: Largest number of calls per merged calls file; calls files that already
            hold this many rows are left alone.
        dry_run: Only count what would be merged; write and delete nothing.

    Returns:
        A `CompactResult` with files and rows before and after, per table.

    Raises:
        StoreNotFound: Nothing at `store`.
        EmptyStore: `store` holds no store file.
        CaptureError: Another compaction holds the lock, or a merged file did not check out
            (then nothing was replaced or deleted).

    Example:
        >>> calls = compact("capture-store").tables["calls"]  # doctest: +SKIP
        >>> calls.files_before, calls.files_after  # doctest: +SKIP
        (1000, 1)
    """
    if target_rows < 1:
        raise CaptureError(f"target_rows={target_rows} must be at least 1")
    fs, root = open_root(store, "nothing to compact")
    return compact_root(fs, root, os.fspath(store), target_rows=target_rows, dry_run=dry_run)


def compact_root(
    fs: pafs.FileSystem,
    root: str,
    store: str,
    *,
    target_rows: int = DEFAULT_TARGET_ROWS,
    dry_run: bool = False,
) -> CompactResult:
    """`compact` on a store already opened: its filesystem and root (`store` names it in
    messages). What a recording process's upkeep runs (`capture.store.upkeep`)."""
    result = CompactResult(dry_run=dry_run)
    try:
        _compact_tables(fs, root, target_rows, result, dry_run)
    except OSError as e:
        # A full disk, a read-only store, no permission: every merged file is written under a
        # temporary name and renamed only once complete, so the store is as it was (at most a
        # replaced file not deleted yet, which the next run deletes and readers skip).
        raise CaptureError(
            f"cannot compact the store at {store}: {_os_error(e)}; the store is "
            "unchanged: free some space or make the store writable, then run it again"
        ) from None
    seen = sum(t.files_before for t in result.tables.values()) + result.deleted_leftovers
    if not (seen or result.unreadable or result.corrupt):  # as every other command says
        raise EmptyStore(f"the store at {store} holds no recorded call yet; nothing to compact")
    return result


def _os_error(e: OSError) -> str:
    """`e` in one line: what failed, on which file."""
    what = e.strerror or " ".join(str(e).split())
    return f"{what} ({e.filename})" if e.filename else what


def _compact_tables(
    fs: pafs.FileSystem, root: str, target_rows: int, result: CompactResult, dry_run: bool
) -> None:
    """Every table of the store, under the compaction lock."""
    with CompactionLock(fs, root, dry_run):
        for table in schema.TABLES:
            result.tables[table] = TableResult()
            skips: list[Skip] = []
            listed = list_files(fs, root, table, skips)
            result.unreadable.extend(s.path for s in skips)
            # Read after the calls were listed: a calls file listed is named by a rollup read
            # here, whenever that rollup was written (it is written before its calls files).
            named = _named_by_rollups(fs, root) if table == schema.CALLS else set()
            for folder, files in _folders(fs, table, listed, result):
                _compact_folder(fs, table, folder, files, target_rows, result, named)


# -- files and folders ---------------------------------------------------------------------------
def _named_by_rollups(fs: pafs.FileSystem, root: str) -> set[str]:
    """The calls files that the store's stats rollups name as their segment's commit.

    Left alone while their rollup exists: merged away, they would leave it uncommitted (its
    rows uncounted) for good (`capture.store.commits`).
    """
    paths = [info.path for info in list_files(fs, root, schema.STATS)]
    named: set[str] = set()
    for checked in read_footers(fs, paths, lambda f, p: read_footer(f, p, schema.STATS)):
        if isinstance(checked, FileInfo):
            named.update(segment_paths(checked))
    return named


def _folders(
    fs: pafs.FileSystem, table: str, listed: list[pafs.FileInfo], result: CompactResult
) -> Iterator[tuple[str, list[_File]]]:
    """(folder, its readable files) for every partition folder of `table`, one folder at a time.

    Only one folder's checked footers are held at once, and they are read `BATCH_FILES` at a
    time (see `capture.store.file_merge.collected`). A file deleted since the listing is left
    out, unreported.
    """
    by_folder: dict[str, list[str]] = {}
    for info in listed:
        by_folder.setdefault(info.path.rsplit("/", 1)[0], []).append(info.path)
    for folder in sorted(by_folder):
        files: list[_File] = []
        paths = by_folder.pop(folder)
        for start in range(0, len(paths), BATCH_FILES):
            chunk = paths[start : start + BATCH_FILES]
            # Many footers at once; each is checked against the schema.
            for checked in read_footers(fs, chunk, lambda f, p: read_footer(f, p, table)):
                if isinstance(checked, Skip) and checked.reason == VANISHED:
                    continue  # replaced by a live writer: its successor is for a later run
                if isinstance(checked, Skip) and checked.corrupt:  # left as it is, reported
                    result.corrupt.append(f"{checked.path} ({checked.reason})")
                elif isinstance(checked, Skip):  # foreign, wrong schema, truncated: left, reported
                    result.unreadable.append(checked.path)
                else:
                    files.append(checked)
            collected(len(chunk))
        yield folder, sorted(files, key=lambda f: f.path)


def _compact_folder(
    fs: pafs.FileSystem,
    table: str,
    folder: str,
    files: list[_File],
    target_rows: int,
    result: CompactResult,
    named: set[str],
) -> None:
    counts = result.tables[table]
    if table == schema.CALLS:  # a live rollup's commit: left for a run after that rollup went
        kept = [f for f in files if f.path in named]
        counts.files_before += len(kept)
        counts.files_after += len(kept)
        counts.rows_before += sum(f.rows for f in kept)
        counts.rows_after += sum(f.rows for f in kept)
        files = [f for f in files if f.path not in named]
    if table == schema.STATS:  # a writer may still replace or commit these: left for later
        files = _settled_rollups(fs, files, result)
    # Deleted only when a file beside them provably holds their rows (capture.store.claims).
    refused: list[Skip] = []
    replaced = verified_replaced(fs, files, refused)
    result.refused_claims.extend(f"{s.path} {s.reason}" for s in refused)
    leftovers = [f for f in files if f.path in replaced]
    live = [f for f in files if f.path not in replaced]
    if leftovers:  # an earlier compaction died between its rename and its deletes
        result.deleted_leftovers += len(leftovers)
        if not result.dry_run:
            _delete(fs, [f.path for f in leftovers])
    counts.files_before += len(live)
    counts.rows_before += sum(f.rows for f in live)
    if table == schema.CALLS:
        groups = _calls_groups(live, target_rows)
    elif len(live) > 1 or any(f.segment for f in live):
        # a lone rollup naming its segment is rewritten too: its calls files are then free
        # for the next compaction (they are left alone while a rollup names them)
        groups = [live]
    else:
        groups = []
    merged = {f.path for group in groups for f in group}
    for f in live:
        if f.path not in merged:
            counts.files_after += 1
            counts.rows_after += f.rows
    for group in groups:
        if result.dry_run:
            counts.files_after += 1
            counts.rows_after += sum(f.rows for f in group) if table == schema.CALLS else 0
            continue
        try:
            counts.rows_after += _merge(fs, table, folder, group)
            counts.files_after += 1
        except Corrupt as bad:
            # Its rows are left as they are (nothing recorded is changed): reported, not merged.
            result.corrupt.append(f"{bad.path} ({bad.reason})")
            counts.files_after += len(group)
            counts.rows_after += sum(f.rows for f in group)
        except Vanished as gone:
            # A live writer replaced (or rolled back) a file since it was listed: its rows are
            # in a file this run did not list. Nothing was replaced; the group waits.
            result.left.append(f"{folder}: {gone.path} was deleted meanwhile")
            counts.files_after += len(group)
            counts.rows_after += sum(f.rows for f in group)


def _settled_rollups(fs: pafs.FileSystem, files: list[_File], result: CompactResult) -> list[_File]:
    """The stats files compaction may take now; old uncommitted rollups are rolled back.

    Left alone: a writer's open rollup younger than `schema.ROLLUP_GRACE_S` (its writer may
    still replace it), any rollup whose segment has not committed yet while it is that young
    (its writer is writing the calls), and files deleted since they were listed (a
    gone file was taken for an old one, then read). An uncommitted rollup older than that
    belongs to a writer that died between its rollup and its calls files: its calls files
    that landed (hidden from readers) and then the rollup are deleted.
    """
    pending = uncommitted(fs, files)
    waiting = [f for f in files if f.rollup == "open" or f.path in pending]
    young, gone = _young_rollups(fs, waiting)
    stale = [f for f in files if f.path in pending and f.path not in young | gone]
    for f in stale:
        result.rolled_back.append(f.path)
        if not result.dry_run:
            _delete(fs, [*pending[f.path], f.path])  # calls first: the rollup hides them
    return [f for f in files if f.path not in pending and f.path not in young | gone]


def _young_rollups(fs: pafs.FileSystem, files: list[_File]) -> tuple[set[str], set[str]]:
    """Which of `files` are younger than `schema.ROLLUP_GRACE_S`, and which are gone.

    A writer may still replace a young open rollup with a successor holding its rows: merged
    now, those rows would be counted twice. A writer never replaces a rollup older than
    `schema.ROLLUP_CONTINUE_S` (half the grace), so an older one is safe to merge. A file no
    longer there was replaced since it was listed: skipped, never read.
    """
    if not files:
        return set(), set()
    now = time.time()
    young, gone = set(), set()
    for info in fs.get_file_info([f.path for f in files]):
        if info.type != pafs.FileType.File:
            gone.add(info.path)
            continue
        mtime = info.mtime.timestamp() if info.mtime is not None else now
        if now - mtime < schema.ROLLUP_GRACE_S:
            young.add(info.path)
    return young, gone


def _calls_groups(files: list[_File], target_rows: int) -> list[list[_File]]:
    """Runs of small calls files, each of at most `target_rows` rows; runs of one are kept."""
    groups: list[list[_File]] = []
    current: list[_File] = []
    rows = 0
    for f in files:
        if f.rows >= target_rows:
            continue
        if current and rows + f.rows > target_rows:
            groups.append(current)
            current, rows = [], 0
        current.append(f)
        rows += f.rows
    groups.append(current)
    return [g for g in groups if len(g) > 1]


# -- merging -----------------------------------------------------------------------------------
def _merge(fs: pafs.FileSystem, table: str, folder: str, group: list[_File]) -> int:
    """Writes the merged file, checks it, renames it into place, deletes `group`; its rows."""
    rows, expected = group_rows(fs, table, folder, group)
    name = f"compact-{_stamp()}.parquet"
    replaces = json.dumps([f.name for f in group]).encode()
    counts = json.dumps({f.name: f.rows for f in group}).encode()
    path = write_parquet(
        fs,
        folder,
        name,
        rows,
        table,
        extra_metadata={METADATA_REPLACES: replaces, METADATA_REPLACES_ROWS: counts},
    )
    written = _verify(fs, path, table, expected)
    _delete(fs, [f.path for f in group])
    return written


def _verify(fs: pafs.FileSystem, path: str, table: str, expected: int) -> int:
    """The merged file's rows; removes it and raises when it does not hold what it replaces.

    Calls: as many rows as the sources. Stats: as many calls counted as the sources.
    Structures: the rows written.
    """
    try:
        with fs.open_input_file(path) as f:
            meta = pq.read_metadata(f)
            rows = int(meta.num_rows)
            if table == schema.STATS:
                counted = int(pc.sum(pq.read_table(f, columns=["calls"])["calls"]).as_py() or 0)
            else:
                counted = rows
        if counted != expected:
            what = "calls counted" if table == schema.STATS else "rows"
            raise CaptureError(f"{counted} {what} in the merged file, {expected} in its sources")
    except Exception as e:
        fs.delete_file(path)  # readers may have seen it for an instant: it holds only copies
        raise CaptureError(
            f"compaction of {path.rsplit('/', 1)[0]} did not check out ({e}); the original "
            "files are untouched"
        ) from e
    return rows


def _delete(fs: pafs.FileSystem, paths: list[str]) -> None:
    for path in paths:
        try:
            fs.delete_file(path)
        except FileNotFoundError:  # another reader of the lock-less past removed it
            pass


def _stamp() -> str:
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    host = safe_name(socket.gethostname())
    return f"{now}-{host}-{os.getpid()}-{time.perf_counter_ns() % 1_000_000:06d}"
