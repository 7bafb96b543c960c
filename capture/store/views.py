"""The SQL views of a store's DuckDB connection: their definitions, and which read the calls.

`capture.store.reader.StoreReader` makes the base views over the checked files (``calls``,
``stats``, ``_structures_raw``) and then these: ``structures`` and ``signatures`` over the rows
read at opening, ``leaves`` and ``dims`` over the calls files, made only for SQL that reads one
(`needs_calls`, decided by DuckDB, never by the text of the SQL). The columns users rely on are
listed in the reader's docstring (DESIGN §6).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa

from capture.errors import QueryError
from capture.store.stats_merge import SIGNATURE_MERGE

__all__ = [
    "CALLS_DERIVED",
    "CALLS_TYPE",
    "CALLS_VIEWS",
    "DATE_FROM_PATH",
    "DERIVED_VIEWS",
    "SQL_TYPES",
    "batches",
    "needs_calls",
    "parsed",
    "with_columns",
]

DATE_FROM_PATH = "TRY_CAST(regexp_extract(filename, '/date=([0-9-]+)/', 1) AS DATE)"
"""The ``date`` of a calls file, from its ``date=`` folder (its ``model=`` folder is sanitized)."""

DERIVED_VIEWS = f"""
CREATE OR REPLACE VIEW structures AS
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY model, structure_id, leaf) AS rn
        FROM _structures_raw
    ) WHERE rn = 1;

CREATE OR REPLACE VIEW signatures AS
    SELECT {SIGNATURE_MERGE}
    FROM stats
    GROUP BY ALL;

"""
"""The views over the rows read at opening: structures deduplicated, signatures merged by
`capture.store.stats_merge`'s one rule."""

CALLS_TYPE = """
CREATE TYPE _capture_path AS ENUM (
    SELECT DISTINCT path FROM structures WHERE kind = 'tensor' AND rank > 0 ORDER BY path
);
"""
"""The ENUM of the store's tensor paths (a ``dims`` row's ``path``)."""

CALLS_DERIVED = """
CREATE OR REPLACE VIEW leaves AS
    SELECT c.call_id, c.model, 'input' AS side, s.leaf, s.path, s.argument, s.kind, s.type,
           s.dtype, s.device,
           CASE WHEN s.kind = 'tensor'
                THEN c.dims[s.dim_offset + 1 : s.dim_offset + s.rank] END AS shape,
           CASE WHEN s.range_index IS NOT NULL THEN c.int_min[s.range_index + 1] END AS int_min,
           CASE WHEN s.range_index IS NOT NULL THEN c.int_max[s.range_index + 1] END AS int_max
    FROM calls c JOIN structures s ON s.structure_id = c.in_structure AND s.model = c.model
    UNION ALL
    SELECT c.call_id, c.model, 'output' AS side, s.leaf, s.path, s.argument, s.kind, s.type,
           s.dtype, s.device,
           CASE WHEN s.kind = 'tensor'
                THEN c.out_dims[s.dim_offset + 1 : s.dim_offset + s.rank] END AS shape,
           NULL::BIGINT AS int_min, NULL::BIGINT AS int_max
    FROM calls c JOIN structures s ON s.structure_id = c.out_structure AND s.model = c.model;

CREATE OR REPLACE VIEW _axes AS
    SELECT model, structure_id, leaf, path::_capture_path AS path, axis,
           dim_offset + axis AS position FROM (
        SELECT model, structure_id, leaf, path, dim_offset, unnest(range(rank)) AS axis
        FROM structures WHERE kind = 'tensor' AND rank > 0
    );

CREATE OR REPLACE VIEW dims AS
    SELECT c.call_id, c.model, 'input' AS side, a.leaf, a.path, a.axis, c.size
    FROM (
        SELECT call_id, model, in_structure,
               unnest(dims) AS size, unnest(range(len(dims))) AS position
        FROM calls
    ) c
    JOIN _axes a
      ON a.structure_id = c.in_structure AND a.model = c.model AND a.position = c.position
    UNION ALL
    SELECT c.call_id, c.model, 'output' AS side, a.leaf, a.path, a.axis, c.size
    FROM (
        SELECT call_id, model, out_structure,
               unnest(out_dims) AS size, unnest(range(len(out_dims))) AS position
        FROM calls WHERE out_dims IS NOT NULL
    ) c
    JOIN _axes a
      ON a.structure_id = c.out_structure AND a.model = c.model AND a.position = c.position;
"""
"""The views over the calls files: one row per call and leaf; one row per call, tensor leaf and
axis. ``dims`` flattens each call's sizes with their positions and joins them to ``_axes`` (one
row per structure, tensor leaf and axis: a few hundred rows), instead of slicing a list per
leaf: it reads the calls' ``dims`` column once and does no per-leaf work (about as fast as the
same group-by written by hand over the Parquet files, docs/benchmarks.md).

A ``dims`` row's ``path`` is an ENUM of the store's tensor paths (``_capture_path``, declared in
sorted order, so it sorts and compares as the text does): the view names each of a call's
sizes, tens of rows per call, before the user's group-by, where a query written by hand groups
by structure and position and names the few counted rows afterwards; grouping by path then
hashes a small integer per row, not a string (bench/bench_dims_view.py). Arrow hands the column
over dictionary-encoded."""

CALLS_VIEWS = CALLS_TYPE + CALLS_DERIVED
"""The type and the views over the calls files."""


CALLS_VIEWS_NAMES = frozenset({"calls", "leaves", "dims"})
"""The views over the calls files (the others read only stats and structures, in memory)."""


def needs_calls(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether DuckDB says that `sql` reads a view over the calls files.

    DuckDB's own answers, no text of ours: the tables the statement reads
    (``get_table_names``: parsed and bound, a CTE shadowing a view does not count; ~0.2 ms);
    for a statement it cannot bind alone (parameters, several statements) the tables its parse
    names (``json_serialize_sql``, SELECT statements, subqueries and CTEs included; ~1 ms).
    When neither tells (DDL, PRAGMA), False: the query then binds the calls views lazily, when
    DuckDB reports a missing table (`StoreReader.query`).

    Args:
        con: A connection with the store's views (it parses and binds; nothing is read).
        sql: The statement(s).

    Returns:
        True when ``calls``, ``leaves`` or ``dims`` is read.

    Example:
        >>> needs_calls(duckdb.connect(), "SELECT 1 AS calls")
        False
    """
    try:
        names = con.get_table_names(sql)
    except duckdb.Error:
        return _parse_names_calls(con, sql)
    return any(name.lower() in CALLS_VIEWS_NAMES for name in names)


def parsed(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, Any] | None:
    """DuckDB's parse of `sql` as its JSON tree (``json_serialize_sql``: not bound, nothing
    read), None when it has none (not SQL, no json functions, too deep a tree)."""
    try:
        rows = con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchall()
        tree = json.loads(rows[0][0]) if rows else {}
    except (duckdb.Error, ValueError, RecursionError):
        return None
    if not isinstance(tree, dict) or tree.get("error"):
        return None
    return tree


def _parse_names_calls(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether DuckDB's parse of `sql` (`parsed`) names a calls view."""
    tree = parsed(con, sql)
    if tree is None:
        return False
    pending: list[Any] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if node.get("type") == "BASE_TABLE":
                name = node.get("table_name")
                if isinstance(name, str) and name.lower() in CALLS_VIEWS_NAMES:
                    return True
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return False


def batches(reader: Any, first: pa.RecordBatch | None) -> Iterator[pa.RecordBatch]:
    """`first`, then the rest of DuckDB's `reader`; its errors become `QueryError`."""
    try:
        if first is None:
            return
        yield first
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except (duckdb.Error, OSError) as e:  # pyarrow hands DuckDB's errors over as OSError
                raise QueryError(f"query failed: {str(e).strip()}") from e
            yield batch
    finally:
        reader.close()


SQL_TYPES = {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT"}
"""The SQL type of each Arrow type a column added by a later store version has."""


def with_columns(rows: pa.Table, base: pa.Schema) -> pa.Table:
    """`rows` with every column of `base`: a column later store versions added (`schema.ADDED_IN`)
    is null on rows read from files of an older version."""
    for field in base:
        if field.name not in rows.column_names:
            rows = rows.append_column(field, pa.nulls(len(rows), field.type))
    return rows
