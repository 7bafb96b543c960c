"""`capture report --out report.html`: the store's traffic as one self-contained HTML page.

Draws with matplotlib (the ``report`` extra), imported when the command runs; never torch.
``--artifact`` adds which recorded calls a saved artifact serves, with the same guards as
`capture check` (`replay.ship.drift`).
"""

from __future__ import annotations

import os
from typing import Any

import click

from .main import store_path
from .options import model_option
from .progress import Progress

__all__ = ["report_command", "served_rows"]


def served_rows(store: Any, path: str) -> tuple[str, list[dict[str, Any]]]:
    """Which recorded calls the artifact at `path` serves (`replay.ship.drift.check_rows`).

    Raises:
        click.ClickException: The file is missing.
    """
    if not os.path.exists(path):
        raise click.ClickException(
            f"no artifact at {path}; pass the .pt2 that capture export wrote"
        )
    from replay.ship.artifact import read_manifest
    from replay.ship.drift import check_rows

    return path, check_rows(store, read_manifest(path), None, None)


@click.command("report")
@click.option(
    "--out",
    metavar="PATH",
    required=True,
    help="The HTML file to write (replaced if it exists). Default: none, required.",
)
@model_option()
@click.option(
    "--artifact",
    metavar="PATH",
    default=None,
    help="An artifact written by capture export --out (.pt2): add which recorded calls its "
    "programs serve. Default: no artifact section.",
)
@click.pass_context
def report_command(ctx: click.Context, out: str, model: str | None, artifact: str | None) -> None:
    """Write an HTML page with plots of the store's traffic.

    One self-contained file (plots inlined, no network needed to view it):
    per model, the call groups, calls over time per group, the
    distribution of every dynamic size per group (batch, sequence, cache
    and image sizes), which optional inputs were passed, the input
    structures over time (drift) and, with --artifact, which recorded
    calls the artifact serves. Needs matplotlib (pip install
    'capture[report]'). Progress goes to stderr when it is a terminal.

    \b
    Example:
      capture report --out report.html
      capture --store runs/prod report --model LlamaForCausalLM --out llama.html
      capture report --artifact model.pt2 --out report.html
    """
    from capture.engines.report_html import build_report, require_matplotlib
    from capture.store_api import open_store

    require_matplotlib()
    with Progress("report") as progress, open_store(store_path(ctx)) as store:
        served = None
        if artifact is not None:
            progress.phase(f"checking which recorded calls {artifact} serves")
            served = served_rows(store, artifact)
        page = build_report(store, model, served=served, progress=progress.phase)
        progress.phase(f"writing {out}")
        tmp = f"{out}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(page)
        os.replace(tmp, out)
    click.echo(f"wrote {out} ({len(page) / 1024:,.0f} KiB)", err=True)
