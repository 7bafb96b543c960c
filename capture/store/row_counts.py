"""Statements a store answers from its calls files' footers: counting the rows of ``calls``.

A reader checks every calls file's footer before DuckDB reads the file
(`capture.store.layout.read_footer`), so it already holds the row count of each file the
``calls`` view would read. ``SELECT count(*) FROM calls`` scans nothing but those same row
counts: DuckDB would open and parse every footer a second time to add them up (at 100,000
files, as long again as the check). So a statement that only counts the rows of ``calls`` is
answered from the counts the check found: DuckDB runs the statement itself over a stand-in
``calls`` of exactly as many rows (``range(N)``), so the result's names and types are
DuckDB's, and nothing of ours formats it.

Which statements: DuckDB's own parse (``json_serialize_sql``), never the SQL text. One
``SELECT`` whose ``FROM`` is the base table ``calls`` (an alias allowed), whose select list
is ``count(*)`` only (aliases allowed), with nothing else: no ``WHERE``, ``GROUP BY``,
``HAVING``, ``QUALIFY``, sample, ``ORDER BY``/``LIMIT``, CTE, ``DISTINCT``, ``FILTER`` or
parameter. A field of the parse tree this module does not know must be empty: a statement a
later DuckDB parses into something new is read from the files, as every other statement is.
"""

from __future__ import annotations

from typing import Any

import duckdb

from capture.store.views import parsed

__all__ = ["counts_calls", "counted", "own_calls_view"]

_WHERE = frozenset({"query_location", "query_location_length", "alias"})
"""Fields that say where a node is in the text, or what it is called: not what it does."""


def counts_calls(con: duckdb.DuckDBPyConnection, sql: str, own: str | None = None) -> bool:
    """Whether `sql` is one statement counting the rows of ``calls``, and nothing else.

    Also False when `con` holds a table called ``calls``, or a view of that name other than the
    store's own (a user's, made in the store's session): the statement counts that one.

    Args:
        con: The store's connection (it parses; nothing is read).
        sql: The statement.
        own: The SQL of the store's own ``calls`` view in `con` (`own_calls_view`, taken when
            the reader made it), None when it has not made one.

    Example:
        >>> counts_calls(duckdb.connect(), "SELECT count(*) AS n FROM calls")
        True
        >>> counts_calls(duckdb.connect(), "SELECT count(*) FROM calls WHERE error IS NULL")
        False
    """
    if "calls" not in sql.lower():  # a shortcut only: DuckDB's parse decides
        return False
    tree = parsed(con, sql)
    if tree is None:
        return False
    statements = tree.get("statements")
    if not isinstance(statements, list) or len(statements) != 1:
        return False
    statement = statements[0]
    if not isinstance(statement, dict) or not _empty(statement, ("node",)):
        return False
    if not _counts_rows(statement.get("node")):
        return False
    return not _shadowed(con, own)


def counted(
    con: duckdb.DuckDBPyConnection, rows: int, sql: str
) -> tuple[duckdb.DuckDBPyConnection, duckdb.DuckDBPyRelation]:
    """`sql` (a statement `counts_calls` accepted) run by DuckDB over `rows` stand-in rows.

    In a cursor of `con` (the same database, its own temporary objects): the stand-in
    ``calls`` is a temporary view there, seen by no other statement. Returns the cursor with
    the relation: it must stay open while the relation is read.
    """
    cursor = con.cursor()
    cursor.execute(f"CREATE TEMP VIEW calls AS SELECT range AS call_id FROM range({int(rows)})")
    return cursor, cursor.sql(sql)


def _counts_rows(node: Any) -> bool:
    """A ``SELECT count(*)[, count(*) ...] FROM calls`` node, nothing else in it."""
    if not isinstance(node, dict) or node.get("type") != "SELECT_NODE":
        return False
    if node.get("aggregate_handling") not in (None, "STANDARD_HANDLING"):
        return False
    if not _empty(node, ("select_list", "from_table", "aggregate_handling")):
        return False
    source = node.get("from_table")
    if not isinstance(source, dict) or source.get("type") != "BASE_TABLE":
        return False
    if str(source.get("table_name", "")).lower() != "calls":
        return False
    if not _empty(source, ("table_name", "qualified_name")) or not _named(source, "calls"):
        return False
    items = node.get("select_list")
    return isinstance(items, list) and bool(items) and all(map(_count_star, items))


def _count_star(item: Any) -> bool:
    """``count(*)``: no argument, filter, ordering or DISTINCT."""
    if not isinstance(item, dict) or item.get("class") != "FUNCTION":
        return False
    if item.get("function_name") != "count_star":
        return False
    return _empty(item, ("function_name", "qualified_name")) and _named(item, "count_star")


def _named(node: dict[str, Any], name: str) -> bool:
    """The node's qualified name, when its DuckDB writes one, is `name` alone."""
    qualified = node.get("qualified_name")
    if qualified is None:
        return True
    if not isinstance(qualified, dict) or len(qualified) != 1:
        return False
    path = qualified.get("path")
    return isinstance(path, list) and len(path) == 1 and str(path[0]).lower() == name


def _empty(node: dict[str, Any], known: tuple[str, ...]) -> bool:
    """Every field of `node` but its kind (checked by the caller), `known` and `_WHERE` ones
    is empty."""
    skip = {*known, "type", "class"}
    return all(key in skip or key in _WHERE or _nothing(v) for key, v in node.items())


def _nothing(value: Any) -> bool:
    """None, "", false, [], or an object of empty fields: an empty ORDER BY is one; an
    expression (it has a ``class``) or any other typed node is not."""
    if isinstance(value, dict):
        if "class" in value or value.get("type", "ORDER_MODIFIER") != "ORDER_MODIFIER":
            return False
        return all(key in _WHERE or key == "type" or _nothing(v) for key, v in value.items())
    if isinstance(value, list):
        return all(_nothing(v) for v in value)
    return value is None or value is False or value == ""


def own_calls_view(con: duckdb.DuckDBPyConnection) -> str | None:
    """The SQL of the view ``calls`` in `con`, None when there is none: what `counts_calls`
    compares with, to tell the store's own view from one a user put in its place."""
    found = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = 'calls'").fetchall()
    return str(found[0][0]) if len(found) == 1 else None


def _shadowed(con: duckdb.DuckDBPyConnection, own: str | None) -> bool:
    """Whether ``calls`` in `con` means something else than the store's own view `own`."""
    found = con.execute(
        "SELECT NULL FROM duckdb_tables() WHERE lower(table_name) = 'calls' "
        "UNION ALL SELECT sql FROM duckdb_views() WHERE lower(view_name) = 'calls'"
    ).fetchall()
    return any(own is None or row[0] != own for row in found)
