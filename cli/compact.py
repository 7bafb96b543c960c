"""`capture compact`: merge a store's small files (see `capture.compact`).

Imports pyarrow when it runs, never torch or duckdb.
"""

from __future__ import annotations

import click

import capture
from capture import CaptureError, check_folder

from .flags import count_option
from .main import store_path
from .output import write_text
from .progress import Progress

__all__ = ["compact_command"]


@click.command("compact")
@count_option(
    "--target-rows",
    1_000_000,
    "Most calls per merged calls file; calls files this big already are left alone. "
    "Default: 1000000.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Only say what would be merged; change nothing. Default: off.",
)
@click.pass_context
def compact_command(ctx: click.Context, target_rows: int, dry_run: bool) -> None:
    """Merge the store's small Parquet files into big ones.

    A server that flushes every few seconds leaves thousands of small
    files, and every query pays for each file. This rewrites, per
    partition, the small calls files into files of up to N calls, and
    the stats and structures files into one file each (stats rows of
    one signature merged). No call is lost or counted twice, even for
    a reader that opens the store meanwhile: a merged file names the
    files it replaces, which readers then skip, and those are deleted
    once it is in place. Recorders may keep writing meanwhile. Open
    stores (a running `capture query`) must be reopened after it.

    \b
    Example:
      capture compact
      capture --store s3://bucket/capture compact --dry-run
    """
    if not dry_run:  # a read-only or full store: one line before any file is read
        check_folder(store_path(ctx), option="--store", created=False)
    with Progress("compact") as progress:  # on stderr, only when it is a terminal
        progress.phase("merging small files" if not dry_run else "listing files")
        result = capture.compact(store_path(ctx), target_rows=target_rows, dry_run=dry_run)
    lines = [
        f"{'would compact' if dry_run else 'compacted'} {store_path(ctx)} "
        f"(target {target_rows:,} calls per file)",
    ]
    width = max(len(t) for t in result.tables)
    for table, counts in result.tables.items():
        if dry_run and table != "calls":  # merged stats/structures rows: known once merged
            rows = f"{counts.rows_before:,} rows (merged count known after the run)"
        else:
            rows = f"{counts.rows_before:,} rows -> {counts.rows_after:,}"
        lines.append(
            f"  {table:<{width}}  {counts.files_before:,} files -> {counts.files_after:,}, {rows}"
        )
    if result.deleted_leftovers:
        lines.append(
            f"  {'would delete' if dry_run else 'deleted'} {result.deleted_leftovers} file(s) "
            "an earlier compaction had already replaced"
        )
    for path in result.unreadable:
        lines.append(f"  left alone (unreadable): {path}")
    for path in result.corrupt:
        lines.append(f"  left alone (corrupt): {path}")
    for claim in result.refused_claims:
        lines.append(f"  nothing deleted for: {claim}")
    write_text("\n".join(lines) + "\n")
    if result.corrupt:  # everything else was compacted; these need a person
        more = f" and {len(result.corrupt) - 1} more" if len(result.corrupt) > 1 else ""
        raise CaptureError(
            f"left {result.corrupt[0]}{more} as it is: move such a file out of the store or "
            "restore it from a copy"
        )
