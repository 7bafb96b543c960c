"""Value checks of store files: what no capture writer writes, said in one line.

A file can pass every footer check (capture's metadata, the table's schema, plausible sizes) and
still hold values the analyses cannot read: nulls among a call's sizes, a negative call count, a
negative offset into a call's sizes, JSON nested deeper than readers follow
(`capture.untrusted.MAX_JSON_DEPTH`). Such a file is the store's own (its rows are recorded
calls), so it is neither read as if it were sound nor silently left out: readers stop with one
error naming the file and the problem (`capture.errors.CorruptStoreFile`), compaction leaves the
file as it is and reports it. Imports pyarrow (and `capture.untrusted`) only.

The checks read what is cheap: the rows of stats and structures files (read whole anyway) and,
for calls files, the footer's statistics (null count and minimum of the sizes), reading a calls
file's ``dims`` column only when its statistics cannot rule nulls out (an empty list counts as a
null there).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from capture import schema
from capture.untrusted import MAX_JSON_DEPTH, too_deep

__all__ = ["rows_problem", "calls_problem", "CORRUPT", "RAGGED"]

CORRUPT = "holds values no capture writer writes"
"""Start of the reason of a file these checks refuse (`capture.store.layout.Skip.corrupt`)."""

_NON_NEGATIVE = {
    schema.STATS: ("calls", "errors"),
    schema.STRUCTURES: ("leaf", "rank", "dim_offset", "range_index", "n_args"),
}


def _negative(rows: pa.Table, column: str) -> bool:
    if column not in rows.column_names:
        return False
    low = pc.min(rows.column(column)).as_py()
    return low is not None and low < 0


def _null_sizes(rows: pa.Table, column: str, required: bool) -> bool:
    """Whether a list of sizes in `column` is null (when `required`) or holds a null."""
    if column not in rows.column_names:
        return False
    values = rows.column(column)
    if required and values.null_count:
        return True
    return bool(pc.list_flatten(values).null_count)


RAGGED = -1
"""The size a writer records for a nested tensor's ragged dim: the one negative size it writes."""


def _negative_size(rows: pa.Table, column: str) -> bool:
    """Whether a size in `column` is below `RAGGED` (no writer writes one)."""
    if column not in rows.column_names:
        return False
    low = pc.min(pc.list_flatten(rows.column(column))).as_py()
    return low is not None and low < RAGGED


_JSON_COLUMNS = {schema.STRUCTURES: ("treespec", "signature", "value")}
"""Columns of JSON text, parsed by the readers (`capture.untrusted.loads`)."""


def _too_deep(rows: pa.Table, column: str) -> bool:
    """Whether a JSON value of `column` nests deeper than `MAX_JSON_DEPTH` (values with fewer
    openings than that are passed over without looking further)."""
    if column not in rows.column_names:
        return False
    values = rows.column(column)
    openings = pc.count_substring_regex(values, r"[\[{]")
    if (pc.max(openings).as_py() or 0) <= MAX_JSON_DEPTH:
        return False
    many = pc.filter(values, pc.greater(openings, MAX_JSON_DEPTH))
    return any(too_deep(text) for text in pc.unique(many).to_pylist())


def rows_problem(table: str, rows: pa.Table) -> str | None:
    """What is wrong with the values of a stats or structures file's `rows`, or of the columns
    of a calls file's rows read (None: nothing).

    Example:
        >>> rows_problem("stats", pa.table({"calls": [3, -1]}))
        'holds values no capture writer writes: a negative value in its calls column'
    """
    for column in _NON_NEGATIVE.get(table, ()):
        if _negative(rows, column):
            return f"{CORRUPT}: a negative value in its {column} column"
    for column in _JSON_COLUMNS.get(table, ()):
        if _too_deep(rows, column):
            return f"{CORRUPT}: JSON nested deeper than {MAX_JSON_DEPTH} levels in its {column}"
    if table in (schema.STATS, schema.CALLS):
        for column, required in (("dims", True), ("out_dims", False)):
            if _null_sizes(rows, column, required):
                return f"{CORRUPT}: a null in its {column}"
            if _negative_size(rows, column):
                return f"{CORRUPT}: a negative size in its {column}"
    return None


def calls_problem(
    fs: pafs.FileSystem,
    path: str,
    sizes: dict[str, list[pq.Statistics | None]],
) -> str | None:
    """What is wrong with the sizes of the calls file at `path` (None: nothing).

    From the footer's statistics; the ``dims`` and ``out_dims`` columns are read only when
    the statistics count nulls (or are missing): a null there may be an empty list.
    `sizes`: the statistics of each list's elements, one per row group (a column the file
    lacks is absent), as `capture.store.layout` collects them in its pass over the footer.
    """
    read: list[str] = []
    for column in ("dims", "out_dims"):
        for stats in sizes.get(column, []):
            if stats is None or not stats.has_null_count:
                read.append(column)
                break
            if stats.has_min_max and stats.min_raw < RAGGED:  # INT64: no conversion
                return f"{CORRUPT}: a negative size in its {column}"
            if stats.null_count:
                read.append(column)
                break
    if not read:
        return None
    with fs.open_input_file(path) as f:
        rows = pq.read_table(f, columns=read)
    for column in read:
        if _null_sizes(rows, column, column == "dims"):
            return f"{CORRUPT}: a null in its {column}"
        if _negative_size(rows, column):
            return f"{CORRUPT}: a negative size in its {column}"
    return None
