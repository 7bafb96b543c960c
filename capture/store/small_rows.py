"""A small store file's rows, with the columns its footer pins to one value built, not decoded.

The stats file an older writer left at each flush holds a few rows whose ``model``,
``out_structure``, ``calls`` and ``errors`` are the same in every row and whose ``state`` is
null in all of them, and the footer's statistics say so: the smallest value equals the
largest and none is null, or every value is null. pyarrow decodes any column chunk for about
25 µs, mostly fixed costs (a ZSTD context made and freed for each page), so those five columns
are a third of the decode of such a file, and a store can hold 10,000 of them. Here they are
built from the footer and only the other columns are decoded.

What is pinned: a flat (not nested) column of 64-bit integers or of UTF-8 strings, in every
row group the same value with no null (statistics with a null count and equal bounds), or null
in every row of a nullable column. A string bound that is not UTF-8, a group without statistics
or a type other than these two leaves the column to the decoder. The statistics are written by
the same writer as the pages: a file that lies in one can lie in the other just as easily,
and the rows are checked the same way afterwards (`capture.store.values.rows_problem`).
Imports pyarrow only.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

__all__ = ["Pinnable", "candidates", "read_rows"]

_NULL = object()
"""A pin saying every value is null."""

_BUILT: dict[tuple[bool, object, int], pa.Array] = {}
"""Arrays already built, by (string?, value, rows): the small files of one store repeat a few
(arrays of up to `_SHORT` rows, `_KEPT` of them: a few MiB at most)."""
_KEPT = 256
_SHORT = 1024
_lock = threading.Lock()


Pinnable = tuple[tuple[int, int, pa.Field], ...]
"""(Parquet column, Arrow field index, the field) of each column a footer may pin."""


def candidates(parquet: pq.ParquetSchema, arrow: pa.Schema) -> Pinnable:
    """The columns a footer may pin: each top-level flat column of physical INT64 read as
    int64, or of physical BYTE_ARRAY read as string (`arrow`: the file's Arrow schema)."""
    found = []
    for j in range(len(parquet)):
        column = parquet.column(j)
        if "." in column.path or column.max_repetition_level != 0:
            continue
        field = arrow.get_field_index(column.path)
        if field < 0:
            continue
        arrow_field = arrow.field(field)
        if (column.physical_type, arrow_field.type) in (
            ("INT64", pa.int64()),
            ("BYTE_ARRAY", pa.string()),
        ):
            found.append((j, field, arrow_field))
    return tuple(found)


def read_rows(reader: ParquetReader, pinnable: Pinnable) -> pa.Table:
    """The rows of a checked file: the `pinnable` columns its footer pins built from it, the
    others decoded (in this thread), in the file's column order, with its schema."""
    meta = reader.metadata
    rows = meta.num_rows
    built: dict[int, tuple[int, pa.Field, pa.Array]] = {}
    for leaf, (index, field, value) in _pins(meta, pinnable).items():
        array = _array(field, value, rows)
        if array is not None:
            built[leaf] = (index, field, array)
    rest = [j for j in range(meta.num_columns) if j not in built]
    if not built or not rest:  # nothing pinned, or every column (a file with no other)
        return reader.read_all(use_threads=False)
    table = reader.read_all(column_indices=rest, use_threads=False)
    for index, field, array in sorted(built.values(), key=lambda p: p[0]):  # each in its place
        table = table.add_column(index, field, array)
    return table


def _pins(meta: pq.FileMetaData, pinnable: Pinnable) -> dict[int, tuple[int, pa.Field, object]]:
    """Parquet column -> (Arrow field index, field, its one value or `_NULL`) of the
    `pinnable` columns whose statistics pin them in every row group."""
    values: dict[int, object] = {}
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        rows = group.num_rows
        for leaf, _, _ in pinnable:
            if i and leaf not in values:
                continue  # not pinned in an earlier group
            stats = group.column(leaf).statistics
            found = _pin(stats, rows) if stats is not None else None
            if found is None or (i and found != values[leaf]):
                values.pop(leaf, None)
            else:
                values[leaf] = found
    return {leaf: (index, field, values[leaf]) for leaf, index, field in pinnable if leaf in values}


def _pin(stats: pq.Statistics, rows: int) -> object:
    """The one value (or `_NULL`) these statistics pin a chunk of `rows` values to; None when
    they pin none."""
    if not stats.has_null_count or stats.num_values + stats.null_count != rows:
        return None
    if stats.null_count == rows:
        return _NULL
    if stats.null_count or not stats.has_min_max:
        return None
    low = stats.min_raw
    return low if low == stats.max_raw else None


def _array(field: pa.Field, value: object, rows: int) -> pa.Array | None:
    """`rows` copies of `value` (or nulls) as `field`'s type; None when `value` cannot be one
    (a string bound that is not UTF-8, nulls in a column that allows none)."""
    if value is _NULL and not field.nullable:
        return None
    string = field.type == pa.string()
    key = (string, value, rows)
    array = _BUILT.get(key)
    if array is not None:
        return array
    if value is _NULL:
        array = pa.nulls(rows, field.type)
    elif string:
        if not isinstance(value, bytes):
            return None
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
        array = pa.repeat(pa.scalar(text, pa.string()), rows)
    elif isinstance(value, int):
        array = pa.repeat(pa.scalar(value, pa.int64()), rows)
    else:
        return None
    if rows <= _SHORT:
        with _lock:
            if len(_BUILT) >= _KEPT:
                _BUILT.clear()
            _BUILT[key] = array
    return array
