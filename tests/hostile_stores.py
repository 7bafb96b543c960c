"""Hostile stores for the command matrix (tests/test_hostile_commands.py): each planter breaks
one thing in a copy of a real recorded store, the way a crafted or damaged store would."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from capture import schema


def files(store: Path, table: str) -> list[Path]:
    return sorted(p for p in (store / table).rglob("*.parquet") if not p.name.startswith("."))


def rewrite(
    path: Path, change: Callable[[pa.Table], pa.Table], nullable: str = "", **write: Any
) -> None:
    """Rewrites a store file with `change` applied, its footer metadata kept (`write`:
    `pq.write_table`'s options, such as ``row_group_size`` or ``write_statistics``)."""
    table = pq.read_table(path)
    meta = table.schema.metadata
    new = change(table)
    if nullable:  # the column as a foreign writer would declare it
        i = new.schema.get_field_index(nullable)
        new = new.cast(new.schema.set(i, new.schema.field(i).with_nullable(True)))
    pq.write_table(new.replace_schema_metadata(meta), path, **write)


def _column(path: Path, column: str, values: list[object], nullable: bool = False) -> None:
    def change(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(column)
        field = t.schema.field(i).with_nullable(True) if nullable else t.schema.field(i)
        array = pa.array(values * t.num_rows if len(values) == 1 else values, field.type)
        return t.set_column(i, field, array)

    rewrite(path, change)


def null_in_dims(store: Path) -> Path:
    path = files(store, schema.CALLS)[0]
    _column(path, "dims", [[None, 3]])
    return path


def null_dims_list(store: Path) -> Path:
    path = files(store, schema.CALLS)[0]
    _column(path, "dims", [None], nullable=True)
    return path


def negative_dim_offset(store: Path) -> Path:
    path = files(store, schema.STRUCTURES)[0]
    _column(path, "dim_offset", [-5])
    return path


def dim_offset_past_the_sizes(store: Path) -> Path:
    path = files(store, schema.STRUCTURES)[0]
    _column(path, "dim_offset", [50])
    return path


def negative_calls(store: Path) -> Path:
    path = files(store, schema.STATS)[0]
    _column(path, "calls", [-5])
    return path


def truncated_calls_file(store: Path) -> Path:
    path = files(store, schema.CALLS)[0]
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def foreign_parquet(store: Path) -> Path:
    path = files(store, schema.CALLS)[0].parent / "foreign.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), path)
    return path


def wrong_schema_stats(store: Path) -> Path:
    path = files(store, schema.STATS)[0]
    rewrite(
        path,
        lambda t: t.set_column(
            t.schema.get_field_index("calls"), "calls", pa.array(["x"] * t.num_rows)
        ),
    )
    return path


def newer_schema_version(store: Path) -> Path:
    path = files(store, schema.CALLS)[0]
    table = pq.read_table(path)
    meta = dict(table.schema.metadata or {})
    meta[schema.METADATA_SCHEMA_VERSION] = str(schema.SCHEMA_VERSION + 1).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)
    return path


def planted_claim(store: Path) -> Path:
    """A file claiming to replace every calls file beside it, holding none of their rows."""
    victims = files(store, schema.CALLS)
    path = victims[0].parent / "zz-planted.parquet"
    table = pq.read_table(victims[0]).slice(0, 0)
    meta = dict(table.schema.metadata or {})
    meta[b"capture.replaces"] = json.dumps([p.name for p in victims]).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)
    return path


def link_out_of_the_store(store: Path) -> Path:
    target = store.parent / "outside.parquet"
    target.write_bytes(files(store, schema.CALLS)[0].read_bytes())
    path = files(store, schema.CALLS)[0].parent / "link.parquet"
    os.symlink(target, path)
    return path


def glob_file_name(store: Path) -> Path:
    source = files(store, schema.CALLS)[0]
    path = source.parent / "*.parquet"
    path.write_bytes(source.read_bytes())
    return path


def malformed_signature(store: Path) -> Path:
    for path in files(store, schema.STRUCTURES):
        _column(path, "signature", ["[1, 2]"])
    return files(store, schema.STRUCTURES)[0]


def treespec_naming_a_module(store: Path) -> Path:
    for path in files(store, schema.STRUCTURES):
        _column(
            path, "treespec", ['[1, {"type": "os.system", "context": "null", "children_spec": []}]']
        )
    return files(store, schema.STRUCTURES)[0]


DEEP = "[" * 5000 + "]" * 5000
"""JSON nested far deeper than Python's recursion limit (a reader that recursed would crash)."""


def deep_signature(store: Path) -> Path:
    for path in files(store, schema.STRUCTURES):
        _column(path, "signature", [DEEP])
    return files(store, schema.STRUCTURES)[0]


def deep_treespec(store: Path) -> Path:
    for path in files(store, schema.STRUCTURES):
        _column(path, "treespec", ["[1, " + "[" * 300 + "]" * 300 + "]"])
    return files(store, schema.STRUCTURES)[0]


def deep_replaces(store: Path) -> Path:
    """A stats file whose ``capture.replaces`` claim is one deeply nested list."""
    source = files(store, schema.STATS)[0]
    path = source.parent / "zz-deep.parquet"
    table = pq.read_table(source).slice(0, 0)
    meta = dict(table.schema.metadata or {})
    meta[b"capture.replaces"] = DEEP.encode()
    pq.write_table(table.replace_schema_metadata(meta), path)
    return path


CONTROL = "\x1b]0;title\x07\x1b]52;c;ZXZpbA==\x07\x1b[2J\u202e\r\b\x9b"
"""A window title, a clipboard write (OSC 52), a screen clear, a right-to-left override, a
carriage return, a backspace and a C1 CSI: what a name must never carry raw to a terminal."""


def control_characters_in_names(store: Path) -> Path:
    """Model and argument names carrying `CONTROL`, and a file named with it."""
    for table in schema.TABLES:
        for path in files(store, table):
            _column(path, "model", ["add" + CONTROL])
    for path in files(store, schema.STRUCTURES):
        rows = pq.read_table(path).num_rows
        _column(path, "argument", [f"x{CONTROL}{i}" for i in range(rows)])
    source = files(store, schema.CALLS)[0]
    named = source.parent / f"name{CONTROL}.parquet"
    named.write_bytes(source.read_bytes())
    return named


PLANTERS: dict[str, Callable[[Path], Path]] = {
    f.__name__: f
    for f in (
        null_in_dims,
        null_dims_list,
        negative_dim_offset,
        dim_offset_past_the_sizes,
        negative_calls,
        truncated_calls_file,
        foreign_parquet,
        wrong_schema_stats,
        newer_schema_version,
        planted_claim,
        link_out_of_the_store,
        glob_file_name,
        malformed_signature,
        treespec_naming_a_module,
        deep_signature,
        deep_treespec,
        deep_replaces,
        control_characters_in_names,
    )
}
"""Every hostile store of the matrix, by name."""

CORRUPT = {
    "null_in_dims": "a null in its dims",
    "null_dims_list": "a null in its dims",
    "negative_dim_offset": "a negative value in its dim_offset column",
    "negative_calls": "a negative value in its calls column",
    "deep_signature": "JSON nested deeper than 200 levels in its signature",
    "deep_treespec": "JSON nested deeper than 200 levels in its treespec",
    "deep_replaces": "its capture.replaces holds JSON nested deeper than 200 levels",
}
"""The stores whose values no writer writes: what the error says of the file."""
