"""A store's first statement over its calls, run over the columns it names, read with the checks.

A reader checks every calls file's footer before DuckDB reads the file. On a store of many
small files (short-lived recording processes, upkeep turned off) DuckDB then opens and parses
every footer a second time, and that costs about what the check did: the first statement paid
twice. So when the first statement that reads the calls is one ``SELECT``, the check also
decodes the columns that statement names (`statement_columns`), from the same read as each
footer (`capture.store.checked.check_table`), and DuckDB runs the statement over those rows in
memory (`run`). Each file is read once, and the rows DuckDB reads are the rows that were checked.

Which columns: every column of ``calls`` whose name appears in the statement as a word
(DuckDB's tokenizer: identifiers, quoted or not), and those the ``leaves`` and ``dims`` views
read when it names one. A ``*`` (but ``count(*)``) or ``COLUMNS`` means every column: DuckDB
then reads the files, and so does a statement ending in a ``LIMIT`` without ``ORDER BY``
(DuckDB stops once it has the rows).

The view it runs over has every column of the store's ``calls`` view, with the same names,
types and order; those not read raise an error when a value of theirs is read. A statement that
needs a column the words did not name (the whole row as a value, a ``NATURAL`` join) fails
instead of answering wrong, and the reader runs it again over the files. Imports duckdb and
pyarrow only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from capture import schema
from capture.store.views import CALLS_DERIVED, DATE_FROM_PATH, parsed

__all__ = ["NOT_READ", "file_columns", "run", "statement_columns"]

NOT_READ = "capture: a calls column the statement did not name was not read"
"""The error a value of an unread column raises (the reader then reads the files)."""

_ROWS = "_capture_first_rows"
_FILE = "_capture_file"  # `capture.store.footer_cache`'s file column
_NAMES = (*schema.CALLS_SCHEMA.names, "date")
_EVERY = frozenset({"columns", "nextval", "currval", "setseed"})
"""Words that read every column (``COLUMNS``), or whose second run is not the first's."""
_DERIVED = frozenset({"leaves", "dims", "_axes"})


def statement_columns(con: duckdb.DuckDBPyConnection, sql: str) -> list[str] | None:
    """The ``calls`` columns `sql` reads, in the view's order; None when it is not one
    ``SELECT`` (DuckDB's parse), or reads every column.

    Example:
        >>> statement_columns(duckdb.connect(), "SELECT count(*) FROM calls WHERE error IS NULL")
        ['error']
    """
    tree = parsed(con, sql)
    if tree is None or len(tree.get("statements") or ()) != 1 or _stops_early(tree):
        return None
    words = _words(sql)
    if words is None:
        return None
    if words & _DERIVED:
        derived = _derived_words()
        if derived is None:
            return None
        words |= derived
    found = [name for name in _NAMES if name in words]
    return None if len(found) == len(_NAMES) else found


@functools.cache
def _derived_words() -> frozenset[str] | None:
    """`_words` of the ``leaves`` and ``dims`` views' SQL (a constant: tokenized once)."""
    words = _words(CALLS_DERIVED)
    return None if words is None else frozenset(words)


def _stops_early(tree: dict[str, Any]) -> bool:
    """Whether the statement ends in a ``LIMIT`` without ``ORDER BY``: DuckDB stops reading
    files once it has the rows, where reading every file's columns first would not."""
    node = tree["statements"][0].get("node")
    kinds = [m.get("type") for m in (node or {}).get("modifiers") or () if isinstance(m, dict)]
    return "LIMIT_MODIFIER" in kinds and "ORDER_MODIFIER" not in kinds


def _words(sql: str) -> set[str] | None:
    """The lowercased identifiers of `sql`; None when it holds a star (not ``(*)``) or a word
    of `_EVERY`."""
    tokens = duckdb.tokenize(sql)
    texts = [
        sql[start : tokens[i + 1][0] if i + 1 < len(tokens) else len(sql)].strip()
        for i, (start, _) in enumerate(tokens)
    ]
    words: set[str] = set()
    for i, ((_, kind), text) in enumerate(zip(tokens, texts, strict=True)):
        if kind == duckdb.token_type.operator and "*" in text:
            alone = text == "*" and 0 < i < len(texts) - 1
            if not (alone and texts[i - 1] == "(" and texts[i + 1] == ")"):
                return None
        elif kind in (duckdb.token_type.identifier, duckdb.token_type.keyword):
            word = text[1:-1].replace('""', '"') if text.startswith('"') else text
            words.add(word.lower())
    return None if words & _EVERY else words


def file_columns(columns: Sequence[str]) -> list[str]:
    """The columns to read from the files for `columns` (``date`` comes from the file's path;
    with none named, ``call_id``: the rows must be there to be counted)."""
    return [c for c in columns if c != "date"] or ["call_id"]


def run(
    con: duckdb.DuckDBPyConnection,
    registered: Mapping[str, Any],
    rows: pa.Table,
    columns: Sequence[str],
    sql: str,
) -> tuple[duckdb.DuckDBPyConnection, duckdb.DuckDBPyRelation]:
    """`sql` run by DuckDB over `rows` (`file_columns` of `columns`, and the file column) in a
    cursor of `con`, whose ``calls`` view (with ``leaves`` and ``dims``) the cursor's own
    temporary views stand in for. `registered`: what `con`'s views read that a cursor does
    not see (Python objects registered in `con`). Returns the cursor with the relation: it
    stays open while the relation is read. Raises DuckDB's error, `NOT_READ` among them."""
    expressions = []
    for name, kind, *_ in con.execute("DESCRIBE calls").fetchall():
        quoted = '"' + str(name).replace('"', '""') + '"'  # a file may add columns: any name
        if name not in columns:
            said = f"{NOT_READ} ({name})".replace("'", "''")
            expressions.append(f"CAST(error('{said}') AS {kind}) AS {quoted}")
        elif name == "date":
            expressions.append(f"CAST({DATE_FROM_PATH} AS {kind}) AS date")
        else:
            expressions.append(f"CAST({quoted} AS {kind}) AS {quoted}")
    cursor = con.cursor()
    try:
        for name, data in registered.items():
            cursor.register(name, data)
        cursor.register(_ROWS, rows)
        cursor.execute(
            f"CREATE TEMP VIEW calls AS SELECT {', '.join(expressions)} "
            f"FROM (SELECT *, {_FILE} AS filename FROM {_ROWS})"
        )
        cursor.execute(CALLS_DERIVED.replace("CREATE OR REPLACE VIEW", "CREATE TEMP VIEW"))
        return cursor, cursor.sql(sql)
    except BaseException:
        cursor.close()
        raise
