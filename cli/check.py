"""`capture check ARTIFACT`: does a saved artifact serve the traffic recorded in the store?

The nightly drift check of the export job. The artifact's manifest (`replay.artifact`) says,
per program, the recorded call structure it takes and the recorded ranges of its dims
(`replay.guards`); the store says what the model received in the window. Every distinct
recorded signature (input structure + sizes) of the window is checked against the programs in
order, with the same guards as the runner `replay.load` returns, so a signature reported served
is one the runner serves.

Neither torch nor the model's code is needed: the manifest is JSON read from the zip archive,
the store is read through DuckDB.

Exit status: 0 every call of the window is served (or the window is empty, said on stderr);
3 some calls are not served (the table says which and why); 1 an error (no artifact, not an
artifact, no store, unknown model, a bad date).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, timezone
from typing import Any

import click

from cli.main import store_path
from cli.output import format_option, no_headers_option, render

__all__ = ["check_command", "EXIT_NOT_SERVED", "parse_since", "check_rows"]

EXIT_NOT_SERVED = 3
"""Exit status when some calls of the window are not served by the artifact."""

_CALLS = """
SELECT in_structure, dims, count(*) AS calls, min(ts) AS first_ts, max(ts) AS last_ts
FROM calls
WHERE model = $model AND error IS NULL AND ($since IS NULL OR ts >= $since)
GROUP BY in_structure, dims
ORDER BY min(ts), in_structure
"""

_STRUCTURES = """
SELECT structure_id, leaf, path, argument, kind, dtype, rank, value, dim_offset, treespec
FROM structures WHERE model = $model ORDER BY structure_id, leaf
"""


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


def check_rows(
    store: Any, manifest: dict[str, Any], since: datetime | None, model: str | None
) -> list[dict[str, Any]]:
    """One row per distinct recorded signature of the window, for every module of the artifact.

    Args:
        store: An open `capture.Store`.
        manifest: The artifact's manifest (`replay.artifact.read_manifest`).
        since: Only calls at or after this moment (None: every call).
        model: The model's name in the store when it differs from the artifact's.

    Returns:
        Rows with ``model, group, signature, calls, served, reason`` (``group``: the program
        serving the signature, or null; ``reason``: why each program refused it).
    """
    from replay.guards import ProgramGuard
    from replay.shapes import describe_sizes

    base = model or str(manifest["model"])
    rows: list[dict[str, Any]] = []
    for module in manifest["modules"]:
        name = f"{base}.{module}" if module else base
        store.check_model(name)
        guards = [
            ProgramGuard.from_manifest(e)
            for e in manifest["programs"]
            if e.get("module", "") == module
        ]
        leaves: dict[str, list[dict[str, Any]]] = {}
        for row in store.query(_STRUCTURES, {"model": name}).to_pylist():
            leaves.setdefault(row["structure_id"], []).append(row)
        calls = store.query(_CALLS, {"model": name, "since": since}).to_pylist()
        for call in calls:
            structure = leaves.get(call["in_structure"], [])
            treespec = structure[0]["treespec"] if structure else None
            dims = [int(v) for v in call["dims"]]
            served, reasons = None, []
            for guard in guards:
                if not guard.matches(treespec, structure, call["in_structure"]):
                    reasons.append(f"{guard.label}: different call structure")
                    continue
                failed = guard.check(dims)
                if failed is None:
                    served = guard.label
                    break
                reasons.append(f"{guard.label}: {failed}")
            rows.append(
                {
                    "model": name,
                    "group": served,
                    "signature": describe_sizes(structure, dims) if structure else "?",
                    "calls": int(call["calls"]),
                    "served": served is not None,
                    "reason": None if served else ("; ".join(reasons) or "no program"),
                }
            )
    return rows


def _summary(rows: Sequence[dict[str, Any]]) -> str:
    calls = sum(r["calls"] for r in rows)
    served_calls = sum(r["calls"] for r in rows if r["served"])
    served = sum(1 for r in rows if r["served"])
    return f"served: {served} of {len(rows)} recorded signatures, {served_calls} of {calls} calls"


@click.command("check")
@click.argument("artifact", metavar="ARTIFACT.pt2")
@click.option(
    "--since",
    metavar="DATE",
    default=None,
    help="Only calls recorded at or after DATE (YYYY-MM-DD, midnight UTC, or an ISO "
    "timestamp). Default: every call in the store.",
)
@click.option(
    "--model",
    metavar="NAME",
    default=None,
    help="The model's name in the store, when it differs from the artifact's (sub-modules "
    "are NAME.<sub-module>). Default: the name in the artifact's manifest.",
)
@format_option()
@no_headers_option
@click.pass_context
def check_command(
    ctx: click.Context,
    artifact: str,
    since: str | None,
    model: str | None,
    fmt: str,
    no_headers: bool,
) -> None:
    """Check that a saved artifact serves the calls recorded in the store.

    ARTIFACT.pt2 is what `capture export --out` (or ExportResult.save) wrote.
    Every distinct recorded signature (call structure and sizes) of the window
    is checked against the artifact's programs with the runner's own guards:
    the recorded structure, and every dim within the range the export was
    checked on. One row per signature (model, group serving it, signature,
    calls, served, reason) goes to stdout; the totals go to stderr. Neither
    torch nor the model's code is needed.

    Exit status: 0 every call of the window is served (an empty window says so
    on stderr); 3 some calls are not served (rows with served=false say why:
    a dim outside its recorded range, a new call structure); 1 an error (no
    artifact or not one, no store, unknown model, a bad --since).

    \b
    Example:
      capture check model.pt2
      capture --store s3://bucket/prod check model.pt2 --since 2026-11-20 -f json
    """
    import capture
    from replay.artifact import read_manifest

    manifest = read_manifest(artifact)
    moment = parse_since(since)
    with capture.open_store(store_path(ctx)) as store:
        rows = check_rows(store, manifest, moment, model)
    render(rows, fmt, headers=not no_headers)
    if not rows:
        window = f" since {since}" if since else ""
        click.echo(f"no recorded calls{window}: nothing to check", err=True)
        return
    click.echo(_summary(rows), err=True)
    if not all(r["served"] for r in rows):
        ctx.exit(EXIT_NOT_SERVED)
