"""`capture query`, `capture summary`, `capture dims`: thin commands over `capture.Store`.

Nothing here imports torch: the store is read through DuckDB and pyarrow only, and those are
imported when a command runs, not when its ``--help`` is shown. Library errors
(`capture.errors.CaptureError`) are turned into one-line messages with exit status 1 by the
command group (`cli.main.CaptureGroup`).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from .fit import Fit, constant_columns, terminal_width, wide_option
from .flags import model_option
from .main import store_path
from .output import (
    check_headers,
    format_option,
    no_headers_option,
    render,
    render_document,
    write_text,
)

if TYPE_CHECKING:
    from capture.store_api import Store

__all__ = ["query_command", "summary_command", "dims_command", "parse_value"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INT = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT = re.compile(r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?\Z")

_DIMS_IDS = ("structure_id", "leaf", "argument")
"""What a script joins `capture dims` on, not what a person reads (the path says it all)."""

_DIMS_LAST = ("dynamic", "calls", "distinct")
"""Left out first on a narrow terminal, before a group, symbol or expression is shortened:
``dynamic`` says what ``symbol`` does (null: static), ``calls`` is the group's count."""

_PATHS = ("path",)
"""Columns of key paths: shortened on a terminal, they keep their end (``…_cache[0]``)."""


def parse_value(text: str) -> int | float | str:
    """The value of ``-p NAME VALUE``: an int if it is an integer literal, else a float if it
    is a decimal literal, else the text itself.

    Only plain literals are numbers (``5``, ``-3``, ``2.5``, ``1e-3``); ``nan``, ``inf``,
    ``1_000`` and ``0x10`` stay strings, and so does everything else. A value in single
    quotes is the string between them, whatever it looks like: ``"'007'"`` binds ``'007'``.

    Args:
        text: The VALUE as typed.

    Returns:
        The value DuckDB binds to ``$NAME``.

    Example:
        >>> [parse_value(v) for v in ("8", "-2", "0.5", "1e3", "nan", "toy", "'007'")]
        [8, -2, 0.5, 1000.0, 'nan', 'toy', '007']
    """
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1]
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    return text


def _bind(params: Sequence[tuple[str, str]]) -> dict[str, int | float | str]:
    bound: dict[str, int | float | str] = {}
    for name, value in params:
        if not _NAME.match(name):
            raise click.BadParameter(
                f"{name!r} is not a parameter name; use a plain identifier, e.g. -p n 8 for $n",
                param_hint="'-p' / '--param'",
            )
        if name in bound:
            raise click.BadParameter(
                f"${name} is given twice; pass each parameter once",
                param_hint="'-p' / '--param'",
            )
        bound[name] = parse_value(value)
    return bound


@contextmanager
def _open_store(ctx: click.Context, unsafe_sql: bool = False) -> Iterator[Store]:
    from capture.store_api import open_store  # duckdb + pyarrow: only when a command runs

    with open_store(store_path(ctx), unsafe_sql=unsafe_sql) as store:
        yield store


@click.command("query")
@click.argument("sql", metavar="SQL")
@click.option(
    "-p",
    "--param",
    "params",
    nargs=2,
    multiple=True,
    metavar="NAME VALUE",
    help="Bind $NAME in the SQL to VALUE (an int if it parses as one, else a float, else a "
    "string; in single quotes always the string inside, e.g. -p h \"'007'\"); repeatable. "
    "Default: no parameters.",
)
@click.option(
    "--unsafe-sql",
    is_flag=True,
    default=False,
    help="Let the SQL reach beyond the store: read and write other files and URLs (read_csv, "
    "COPY ... TO, ATTACH), install and load extensions, change settings. Only for SQL you "
    "trust. Default: off (the SQL reads the store's views and nothing else).",
)
@format_option()
@no_headers_option
@wide_option
@click.pass_context
def query_command(
    ctx: click.Context,
    sql: str,
    params: tuple[tuple[str, str], ...],
    unsafe_sql: bool,
    fmt: str,
    no_headers: bool,
    wide: bool,
) -> None:
    """Run SQL over the recorded calls and print the result.

    SQL is DuckDB SQL over the store's views: calls (one row per call),
    leaves (one row per call and argument leaf, with its shape), dims (one row
    per call, tensor and axis), structures, stats and signatures. Pass - as
    SQL to read it from stdin. Parameters given with -p are bound by DuckDB,
    never pasted into the SQL. Unreadable store files are skipped with a
    warning on stderr. The SQL reads the store's views and nothing else
    (no other file, URL, extension or setting) unless --unsafe-sql.
    Rows are printed as DuckDB produces them, in every format: a result of
    any size streams (a table's columns are sized on its first 1,024 rows).

    \b
    Example:
      capture query "SELECT model, count(*) AS calls FROM calls GROUP BY model"
      capture query 'SELECT path, shape FROM leaves WHERE shape[1] > $n' -p n 2 -f json
      echo "SELECT * FROM signatures" | capture query - -f csv
    """
    check_headers(fmt, no_headers)
    if sql == "-":
        sql = sys.stdin.read()
    if not sql.strip():
        raise click.BadParameter("the SQL is empty", param_hint="'SQL'")
    bound = _bind(params)
    with _open_store(ctx, unsafe_sql) as store:
        rows = store.stream(sql, bound)
        render(rows, fmt, headers=not no_headers, fit=Fit(terminal_width(wide), keep_end=_PATHS))


@click.command("summary")
@model_option()
@click.option(
    "--artifact",
    metavar="PATH",
    default=None,
    help="Also show which programs of this saved artifact (capture export --out PATH.pt2, "
    "or PATH.onnx for an ONNX set) "
    "serve each call group: its regimes, where torch.export cut the group, and groups served "
    "by another group's program with an input filled. Default: the store alone.",
)
@format_option(("table", "json", "jsonl"))
@wide_option
@click.pass_context
def summary_command(
    ctx: click.Context, model_name: str | None, artifact: str | None, fmt: str, wide: bool
) -> None:
    """Summarize what the store recorded, per model.

    Shows, for each model: how many calls were recorded and when, the call
    groups (calls sharing one input structure), the inputs that are sometimes
    missing or None, and the dynamic dims. With --artifact, also the programs
    of a saved artifact serving each group (regimes, merged groups). The table
    format is a report for people; json and jsonl print the same data as one
    JSON document.

    \b
    Example:
      capture summary
      capture summary --model LlamaForCausalLM -f json
      capture summary --artifact model.pt2
    """
    manifest = None
    if artifact is not None:
        from replay.loader import read_any_manifest

        manifest = read_any_manifest(artifact)
    with _open_store(ctx) as store:
        data = store.summary(model_name)
    if manifest is not None:
        from replay.runtime.routes import routes

        models = tuple(
            dataclasses.replace(m, programs=tuple(routes(manifest, m)))
            if m.model_name == manifest.model_name
            else m
            for m in data.models
        )
        data = dataclasses.replace(data, models=models)
    if fmt == "table":
        from .summary_table import summary_report

        write_text(summary_report(data, terminal_width(wide)))
    else:
        render_document(data.to_json(), fmt)


@click.command("dims")
@model_option()
@click.option(
    "--python",
    "as_python",
    is_flag=True,
    default=False,
    help="Print the dynamic_shapes for torch.export as Python source to paste, instead of the "
    "table (not combinable with -f or --no-headers). Default: off.",
)
@click.option(
    "--spec",
    type=click.Choice(["dims", "shapes"]),
    default="dims",
    help="With --python: torch.export.Dim objects (dims), or torch's ShapesSpec (shapes, "
    "torch >= 2.14) with recorded ranges, optimization hints and divisibility assumptions. "
    "Default: dims.",
)
@format_option()
@no_headers_option
@wide_option
@click.pass_context
def dims_command(
    ctx: click.Context,
    model_name: str | None,
    as_python: bool,
    spec: str,
    fmt: str,
    no_headers: bool,
    wide: bool,
) -> None:
    """Show which input dimensions are dynamic, per model.

    One row per model, call group, tensor input and axis: whether the size
    varies across recorded calls, its min and max, how many distinct sizes
    were seen, and the symbol shared by dims that are always equal. --python
    prints the same information as the dynamic_shapes argument of
    torch.export.export. On a terminal the table leaves out structure_id,
    leaf, argument (and model, for one model) unless --wide.

    \b
    Example:
      capture dims
      capture dims --model LlamaForCausalLM -f csv
      capture dims --python
      capture dims --python --spec shapes
    """
    explicit_format = ctx.get_parameter_source("fmt") is not click.core.ParameterSource.DEFAULT
    if as_python and (explicit_format or no_headers):
        raise click.UsageError(
            "--python prints Python source; it takes neither -f/--format nor --no-headers"
        )
    check_headers(fmt, no_headers)
    if spec != "dims" and not as_python:
        raise click.UsageError("--spec chooses the form of --python; pass --python too")
    if as_python:
        from replay.inputs.source import dynamic_shapes_source

        with _open_store(ctx) as store:
            store.check_model(model_name)
            source = dynamic_shapes_source(store, model_name, spec=spec)
        write_text(source, data=True)
        return
    with _open_store(ctx) as store:
        table = store.dims(model_name)
    hide = _DIMS_IDS + constant_columns(table, ["model"])
    fit = Fit(terminal_width(wide), hide=hide, keep_end=_PATHS, drop_first=_DIMS_LAST)
    render(table, fmt, headers=not no_headers, fit=fit)
