"""`capture check ARTIFACT`: does a saved artifact serve the traffic recorded in the store?

The nightly drift check of the export job. The artifact's manifest (`replay.runtime.pt2.loading`, or
an ONNX set's, `replay.runtime.ort.manifest`: the same guard entries, `replay.loader`) says,
per program, the recorded call structure it takes and the recorded ranges of its dims
(`replay.runtime.guards`); the store says what the model received in the window. Every distinct
recorded signature (input structure + sizes) of the window is checked against the programs in
order, with the same guards as the runner `replay.load` returns, so a signature reported served
is one the runner serves.

The model's code is not needed: the artifact is validated by the loader's own validation
(`replay.validation.validate`), in full but without running a program: every file
against the manifest's digests, the weights included, the operators the programs call, and
everything `replay.load` reads (torch deserializes a ``.pt2``'s programs, onnxruntime opens an
ONNX set's sessions), so an artifact the runner would refuse is an error here too, with the same
message; the store is read through DuckDB.

Exit status: 0 every call of the window is served (or the window is empty, said on stderr);
3 some calls are not served (the table says which and why); 1 an error (no artifact, not an
artifact, no store, unknown model, a bad date).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, timezone
from typing import TYPE_CHECKING

import click

from .fit import Fit, terminal_width, wide_option
from .flags import model_option
from .main import store_path
from .output import format_option, no_headers_option, render

if TYPE_CHECKING:
    from replay import DriftRow

__all__ = ["check_command", "EXIT_NOT_SERVED", "parse_since"]

EXIT_NOT_SERVED = 3
"""Exit status when some calls of the window are not served by the artifact."""


def parse_since(text: str | None) -> datetime | None:
    """``2026-11-20`` (midnight UTC) or an ISO timestamp, as an aware UTC datetime.

    Raises:
        click.BadParameter: Not a date.

    Example:
        >>> parse_since("2026-11-20").isoformat()
        '2026-11-20T00:00:00+00:00'
    """
    if text is None:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
        moment = datetime.fromisoformat(text)
    except ValueError as e:
        raise click.BadParameter(
            f"{text!r} is not a date (YYYY-MM-DD) or an ISO timestamp", param_hint="'--since'"
        ) from e
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _refuse_folder(artifact: str, store: str) -> None:
    """A folder is no artifact: say whether it is a store (``capture check capture-store``)."""
    from pathlib import Path

    from capture import schema

    folder = Path(artifact)
    if not folder.is_dir():
        return
    if any((folder / table).is_dir() for table in schema.TABLES):
        raise click.ClickException(
            f"{artifact} is a store, not an artifact; pass the .pt2 that capture export --out "
            f"wrote, and the store before the command: capture --store {artifact} check MODEL.pt2"
        )
    raise click.ClickException(
        f"{artifact} is a folder, not an artifact; pass the .pt2 that capture export --out wrote"
        f" (the store is {store}, set with capture --store)"
    )


def _summary(rows: Sequence[DriftRow]) -> str:
    calls = sum(r.calls for r in rows)
    served_calls = sum(r.calls for r in rows if r.served)
    served = sum(1 for r in rows if r.served)
    return f"served: {served} of {len(rows)} recorded signatures, {served_calls} of {calls} calls"


@click.command("check")
@click.argument("artifact", metavar="ARTIFACT")
@click.option(
    "--since",
    metavar="DATE",
    default=None,
    help="Only calls recorded at or after DATE (YYYY-MM-DD, midnight UTC, or an ISO "
    "timestamp). Default: every call in the store.",
)
@model_option(
    "The model's name in the store, when it differs from the artifact's (sub-modules "
    "are NAME.<sub-module>). Default: the name in the artifact's manifest."
)
@click.option(
    "--allow-ops",
    "allow_ops",
    metavar="NAME",
    multiple=True,
    help="An operator namespace, operator or overload (mylib, aten.bincount, "
    "mylib.op.default; an ONNX domain for an ONNX set) the programs may call beyond the "
    "model's math, as replay.load(path, allow_ops=[...]) allows it. Repeat for several. "
    "Default: none (the model's math only).",
)
@format_option()
@no_headers_option
@wide_option
@click.pass_context
def check_command(
    ctx: click.Context,
    artifact: str,
    since: str | None,
    model_name: str | None,
    allow_ops: tuple[str, ...],
    fmt: str,
    no_headers: bool,
    wide: bool,
) -> None:
    """Check that a saved artifact serves the calls recorded in the store.

    ARTIFACT is what `capture export --out` wrote: a .pt2 artifact (or
    ExportResult.save's), or the PATH.onnx of an ONNX set (its PATH.onnx.json
    manifest is read). It is validated by replay.load's own validation, in
    full but without running a program (every file against the manifest's
    digests, weights included; the operators the programs call; every entry,
    the manifest, the programs read by torch or opened by onnxruntime), so an
    artifact the runner would refuse is an error here too. Every distinct recorded signature (call
    structure and sizes) of the window is routed as the runner routes it: the
    recorded structure, every dim within the range the export was checked on,
    not a signature the export's check failed. One row per signature (model,
    group serving it, signature, calls, served, reason) goes to stdout; the
    totals go to stderr. The model's code is not needed.

    Exit status: 0 every call of the window is served (an empty window says so
    on stderr); 3 some calls are not served (rows with served=false say why:
    a dim outside its recorded range, a new call structure); 1 an error (no
    artifact or not one, a changed or damaged artifact, no store, unknown
    model, a bad --since).

    \b
    Example:
      capture check model.pt2
      capture check model.onnx
      capture --store s3://bucket/prod check model.pt2 --since 2026-11-20 -f json
    """
    import capture
    import replay

    _refuse_folder(artifact, store_path(ctx))
    manifest = replay.validate(artifact, allow_ops=allow_ops, verify_weights=True).manifest
    moment = parse_since(since)
    with capture.open_store(store_path(ctx)) as store:
        rows = replay.check_rows(store, manifest, moment, model_name)
    # One model (the usual case): its column says nothing on a terminal.
    one_model = ("model",) if len({r.model_name for r in rows}) == 1 else ()
    table = [r.to_json() for r in rows]
    if len({r.state for r in rows}) < 2:  # one state (the usual case): its column says nothing
        for item in table:
            del item["state"]
    render(table, fmt, headers=not no_headers, fit=Fit(terminal_width(wide), hide=one_model))
    if not rows:
        window = f" since {since}" if since else ""
        click.echo(f"no recorded calls{window}: nothing to check", err=True)
        return
    click.echo(_summary(rows), err=True)
    if not all(r.served for r in rows):
        ctx.exit(EXIT_NOT_SERVED)
