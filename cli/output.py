"""The CLI's single renderer: the only module that writes data to stdout.

Formats, chosen with ``-f/--format`` and never by whether stdout is a terminal:

- ``table`` (default): plain-text columns separated by two spaces, a header row and a dashed
  rule (both left out by ``--no-headers``); numeric columns are right-aligned; trailing spaces
  are trimmed; an empty result prints the header only. Columns are sized on the first
  1,024 rows (the first batch of a streamed result, as duckdb does); piped, a longer cell
  further down runs over its column, never cut. On a terminal (stdout a TTY, ``--wide`` off)
  the table fits the terminal's width: identifier columns left out, long cells shortened with
  ``…`` (`cli.fit` says how).
- ``json``: one array, written row by row, one object per line; an empty result prints ``[]``.
- ``jsonl``: one object per line; an empty result prints nothing.
- ``csv``: a header row (unless ``--no-headers``), RFC 4180 quoting, ``\\n`` line endings.

Every format streams: a result is read and written batch by batch, so its size is not bounded
by memory (``capture query`` hands over DuckDB's record batch reader).

Columns keep the order of the SELECT (duplicate names are kept as they are). Values follow one
rule per kind, the same in every command (`cli.cells`):

- null: ``null`` in json/jsonl and in table, an empty field in csv;
- NaN and infinities: ``null`` in json/jsonl (JSON has no such numbers) and inside nested
  values everywhere; ``nan``, ``inf``, ``-inf`` in table and csv cells;
- lists, structs and maps: JSON (``[2, 7]``, ``{"k": 1}``) in table and csv cells, JSON values
  in json/jsonl;
- bytes: base64 (RFC 4648, padded), everywhere;
- booleans: ``true``/``false``; decimals: exact text in table/csv, JSON numbers in json;
- dates and times: ISO 8601 text; durations: seconds (a number); DuckDB intervals: an object
  ``{"months", "days", "nanoseconds"}``;
- in table cells (and headers) newline, carriage return and tab are shown as ``\\n``, ``\\r``,
  ``\\t``, every other control, DEL and bidirectional override as ``\\xNN`` / ``\\uNNNN``
  (`capture.untrusted.printable`): a stored name cannot drive the terminal. Text reports
  (`write_text`) are escaped the same way, their newlines kept. json, jsonl and csv stay exact
  data when piped (click is told not to strip what looks like an ANSI style from them); on a
  terminal the same characters are written ``\\uNNNN``
  (`capture.untrusted.terminal_data`; in a JSON string, the same value).

Why not a table library: ``rich`` and ``tabulate`` were weighed against the terminal rules
(STYLE.md, "CLI conventions") and do not meet them. Both measure every row before writing the
first line (``rich.table.Table`` renders once all rows are added; ``tabulate`` returns the whole
table as one string), so a streamed result would be held in memory whole; here a table is
written batch by batch. rich fits a table by shrinking or folding every column to a width, piped
too (80 columns unless told), where the rules want piped output full and, on a terminal,
identifier columns left out first (`cli.fit`); tabulate does not fit at all. And rich reads
console markup in cell text (a stored ``"llama[bold]"`` prints ``llama``) unless every cell is
escaped, while a cell here is data. Kept: this module, `cli.fit` (the terminal's width) and
`cli.cells` (one rule per value kind).
"""

from __future__ import annotations

import csv
import io
import json
import operator
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Union, cast

import click

from capture import printable, printable_lines, terminal_data

from .cells import (
    Column,
    column_cells,
    column_json,
    dumps,
    is_numeric,
    to_json_value,
)
from .cells import width as cell_width
from .fit import Fit, cut, layout, stdout_is_terminal

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "FORMATS",
    "Fit",
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

Rows = Union["pa.Table", "pa.RecordBatchReader", Sequence[Mapping[str, Any]]]
"""A `pyarrow.Table`, a record batch reader (streamed), or a sequence of mappings (column name
-> value)."""

F = TypeVar("F", bound=Callable[..., Any])

_CHUNK_ROWS = 1024
_WINDOW = 1024
"""Rows a table's column widths are computed from (the rest streams through those widths)."""

_FULL = Fit()


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


# -- rows --------------------------------------------------------------------------------------
def _arrow_source(data: Any) -> Any:
    """The batches of a `pyarrow.Table` or record batch reader; None for Python rows."""
    pa = sys.modules.get("pyarrow")  # rows given as mappings need no pyarrow import
    if pa is not None and isinstance(data, pa.Table):
        return data.to_batches(max_chunksize=_CHUNK_ROWS)
    if pa is not None and isinstance(data, pa.RecordBatchReader):
        return data
    return None


def _batches(data: Rows) -> tuple[list[str], Iterator[list[Column]]]:
    """Column names (SELECT order) and the result's batches, each a list of columns."""
    source = _arrow_source(data)
    if source is not None:
        names = [str(n) for n in cast(Any, data).schema.names]

        def arrow_batches() -> Iterator[list[Column]]:
            for batch in source:
                if batch.num_rows:
                    yield list(batch.columns)

        return names, arrow_batches()
    rows = list(cast(Sequence[Mapping[str, Any]], data))
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(str(k) for k in row))
    names = list(seen)

    def python_batches() -> Iterator[list[Column]]:
        for start in range(0, len(rows), _CHUNK_ROWS):
            chunk = rows[start : start + _CHUNK_ROWS]
            yield [[row.get(n) for row in chunk] for n in names]

    return names, python_batches()


def _text(chunk: Sequence[str]) -> str:
    return "\n".join(chunk) + "\n" if chunk else ""


def _json_chunks(
    names: Sequence[str], batches: Iterator[list[Column]], array: bool
) -> Iterator[str]:
    keys = [f"{dumps(n)}: " for n in names]

    def objects(columns: list[Column]) -> list[str]:
        # Built by hand so that duplicate column names survive, in SELECT order.
        values = [column_json(c) for c in columns]
        return [
            "{" + ", ".join(map(operator.add, keys, row)) + "}" for row in zip(*values, strict=True)
        ]

    if not array:
        for columns in batches:
            yield _text(objects(columns))
        return
    # One row behind, so that every object but the last gets its comma on its own line.
    previous: str | None = None
    for columns in batches:
        lines = objects(columns)
        out = ["[" if previous is None else f"  {previous},"]
        out.extend(f"  {line}," for line in lines[:-1])
        previous = lines[-1]
        yield _text(out)
    yield "[]\n" if previous is None else f"  {previous}\n]\n"


def _csv_chunks(
    names: Sequence[str], batches: Iterator[list[Column]], headers: bool
) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if headers and names:
        writer.writerow(names)
    for columns in batches:
        writer.writerows(zip(*(column_cells(c, "") for c in columns), strict=True))
        if buffer.tell() > 65536:
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()
    if buffer.tell():
        yield buffer.getvalue()


def _length(columns: list[Column]) -> int:
    return len(columns[0]) if columns else 0


def _split(columns: list[Column], k: int) -> tuple[list[Column], list[Column]]:
    """The first `k` rows of a batch, and the others (Arrow arrays are sliced, not copied)."""
    if hasattr(columns[0], "slice"):  # Arrow arrays
        arrays = [cast(Any, c) for c in columns]
        return [a.slice(0, k) for a in arrays], [a.slice(k) for a in arrays]
    values = [cast(Sequence[Any], c) for c in columns]
    return [v[:k] for v in values], [v[k:] for v in values]


def _table_cells(columns: list[Column]) -> list[list[str]]:
    return [[printable(c) for c in column_cells(column, "null")] for column in columns]


def _pad(cells: Sequence[str], size: int, right: bool, limit: bool, keep_end: bool) -> list[str]:
    out = []
    for text in cells:
        if text.isascii():
            if limit and len(text) > size:
                text = cut(text, size, keep_end)
            out.append(text.rjust(size) if right else text.ljust(size))
            continue
        if limit:
            text = cut(text, size, keep_end)
        pad = " " * max(0, size - cell_width(text))
        out.append(pad + text if right else text + pad)
    return out


def _table_chunks(
    names: Sequence[str],
    batches: Iterator[list[Column]],
    headers: bool,
    fit: Fit,
    indent: str = "",
) -> Iterator[str]:
    """The table, batch by batch; columns sized on the first `_WINDOW` rows (module docstring)."""
    if not names:
        return
    window: list[list[list[str]]] = []
    numeric: list[bool | None] = [None] * len(names)
    rows = 0
    rest: list[Column] | None = None
    for columns in batches:
        if rows + _length(columns) > _WINDOW:  # a streamed batch holds 8,192 rows: split it
            columns, rest = _split(columns, _WINDOW - rows)
        for i, column in enumerate(columns):
            kind = is_numeric(column)
            if kind is not None:
                numeric[i] = kind and numeric[i] is not False
        window.append(_table_cells(columns))
        rows += _length(columns)
        if rows >= _WINDOW:
            break
    header = [printable(n) for n in names]
    natural = [
        max(
            [cell_width(header[i]) if headers else 0]
            + [cell_width(c) for cells in window for c in cells[i]]
        )
        for i in range(len(names))
    ]
    right = [bool(n) for n in numeric]
    available = None if fit.width is None else fit.width - len(indent)
    fixed = [r or n in fit.whole for r, n in zip(right, names, strict=True)]
    plan = layout(
        names,
        natural,
        fixed,
        available,
        hide=fit.hide,
        keep_end=fit.keep_end,
        headers=headers,
        keep=fit.keep,
        drop_first=fit.drop_first,
    )
    if plan.dropped:
        click.echo(
            f"note: {len(plan.dropped)} column(s) left out to fit the terminal: "
            f"{printable(', '.join(plan.dropped))} (--wide shows them)",
            err=True,
        )

    def lines(cells: list[list[str]]) -> list[str]:
        padded = [
            _pad(cells[i], size, right[i], plan.limit, k in plan.keep_end)
            for k, (i, size) in enumerate(zip(plan.shown, plan.widths, strict=True))
        ]
        return [indent + "  ".join(parts).rstrip() for parts in zip(*padded, strict=True)]

    if headers:
        yield _text(
            lines([[h] for h in header]) + [indent + "  ".join("-" * w for w in plan.widths)]
        )
    for cells in window:
        yield _text(lines(cells))
    if rest is not None:
        yield _text(lines(_table_cells(rest)))
    for columns in batches:
        yield _text(lines(_table_cells(columns)))


# -- writers ---------------------------------------------------------------------------------
def _chunks(data: Rows, fmt: str, headers: bool, fit: Fit) -> Iterator[str]:
    names, batches = _batches(data)
    if fmt == "table":
        return _table_chunks(names, batches, headers, fit)
    if fmt in ("json", "jsonl"):
        return _json_chunks(names, batches, array=fmt == "json")
    if fmt == "csv":
        return _csv_chunks(names, batches, headers)
    raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")


def render(data: Rows, fmt: str = "table", *, headers: bool = True, fit: Fit = _FULL) -> None:
    """Writes rows to stdout in one of `FORMATS`, batch by batch.

    Args:
        data: A `pyarrow.Table` or `pyarrow.RecordBatchReader` (column order kept, read batch
            by batch), or a sequence of mappings (columns in order of first appearance).
        fmt: ``table``, ``json``, ``jsonl`` or ``csv``.
        headers: Write the header row (table and csv; json and jsonl have none).
        fit: How a table fits the terminal (`cli.fit.Fit`: the width from
            `cli.fit.terminal_width`, the identifier columns); the other formats ignore it.

    Raises:
        ValueError: `fmt` is not one of `FORMATS`.
        click.UsageError: ``headers=False`` with json or jsonl (see `check_headers`).

    Example:
        >>> render([{"model": "toy", "shape": [2, 7]}], "jsonl")
        {"model": "toy", "shape": [2, 7]}
    """
    check_headers(fmt, not headers)
    data_format = fmt != "table"
    shown = terminal_data if data_format and stdout_is_terminal() else None
    for chunk in _chunks(data, fmt, headers, fit):
        # color=True: click would strip what looks like an ANSI style from data piped
        click.echo(chunk if shown is None else shown(chunk), nl=False, color=data_format)


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
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, indent=2)
    elif fmt == "jsonl":
        text = dumps(value)
    else:
        raise ValueError(f"a document renders as json or jsonl, not {fmt!r}")
    click.echo(terminal_data(text) if stdout_is_terminal() else text, color=True)


def write_text(text: str, *, data: bool = False) -> None:
    """Writes text (a report, Python source) to stdout, ending it with one newline.

    A report's control characters are always escaped (`capture.untrusted.printable_lines`); a
    data format (`data`: JSON, Python source) is exact when piped, written
    with ``\\uNNNN`` escapes on a terminal (`capture.untrusted.terminal_data`).

    Example:
        >>> write_text("dynamic_shapes = {}")
        dynamic_shapes = {}
    """
    text = text.rstrip("\n")
    if not data:
        text = printable_lines(text)
    elif stdout_is_terminal():
        text = terminal_data(text)
    click.echo(text, color=data)


def table_text(data: Rows, *, headers: bool = True, indent: str = "", fit: Fit = _FULL) -> str:
    """The table format of `render` as a string, for reports built of several tables.

    Args:
        data: As for `render`.
        headers: Write the header row and its rule.
        indent: Put before every line (and counted in `fit`'s width).
        fit: How the table fits the terminal (`cli.fit.Fit`).

    Returns:
        The lines, without a trailing newline.

    Example:
        >>> print(table_text([{"a": 1, "b": [2, 3]}]))
        a  b
        -  ------
        1  [2, 3]
    """
    names, batches = _batches(data)
    return "".join(_table_chunks(names, batches, headers, fit, indent)).rstrip("\n")
