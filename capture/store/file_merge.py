"""The rows of many store files as one: calls regrouped, stats merged, structures deduplicated.

What `capture.compact` writes in place of a folder's small files, read in bounded batches: the
memory a merge needs is one batch plus the merged rows, whatever the number of files.
A source file deleted meanwhile raises `Vanished` (decided from facts). Imports pyarrow
(and duckdb to merge stats rows), never torch.
"""

from __future__ import annotations

import functools
import gc
import os
import sys
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema
from capture.store.files import vanished
from capture.store.layout import FileInfo
from capture.store.many_reads import read_footers
from capture.store.stats_merge import SIGNATURE_MERGE
from capture.store.values import CORRUPT, rows_problem

__all__ = ["BATCH_FILES", "Corrupt", "Vanished", "collected", "group_rows", "merge_stats"]


_COLLECT_FROM = 256
"""Files read in a batch from which `collected` runs a collection (each costs 0.1-0.3 s)."""


def collected(files: int) -> None:
    """Frees the footers of the `files` files just read, now (a full cyclic collection).

    pyarrow's `FileMetaData` and its `ParquetSchema` refer to each other, so a footer whose
    schema was looked at is freed only by the cyclic collector; read by a pool's threads they
    outlive the young collections and pile up in the oldest generation, which Python collects
    only once it has grown by a quarter: about 30 KB a file left for later, 3.6 GB of the peak
    when compacting 100,000 files. Collected after every batch, a compaction holds
    one batch's worth, whatever the number of files. A batch of fewer than `_COLLECT_FROM`
    files leaves a few MB at most: not worth a collection, which cost a compaction beside
    live writers (every few seconds, a few dozen files) half its time.
    """
    if files >= _COLLECT_FROM:
        gc.collect()


_ROW_GROUP = 65_536  # rows per row group of a merged calls file


def group_rows(
    fs: pafs.FileSystem, table: str, folder: str, group: list[FileInfo]
) -> tuple[pa.Table | Iterator[pa.Table], int]:
    """The merged rows of `group`'s files, and what the merged file must hold to check out.

    Calls: streamed in row groups (one in memory at a time), as many rows as the sources.
    Stats: merged by signature, as many calls counted. Structures: one row per (structure,
    leaf), the rows merged.

    Args:
        fs: The store's filesystem.
        table: The files' table.
        folder: Their partition folder (for the progress line).
        group: The files, read in this order.

    Returns:
        ``(rows, expected)``.

    Raises:
        Vanished: A file of `group` was deleted after it was listed.

    Example:
        >>> rows, expected = group_rows(fs, "calls", folder, files)  # doctest: +SKIP
    """
    if table == schema.CALLS:
        return _regrouped(fs, group), sum(f.rows for f in group)
    return _merged_in_batches(fs, table, folder, group)


class Vanished(Exception):
    """A file of a merge was deleted after it was listed."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class Corrupt(Exception):
    """A file of a merge holds values no writer writes (`capture.store.values`)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path, self.reason = path, reason


def _read(fs: pafs.FileSystem, path: str, table: str) -> pa.Table:
    """The rows of one store file, in `table`'s schema.

    Raises:
        Vanished: The file is gone (decided by `capture.store.files.vanished`, not a message).
        Corrupt: Its values are not a writer's (nulls among sizes, negative counts, ...).
    """
    try:
        with fs.open_input_file(path) as src:
            rows = pq.read_table(src)
    except OSError as e:
        if vanished(fs, path, e):
            raise Vanished(path) from e
        raise
    problem = rows_problem(table, rows)
    if problem is None:
        for field in schema.SCHEMAS[table]:  # a column a later version added: null in older files
            if (table, field.name) in schema.ADDED_IN and field.name not in rows.column_names:
                rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
        try:
            return rows.select(schema.SCHEMAS[table].names).cast(schema.SCHEMAS[table])
        except (pa.ArrowInvalid, ValueError) as e:  # a null where the schema allows none
            problem = f"{CORRUPT}: {' '.join(str(e).split())[:120]}"
    raise Corrupt(path, problem)


BATCH_FILES = 1_000
"""Files read at once (by a thread pool) and merged into the running result: the memory a
merge needs is bounded by one batch plus the merged rows, whatever the number of files; all of
100,000 stats files at once ran DuckDB out of memory."""


def _batches(
    fs: pafs.FileSystem, table: str, folder: str, group: list[FileInfo]
) -> Iterator[pa.Table]:
    """The rows of `group`'s files, `BATCH_FILES` files per table, in file order.

    Each batch is copied into one chunk per column: the files' own arrays (a few rows each,
    every buffer padded) cost several KB a file and are freed at once.
    """
    reader = functools.partial(_read, table=table)
    for start in range(0, len(group), BATCH_FILES):
        paths = [f.path for f in group[start : start + BATCH_FILES]]
        _progress(f"{folder}: {start + len(paths):,}/{len(group):,} files read")
        batch = pa.concat_tables(read_footers(fs, paths, reader, decodes=True)).combine_chunks()
        collected(len(paths))
        yield batch
        del batch  # before the next one is read
    _progress("")


def _merged_in_batches(
    fs: pafs.FileSystem, table: str, folder: str, group: list[FileInfo]
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


def _regrouped(fs: pafs.FileSystem, group: list[FileInfo]) -> Iterator[pa.Table]:
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
