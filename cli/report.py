"""`capture report --out report.html`: the store's traffic as one self-contained HTML page.

Draws with matplotlib (the ``report`` extra), imported when the command runs; never torch.
``--artifact`` adds which recorded calls a saved artifact serves, with the same guards as
`capture check` (`replay.check.drift`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from capture import OutputNotWritable, check_file, writing

from .flags import model_option
from .main import store_path
from .progress import Progress

if TYPE_CHECKING:
    from replay import DriftRow

__all__ = ["report_command", "served_rows"]


def _write(path: Path, page: str) -> None:
    """Writes `page` to a hidden temporary file beside `path`, then renames it: a reader never
    sees half a page, and nothing is left behind when writing fails (`writing` says why in one
    line; removing the temporary file on a read-only filesystem fails too, silently)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with writing(path, option="--out", what="page"):
            tmp.write_text(page, encoding="utf-8")
            os.replace(tmp, path)
    except OutputNotWritable:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def served_rows(store: Any, path: str) -> tuple[str, list[DriftRow]]:
    """Which recorded calls the artifact at `path` serves (`replay.check_rows`).

    Raises:
        click.ClickException: The file is missing.
    """
    if not os.path.exists(path) and not os.path.exists(f"{path}.json"):
        raise click.ClickException(
            f"no artifact at {path}; pass the .pt2 (or .onnx) that capture export wrote"
        )
    import replay

    return path, replay.check_rows(store, replay.read_any_manifest(path), None, None)


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
def report_command(
    ctx: click.Context, out: str, model_name: str | None, artifact: str | None
) -> None:
    """Write an HTML page with plots of the store's traffic.

    One self-contained file (plots inlined, no network needed to view it):
    per model, the call groups and their input shapes; one distribution
    per symbol (batch, sequence, cache and image sizes) over every group,
    with the recorded range, p50/p90/p99, each group's exported range,
    the probes and the buckets drawn on it; per group the dynamic_shapes
    to paste; calls over time, optional inputs, the input structures over
    time (drift) and, with --artifact, which recorded calls the artifact
    serves. Needs matplotlib (pip install 'capture[report]'). Progress
    goes to stderr when it is a terminal.

    \b
    Example:
      capture report --out report.html
      capture --store runs/prod report --model LlamaForCausalLM --out llama.html
      capture report --artifact model.pt2 --out report.html
    """
    from capture import open_store
    from capture.engines.report_html import build_report, require_matplotlib

    path = Path(check_file(out, option="--out", what="page", example="report.html"))
    require_matplotlib()
    with Progress("report") as progress, open_store(store_path(ctx)) as store:
        served = None
        if artifact is not None:
            progress.phase(f"checking which recorded calls {artifact} serves")
            served = served_rows(store, artifact)
        from replay.inputs.source import export_plan  # what capture export does; no torch

        page = build_report(
            store, model_name, served=served, plan=export_plan, progress=progress.phase
        )
        progress.phase(f"writing {out}")
        _write(path, page)
    click.echo(f"wrote {out} ({len(page) / 1024:,.0f} KiB)", err=True)
