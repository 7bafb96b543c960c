"""What a store file's Parquet schema says, worked out once per distinct schema.

Checking a footer (`capture.store.layout.read_footer`) asks its schema the same questions for
every file: is it the table's schema (`schema_problem`), exactly or with columns of another
version, and where are the columns the checks read statistics of (``call_id``, the sizes'
leaves). The thousands of files of one store share a handful of schemas, and the answers
depend on the schema alone: `facts` answers from a schema already seen when the file's schema
equals it (a comparison in C++, ~2 µs, where converting and checking it costs ~100 µs).
Imports pyarrow only.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from capture import schema
from capture.store import small_rows

__all__ = ["SchemaFacts", "checked_facts", "facts", "schema_problem", "width"]

_KEPT = 16
"""Distinct schemas remembered (a store has a few: one per store version and table)."""


@dataclass(frozen=True)
class SchemaFacts:
    """The answers of one Parquet schema, for one table and store version."""

    problem: str | None
    """Why it is not the table's schema (None: it is)."""
    exact: bool
    """Exactly the table's columns, in order."""
    names: str
    """The file's column names, comma-separated (files of one version share them)."""
    call_id: int
    """Index of the ``call_id`` column in the Arrow schema (-1: none)."""
    leaves: dict[str, int]
    """Parquet column index of the list elements of ``dims`` and ``out_dims``, when present."""
    widths: tuple[int | None, ...]
    """Bytes of one decoded value of each Parquet leaf column (None: a byte array, whose width
    only the column chunk's statistics tell): what `capture.store.layout`'s bomb check
    multiplies each chunk's value count by."""
    fields: dict[str, int]
    """Each Arrow column's index among the file's fields (what a read of one column names)."""
    pinnable: small_rows.Pinnable
    """(Parquet column, Arrow field) of the columns a small file's footer may pin to one value
    (`capture.store.small_rows`)."""


_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12}
"""Decoded bytes of one value per fixed-width Parquet physical type."""

_known: list[tuple[tuple[str, int, bytes | None], pq.ParquetSchema, SchemaFacts]] = []
_lock = threading.Lock()


def facts(meta: pq.FileMetaData, table: str, version: int) -> SchemaFacts:
    """The facts of a file's schema (`table`'s file of store `version`), remembered.

    The Arrow schema a file maps to is its Parquet schema read through the Arrow schema its
    writer stored (``ARROW:schema``: time zones, string widths): both must equal a known one.

    Raises:
        Exception: pyarrow's, when the schema cannot be mapped to Arrow.
    """
    # not `meta.schema`: that one is cached on the footer and refers back to it, a cycle that
    # keeps every footer read (several KB each) alive until the cycle collector runs
    parquet = pq.ParquetSchema(meta)
    key = (table, version, (meta.metadata or {}).get(b"ARROW:schema"))
    for known_key, known, found in _known:
        if known_key == key and known.equals(parquet):
            return found
    arrow = parquet.to_arrow_schema()
    problem = schema_problem(arrow, table, version)
    leaves = {}
    for column in ("dims", "out_dims"):
        path = f"{column}.list.element"
        index = next((j for j in range(len(parquet)) if parquet.column(j).path == path), None)
        if index is not None:
            leaves[column] = index
    found = SchemaFacts(
        problem,
        arrow.names == schema.SCHEMAS[table].names if table in schema.SCHEMAS else False,
        ",".join(arrow.names),
        arrow.get_field_index("call_id"),
        leaves,
        tuple(width(parquet.column(j).physical_type) for j in range(len(parquet))),
        {name: i for i, name in enumerate(arrow.names)},
        small_rows.candidates(parquet, arrow),
    )
    with _lock:
        if len(_known) >= _KEPT:
            del _known[0]
        _known.append((key, parquet, found))
    return found


def checked_facts(meta: pq.FileMetaData, table: str) -> SchemaFacts:
    """`facts` of a `table` file whose footer passed the reader's checks (its
    ``capture.schema_version`` is a number): remembered, so a lookup."""
    version = int((meta.metadata or {})[schema.METADATA_SCHEMA_VERSION])
    return facts(meta, table, version)


def width(physical_type: str) -> int | None:
    """Bytes of one decoded value of a Parquet physical type (None: a byte array)."""
    return _WIDTH.get(physical_type)


def schema_problem(found: pa.Schema, table: str, version: int) -> str | None:
    """Why `found` is not the schema of `table` in a file of store `version` (None when it is,
    extra columns allowed, columns added after `version` optional: `schema.ADDED_IN`)."""
    expected = schema.SCHEMAS[table]
    for field in expected:
        index = found.get_field_index(field.name)
        if index < 0 and schema.ADDED_IN.get((table, field.name), 0) > version:
            continue
        if index < 0:
            return f"not a {table} file of this store: it has no column {field.name!r}"
        if not found.field(index).type.equals(field.type):
            return (
                f"not a {table} file of this store: column {field.name!r} is "
                f"{found.field(index).type}, expected {field.type}"
            )
    return None
