"""The CLI's single renderer: the only module that writes data to stdout.

Formats, chosen with ``-f/--format`` and never by whether stdout is a terminal:

- ``table`` (default): plain-text columns separated by two spaces, a header row and a dashed
  rule (both left out by ``--no-headers``); numeric columns are right-aligned; trailing spaces
  are trimmed; an empty result prints the header only. It is the one format that reads the
  whole result before printing (to size the columns); the others stream.
- ``json``: one array, written row by row, one object per line; an empty result prints ``[]``.
- ``jsonl``: one object per line; an empty result prints nothing.
- ``csv``: a header row (unless ``--no-headers``), RFC 4180 quoting, ``\\n`` line endings.

Columns keep the order of the SELECT (duplicate names are kept as they are). Values follow one
rule per kind, the same in every command:

- null: ``null`` in json/jsonl and in table, an empty field in csv;
- NaN and infinities: ``null`` in json/jsonl (JSON has no such numbers) and inside nested
  values everywhere; ``nan``, ``inf``, ``-inf`` in table and csv cells;
- lists, structs and maps: JSON (``[2, 7]``, ``{"k": 1}``) in table and csv cells, JSON values
  in json/jsonl;
- bytes: base64 (RFC 4648, padded), everywhere;
- booleans: ``true``/``false``; decimals: exact text in table/csv, JSON numbers in json;
- dates and times: ISO 8601 text; durations: seconds (a number); DuckDB intervals: an object
  ``{"months", "days", "nanoseconds"}``;
- in table cells only, newline, carriage return and tab are shown as ``\\n``, ``\\r``, ``\\t``.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
import math
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Union

import click

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "FORMATS",
    "format_option",
    "no_headers_option",
    "check_headers",
    "render",
    "render_document",
    "write_text",
    "table_text",
    "to_json_value",
]

FORMATS = ("table", "json", "jsonl", "csv")
"""The values of ``-f/--format``; ``table`` is the default."""

Rows = Union["pa.Table", Sequence[Mapping[str, Any]]]
"""A `pyarrow.Table` or a sequence of mappings (column name -> value)."""

F = TypeVar("F", bound=Callable[..., Any])

_CHUNK_ROWS = 1024
_TABLE_ESCAPES = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def format_option(formats: Sequence[str] = FORMATS) -> Callable[[F], F]:
    """The ``-f/--format`` option, stored in the ``fmt`` parameter.

    Args:
        formats: The formats this command accepts; the first one is the default.

    Returns:
        A click decorator.

    Example:
        >>> @click.command()
        ... @format_option()
        ... def cmd(fmt: str) -> None:
        ...     render([{"a": 1}], fmt)
    """
    return click.option(
        "-f",
        "--format",
        "fmt",
        type=click.Choice(list(formats)),
        default=formats[0],
        show_default=False,
        help=f"Output format: {', '.join(formats)}. Default: {formats[0]}.",
    )


def no_headers_option(func: F) -> F:
    """The ``--no-headers`` flag, stored in the ``no_headers`` parameter.

    Example:
        >>> @click.command()
        ... @no_headers_option
        ... def cmd(no_headers: bool) -> None:
        ...     render([{"a": 1}], "csv", headers=not no_headers)
    """
    return click.option(
        "--no-headers",
        is_flag=True,
        default=False,
        help="Leave out the header row (table and csv formats). Default: headers shown.",
    )(func)


def check_headers(fmt: str, no_headers: bool) -> None:
    """Refuses ``--no-headers`` with json/jsonl, which have no header row (a usage error).

    Raises:
        click.UsageError: `no_headers` with ``-f json`` or ``-f jsonl`` (exit status 2).
    """
    if no_headers and fmt in ("json", "jsonl"):
        raise click.UsageError(
            f"--no-headers applies to the table and csv formats; -f {fmt} has no header row"
        )


# -- values ------------------------------------------------------------------------------------
def to_json_value(value: Any) -> Any:
    """Converts a value from a query result into plain JSON data (see the module docstring).

    Args:
        value: A Python value as pyarrow's ``to_pylist`` returns it.

    Returns:
        None, bool, int, float (finite), str, list or dict, recursively.

    Example:
        >>> to_json_value({"shape": [2, 7], "x": float("nan"), "b": b"\\x00\\xff"})
        {'shape': [2, 7], 'x': None, 'b': 'AP8='}
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            return None
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if type(value).__name__ == "MonthDayNano" and isinstance(value, tuple):
        months, days, nanoseconds = value
        return {"months": months, "days": days, "nanoseconds": nanoseconds}
    if isinstance(value, Mapping):
        return {_json_key(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    return str(value)


def _json_key(key: Any) -> str:
    converted = to_json_value(key)
    return converted if isinstance(converted, str) else json.dumps(converted)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _cell(value: Any, null: str) -> str:
    """A table/csv cell: scalars as text, nested values as JSON."""
    if value is None:
        return null
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (int, str)):
        return str(value)
    converted = to_json_value(value)
    return converted if isinstance(converted, str) else _dumps(converted)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool)


def _width(text: str) -> int:
    """Display width: East Asian wide characters count 2, combining marks 0."""
    if text.isascii():
        return len(text)
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
        for c in text
    )


# -- rows --------------------------------------------------------------------------------------
def _columns_and_rows(data: Rows) -> tuple[list[str], Iterator[Sequence[Any]]]:
    """Column names (SELECT order) and an iterator over row tuples, batch by batch."""
    import pyarrow as pa  # already loaded by whoever built the table; not needed for --help

    if isinstance(data, pa.Table):
        table = data
        names = [str(n) for n in table.column_names]

        def table_rows() -> Iterator[Sequence[Any]]:
            for batch in table.to_batches(max_chunksize=_CHUNK_ROWS):
                columns = [c.to_pylist(maps_as_pydicts="lossy") for c in batch.columns]
                yield from zip(*columns, strict=True)

        return names, table_rows()
    rows = list(data)
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(str(k) for k in row))
    names = list(seen)
    return names, (tuple(row.get(n) for n in names) for row in rows)


def _chunks(lines: Iterable[str]) -> Iterator[str]:
    """Groups lines into newline-terminated chunks so that large outputs stream cheaply."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) >= _CHUNK_ROWS:
            yield "\n".join(chunk) + "\n"
            chunk = []
    if chunk:
        yield "\n".join(chunk) + "\n"


def _json_object(names: Sequence[str], row: Sequence[Any]) -> str:
    # Built by hand so that duplicate column names survive, in SELECT order.
    fields = (f"{_dumps(n)}: {_dumps(to_json_value(v))}" for n, v in zip(names, row, strict=True))
    return "{" + ", ".join(fields) + "}"


def _json_lines(names: Sequence[str], rows: Iterator[Sequence[Any]]) -> Iterator[str]:
    # One row behind, so that every object but the last gets its comma on its own line.
    previous: str | None = None
    for row in rows:
        yield "[" if previous is None else f"  {previous},"
        previous = _json_object(names, row)
    if previous is None:
        yield "[]"
    else:
        yield f"  {previous}"
        yield "]"


def _csv_lines(names: Sequence[str], rows: Iterator[Sequence[Any]], headers: bool) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if headers and names:
        writer.writerow(names)
    for row in rows:
        writer.writerow([_cell(v, "") for v in row])
        if buffer.tell() > 65536:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()


def _table_lines(names: Sequence[str], rows: Iterator[Sequence[Any]], headers: bool) -> list[str]:
    raw = list(rows)
    cells = [[_cell(v, "null").translate(_TABLE_ESCAPES) for v in row] for row in raw]
    numeric = [
        any(row[i] is not None for row in raw)
        and all(row[i] is None or _is_number(row[i]) for row in raw)
        for i in range(len(names))
    ]
    header = [n.translate(_TABLE_ESCAPES) for n in names]
    widths = [
        max([_width(header[i]) if headers else 0] + [_width(row[i]) for row in cells])
        for i in range(len(names))
    ]

    def line(values: Sequence[str], align: Sequence[bool]) -> str:
        parts = []
        for text, width, right in zip(values, widths, align, strict=True):
            pad = " " * (width - _width(text))
            parts.append(pad + text if right else text + pad)
        return "  ".join(parts).rstrip()

    lines = []
    if headers and names:
        lines.append(line(header, numeric))
        lines.append(line(["-" * w for w in widths], [False] * len(widths)))
    lines.extend(line(row, numeric) for row in cells)
    return lines


# -- writers -----------------------------------------------------------------------------------
def render(data: Rows, fmt: str = "table", *, headers: bool = True) -> None:
    """Writes rows to stdout in one of `FORMATS`.

    Args:
        data: A `pyarrow.Table` (column order kept) or a sequence of mappings (columns in
            order of first appearance).
        fmt: ``table``, ``json``, ``jsonl`` or ``csv``.
        headers: Write the header row (table and csv; json and jsonl have none).

    Raises:
        ValueError: `fmt` is not one of `FORMATS`.
        click.UsageError: ``headers=False`` with json or jsonl (see `check_headers`).

    Example:
        >>> render([{"model": "toy", "shape": [2, 7]}], "jsonl")
        {"model": "toy", "shape": [2, 7]}
    """
    check_headers(fmt, not headers)
    names, rows = _columns_and_rows(data)
    if fmt == "table":
        chunks: Iterable[str] = _chunks(_table_lines(names, rows, headers))
    elif fmt == "json":
        chunks = _chunks(_json_lines(names, rows))
    elif fmt == "jsonl":
        chunks = _chunks(_json_object(names, row) for row in rows)
    elif fmt == "csv":
        chunks = _csv_lines(names, rows, headers)
    else:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
    for chunk in chunks:
        click.echo(chunk, nl=False)


def render_document(document: Any, fmt: str) -> None:
    """Writes one JSON document (e.g. a summary): indented for json, one line for jsonl.

    Args:
        document: Data made of mappings, sequences and scalars (see `to_json_value`).
        fmt: ``json`` or ``jsonl``.

    Raises:
        ValueError: `fmt` is neither ``json`` nor ``jsonl``.

    Example:
        >>> render_document({"models": ["toy"]}, "jsonl")
        {"models": ["toy"]}
    """
    value = to_json_value(document)
    if fmt == "json":
        click.echo(json.dumps(value, ensure_ascii=False, allow_nan=False, indent=2))
    elif fmt == "jsonl":
        click.echo(_dumps(value))
    else:
        raise ValueError(f"a document renders as json or jsonl, not {fmt!r}")


def write_text(text: str) -> None:
    """Writes text (a report, Python source) to stdout, ending it with one newline.

    Example:
        >>> write_text("dynamic_shapes = {}")
        dynamic_shapes = {}
    """
    click.echo(text.rstrip("\n"))


def table_text(data: Rows, *, headers: bool = True, indent: str = "") -> str:
    """The table format of `render` as a string, for reports built of several tables.

    Example:
        >>> print(table_text([{"a": 1, "b": [2, 3]}]))
        a  b
        -  ------
        1  [2, 3]
    """
    names, rows = _columns_and_rows(data)
    return "\n".join(indent + line for line in _table_lines(names, rows, headers))
