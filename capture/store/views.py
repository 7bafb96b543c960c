"""The SQL views of a store's DuckDB connection: their definitions, and which read the calls.

`capture.store.reader.Store` makes the base views over the checked files (``calls``, ``stats``,
``_structures_raw``) and then these: ``structures`` and ``signatures`` over the rows read at
opening, ``leaves`` and ``dims`` over the calls files, made only for SQL that names one
(`needs_calls`). The columns users rely on are listed in the reader's docstring (DESIGN §6).
"""

from __future__ import annotations

import re

import duckdb

from capture import schema
from capture.store.layout import SIGNATURE_TOTALS

__all__ = ["DATE_FROM_PATH", "DERIVED_VIEWS", "CALLS_VIEWS", "needs_calls"]

DATE_FROM_PATH = "TRY_CAST(regexp_extract(filename, '/date=([0-9-]+)/', 1) AS DATE)"
"""The ``date`` of a calls file, from its ``date=`` folder (its ``model=`` folder is sanitized)."""

DERIVED_VIEWS = f"""
CREATE OR REPLACE VIEW structures AS
    SELECT * EXCLUDE (rn) FROM (
        SELECT *, row_number() OVER (PARTITION BY model, structure_id, leaf) AS rn
        FROM _structures_raw
    ) WHERE rn = 1;

CREATE OR REPLACE VIEW signatures AS
    SELECT {SIGNATURE_TOTALS}, {schema.SIGNATURE_RANGES}
    FROM stats
    GROUP BY ALL;

"""
"""The views over the rows read at opening: structures deduplicated, signatures merged."""

CALLS_VIEWS = """
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

CREATE OR REPLACE VIEW dims AS
    SELECT call_id, model, side, leaf, path,
           unnest(generate_series(0, len(shape) - 1)) AS axis, unnest(shape) AS size
    FROM leaves WHERE kind = 'tensor';
"""
"""The views over the calls files: one row per call and leaf, one row per call, leaf and axis."""


_CALLS_NAMES = re.compile(r"\b(calls|leaves|dims)\b", re.IGNORECASE)
"""Names of the views over the calls files (the others read only stats and structures)."""

_PARAMETER = re.compile(r"\$\w+|\?")


def needs_calls(con: duckdb.DuckDBPyConnection, sql: str) -> bool:
    """Whether `sql` may read a view over the calls files.

    DuckDB names the tables a statement reads (a column named ``calls`` does not count);
    when it cannot tell (several statements, DDL, a parse error), any of the names in the
    text counts.

    Args:
        con: A connection (it parses the SQL; nothing runs).
        sql: The statement(s).

    Returns:
        True when ``calls``, ``leaves`` or ``dims`` may be read.

    Example:
        >>> needs_calls(duckdb.connect(), "SELECT count(*) AS calls FROM stats")
        False
    """
    try:
        names = con.get_table_names(_PARAMETER.sub("NULL", sql))
    except duckdb.Error:
        return bool(_CALLS_NAMES.search(sql))
    return any(_CALLS_NAMES.fullmatch(name) for name in names)
