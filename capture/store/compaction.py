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
import functools
import gc
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema
from capture.errors import CaptureError, EmptyStore
from capture.store.claims import verified_replaced
from capture.store.compaction_lock import LOCK_NAME, CompactionLock
from capture.store.files import safe_name, write_parquet
from capture.store.layout import (
    METADATA_REPLACES,
    METADATA_REPLACES_ROWS,
    FileInfo,
    Skip,
    list_files,
    open_root,
    read_footer,
    read_footers,
)
from capture.store.stats_merge import SIGNATURE_MERGE

__all__ = ["compact", "CompactResult", "TableResult", "METADATA_REPLACES", "LOCK_NAME"]

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
    refused_claims: list[str] = field(default_factory=list)
    """Files whose ``capture.replaces`` did not check out (nothing was deleted for them)."""
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
    result = CompactResult(dry_run=dry_run)
    with CompactionLock(fs, root, dry_run):
        for table in schema.TABLES:
            result.tables[table] = TableResult()
            for folder, files in _folders(fs, root, table, result):
                _compact_folder(fs, table, folder, files, target_rows, result)
    seen = sum(t.files_before for t in result.tables.values()) + result.deleted_leftovers
    if not seen and not result.unreadable:  # as every other command says of such a store
        raise EmptyStore(
            f"the store at {os.fspath(store)} holds no recorded call yet; nothing to compact"
        )
    return result


# -- files and folders ---------------------------------------------------------------------------
def _folders(
    fs: pafs.FileSystem, root: str, table: str, result: CompactResult
) -> Iterator[tuple[str, list[_File]]]:
    """(folder, its readable files) for every partition folder of `table`, one folder at a time.

    Only one folder's checked footers are held at once, and they are read `_BATCH_FILES` at a
    time (see `_collected`).
    """
    skips: list[Skip] = []
    by_folder: dict[str, list[str]] = {}
    for info in list_files(fs, root, table, skips):
        by_folder.setdefault(info.path.rsplit("/", 1)[0], []).append(info.path)
    result.unreadable.extend(s.path for s in skips)
    for folder in sorted(by_folder):
        files: list[_File] = []
        paths = by_folder.pop(folder)
        for start in range(0, len(paths), _BATCH_FILES):
            chunk = paths[start : start + _BATCH_FILES]
            # Many footers at once (issue 14); each is checked against the schema (issue 11).
            for checked in read_footers(fs, chunk, lambda f, p: read_footer(f, p, table)):
                if isinstance(checked, Skip):  # foreign, wrong schema, truncated: left, reported
                    result.unreadable.append(checked.path)
                else:
                    files.append(checked)
            _collected()
        yield folder, sorted(files, key=lambda f: f.path)


def _collected() -> None:
    """Frees the footers just read, now (a full cyclic collection).

    pyarrow's `FileMetaData` and its `ParquetSchema` refer to each other, so a footer whose
    schema was looked at is freed only by the cyclic collector; read by a pool's threads they
    outlive the young collections and pile up in the oldest generation, which Python collects
    only once it has grown by a quarter: about 30 KB a file left for later, 3.6 GB of the peak
    when compacting 100,000 files (issue 14). Collected after every batch, a compaction holds
    one batch's worth, whatever the number of files.
    """
    gc.collect()


def _compact_folder(
    fs: pafs.FileSystem,
    table: str,
    folder: str,
    files: list[_File],
    target_rows: int,
    result: CompactResult,
) -> None:
    counts = result.tables[table]
    # Deleted only when a file beside them provably holds their rows (capture.store.claims).
    refused: list[Skip] = []
    replaced = verified_replaced(fs, files, refused)
    result.refused_claims.extend(f"{s.path} {s.reason}" for s in refused)
    leftovers = [f for f in files if f.path in replaced]
    live = [f for f in files if f.path not in replaced]
    if table == schema.STATS:  # a writer may still replace these: left for a later run
        live = [f for f in live if f.path not in _young_rollups(fs, live)]
    if leftovers:  # an earlier compaction died between its rename and its deletes
        result.deleted_leftovers += len(leftovers)
        if not result.dry_run:
            _delete(fs, [f.path for f in leftovers])
    counts.files_before += len(live)
    counts.rows_before += sum(f.rows for f in live)
    if table == schema.CALLS:
        groups = _calls_groups(live, target_rows)
    else:
        groups = [live] if len(live) > 1 else []
    merged = {f.path for group in groups for f in group}
    for f in live:
        if f.path not in merged:
            counts.files_after += 1
            counts.rows_after += f.rows
    for group in groups:
        counts.files_after += 1
        if result.dry_run:
            counts.rows_after += sum(f.rows for f in group) if table == schema.CALLS else 0
            continue
        counts.rows_after += _merge(fs, table, folder, group)


def _young_rollups(fs: pafs.FileSystem, files: list[_File]) -> set[str]:
    """The open stats rollups (`capture.record.writer`) younger than `schema.ROLLUP_GRACE_S`.

    Their writer may still replace one with a successor holding its rows: merged now, those
    rows would be counted twice. A writer never replaces a rollup older than
    `schema.ROLLUP_CONTINUE_S` (half the grace), so an older one is safe to merge.
    """
    open_ones = [f.path for f in files if f.rollup == "open"]
    if not open_ones:
        return set()
    now = time.time()
    young = set()
    for info in fs.get_file_info(open_ones):
        mtime = info.mtime.timestamp() if info.mtime is not None else now
        if info.type == pafs.FileType.File and now - mtime < schema.ROLLUP_GRACE_S:
            young.add(info.path)
    return young


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
_ROW_GROUP = 65_536  # rows per row group of a merged calls file


def _merge(fs: pafs.FileSystem, table: str, folder: str, group: list[_File]) -> int:
    """Writes the merged file, checks it, renames it into place, deletes `group`; its rows."""
    rows: pa.Table | Iterator[pa.Table]
    if table == schema.CALLS:  # streamed: one row group in memory at a time
        rows, expected = _regrouped(fs, group), sum(f.rows for f in group)
    else:
        rows, expected = _merged_in_batches(fs, table, folder, group)
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


def _read(fs: pafs.FileSystem, path: str, table: str) -> pa.Table:
    """The rows of one store file, in `table`'s schema."""
    with fs.open_input_file(path) as src:
        return pq.read_table(src).select(schema.SCHEMAS[table].names).cast(schema.SCHEMAS[table])


_BATCH_FILES = 1_000
"""Files read at once (by a thread pool) and merged into the running result: the memory a
merge needs is bounded by one batch plus the merged rows, whatever the number of files; all of
100,000 stats files at once ran DuckDB out of memory (issue 14)."""


def _batches(
    fs: pafs.FileSystem, table: str, folder: str, group: list[_File]
) -> Iterator[pa.Table]:
    """The rows of `group`'s files, `_BATCH_FILES` files per table, in file order.

    Each batch is copied into one chunk per column: the files' own arrays (a few rows each,
    every buffer padded) cost several KB a file and are freed at once.
    """
    reader = functools.partial(_read, table=table)
    for start in range(0, len(group), _BATCH_FILES):
        paths = [f.path for f in group[start : start + _BATCH_FILES]]
        _progress(f"{folder}: {start + len(paths):,}/{len(group):,} files read")
        batch = pa.concat_tables(read_footers(fs, paths, reader)).combine_chunks()
        _collected()
        yield batch
        del batch  # before the next one is read
    _progress("")


def _merged_in_batches(
    fs: pafs.FileSystem, table: str, folder: str, group: list[_File]
) -> tuple[pa.Table, int]:
    """Stats or structures of `group`, merged batch by batch; and the check's expected value.

    Merging is associative (sums, minima, maxima, first occurrence), so merging each batch
    into the running result gives what merging everything at once would.
    """
    merged: pa.Table | None = None
    calls = 0
    for batch in _batches(fs, table, folder, group):
        if table == schema.STATS:
            calls += int(pc.sum(batch.column("calls")).as_py() or 0)
        both = batch if merged is None else pa.concat_tables([merged, batch])
        merged = merge_stats(both) if table == schema.STATS else _unique_structures(both)
    assert merged is not None  # groups hold at least two files
    return merged, calls if table == schema.STATS else int(merged.num_rows)


def _progress(text: str) -> None:
    """One updating progress line on stderr, only when stderr is a terminal."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[Kcompact: {text}" if text else "\r\033[K")
        sys.stderr.flush()


def _regrouped(fs: pafs.FileSystem, group: list[_File]) -> Iterator[pa.Table]:
    """The calls of `group`, in file order, in tables of `_ROW_GROUP` rows (the last: fewer)."""
    pending: list[pa.Table] = []
    count = 0
    folder = group[0].path.rsplit("/", 1)[0]
    for batch in _batches(fs, schema.CALLS, folder, group):
        while batch.num_rows:
            take = min(_ROW_GROUP - count, batch.num_rows)
            pending.append(batch.slice(0, take))
            batch, count = batch.slice(take), count + take
            if count == _ROW_GROUP:
                yield pa.concat_tables(pending)
                pending, count = [], 0
    if pending:
        yield pa.concat_tables(pending)


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


_MERGE_STATS_SQL = f"""
SELECT {", ".join(schema.STATS_SCHEMA.names)}
FROM (SELECT {SIGNATURE_MERGE} FROM _stats GROUP BY ALL)
ORDER BY first_ts
"""


_DUCKDB_MEMORY = os.environ.get("CAPTURE_COMPACT_MEMORY", "2GB")


def merge_stats(stats: pa.Table) -> pa.Table:
    """One row per signature (model, structures, dims, out_dims), merged as the writer does.

    Counts and durations are summed, timestamps and integer ranges widened (element by
    element; an unknown item, NULL, is ignored). DuckDB groups by the list columns.
    """
    import duckdb

    con = duckdb.connect()
    try:
        # bounded: beyond this DuckDB spills to its temporary directory instead of failing
        con.execute(f"SET memory_limit = '{_DUCKDB_MEMORY}'")
        con.register("_stats", stats)
        merged = con.sql(_MERGE_STATS_SQL).to_arrow_table()
    finally:
        con.close()
    return merged.cast(schema.STATS_SCHEMA)


def _unique_structures(rows: pa.Table) -> pa.Table:
    seen: set[tuple[str, str, int]] = set()
    keep = []
    ids, models, leaves = (rows.column(n).to_pylist() for n in ("structure_id", "model", "leaf"))
    for i, key in enumerate(zip(ids, models, leaves, strict=True)):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return rows.take(pa.array(keep, pa.int64()))


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
