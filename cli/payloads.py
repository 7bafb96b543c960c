"""`capture payloads`: list or delete the sampled real calls a store keeps (payload files).

Imports pyarrow only, never torch, duckdb or safetensors.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import click
import pyarrow as pa

from capture import check_folder

from .fit import Fit, terminal_width, wide_option
from .flags import model_option
from .main import store_path
from .output import format_option, no_headers_option, render

__all__ = ["payloads_command"]

_SUMMARY = pa.schema(
    [("model", pa.string()), ("date", pa.string()), ("files", pa.int64()), ("bytes", pa.int64())]
)


def _summary(files: Iterable[Any]) -> pa.Table:
    """One row per model and day: files and bytes."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for p in files:
        row = rows.setdefault(
            (p.model_name, p.date), {"model": p.model_name, "date": p.date, "files": 0, "bytes": 0}
        )
        row["files"] += 1
        row["bytes"] += p.size
    return pa.Table.from_pylist(list(rows.values()), schema=_SUMMARY)


@click.command("payloads")
@model_option("Only this model's payloads. Default: every model.")
@click.option(
    "--delete-before",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    default=None,
    metavar="YYYY-MM-DD",
    help="Delete the payloads of days (UTC) before this date. Default: delete nothing.",
)
@click.option("--delete-all", is_flag=True, help="Delete every payload (of --model). Default: off.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="With a delete option: only list what it would delete. Default: off.",
)
@format_option()
@no_headers_option
@wide_option
@click.pass_context
def payloads_command(
    ctx: click.Context,
    model_name: str | None,
    delete_before: dt.datetime | None,
    delete_all: bool,
    dry_run: bool,
    fmt: str,
    no_headers: bool,
    wide: bool,
) -> None:
    """List or delete the real calls kept with Recorder(payloads=...).

    Payload files hold the real tensors of a sampled few calls: user
    data. Without a delete option this lists them per model and day
    (files, bytes). --delete-before and --delete-all delete files and
    list what they deleted (--dry-run: what they would delete).

    \b
    Example:
      capture payloads
      capture payloads --delete-before 2026-11-01
      capture payloads --model LlamaForCausalLM --delete-all --dry-run
    """
    from capture import delete_payloads, list_payloads

    if delete_before is not None and delete_all:
        raise click.UsageError("--delete-before and --delete-all exclude each other; pick one")
    if dry_run and delete_before is None and not delete_all:
        raise click.UsageError("--dry-run needs --delete-before or --delete-all")
    store = store_path(ctx)
    if delete_before is None and not delete_all:
        files = list_payloads(store, model_name)
    else:
        if not dry_run:  # a read-only store: one line before any file is listed
            check_folder(store, option="--store", created=False)
        before = delete_before.date() if delete_before is not None else None
        files = delete_payloads(store, before=before, model_name=model_name, dry_run=dry_run)
        verb = "would delete" if dry_run else "deleted"
        total = sum(p.size for p in files)
        click.echo(f"{verb} {len(files)} payload file(s), {total:,} bytes", err=True)
    render(_summary(files), fmt, headers=not no_headers, fit=Fit(terminal_width(wide)))
