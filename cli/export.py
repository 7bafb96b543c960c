"""`capture export MODULE:FACTORY`: export a model with torch.export from the recorded calls.

The command imports FACTORY from MODULE (a module name, importable from the current directory,
or a ``.py`` file), calls it to get the model, and runs `replay.export` on the store: one
program per call group, checked against eager on every recorded signature. The coverage table
goes to stdout through `cli.output`; notes and progress go to stderr. torch is imported inside the
command only, so ``capture --help`` stays fast.

Exit status: 0 every recorded signature is covered; 3 the export ran but torch.export rejected
a group or some signatures are not reproduced (the table says which and why); 1 an error before
anything was exported (no store, unknown model, a factory that cannot be imported or called, a
forward signature that no longer matches the recordings, an ``--out`` that cannot be written:
checked before the export, `capture.output_paths`). Files are written (``--out``) only when the
export ran, and never on exit 1.

``--out MODEL.pt2`` writes one artifact (`replay.artifact.saving`): every group's program and a JSON
manifest, plus the programs of the sub-modules recorded with ``Recorder(modules=...)``, exported
by the library (``replay.export(..., modules=True)``, `replay.pipeline.submodules`); ``--out
MODEL.onnx`` writes the ONNX set with the same sub-modules (`replay.onnx.target`). ``replay.load``
serves it; ``capture check`` measures new traffic against it. The command's options become one
`replay.inputs.options.ExportOptions`, the object the library builds from its keyword arguments, and
take their defaults from it.

Stdout carries the coverage table only: whatever torch prints while exporting (the ONNX
exporter's progress lines) goes to stderr, at the file-descriptor level.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from capture.output_paths import check_file
from capture.untrusted import printable
from replay.inputs.options import SPECS, ExportOptions

from .fit import Fit, terminal_width, wide_option
from .main import store_path
from .output import format_option, no_headers_option, render
from .progress import Progress

__all__ = [
    "export_command",
    "load_factory",
    "stdout_to_stderr",
    "EXIT_PARTIAL",
    "OUT_SUFFIXES",
]

EXIT_PARTIAL = 3
"""Exit status when the export does not cover every recorded signature (STYLE: exit codes)."""

OUT_SUFFIXES = (".pt2", ".onnx")
"""What ``--out`` may end with: a torch.export archive or an ONNX model."""


@contextlib.contextmanager
def _cwd_on_path() -> Iterator[None]:
    """Lets ``capture export mymodels:build`` import ``mymodels`` from the current directory."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def load_factory(target: str) -> Any:
    """Imports ``MODULE:FACTORY`` and returns FACTORY (not called).

    Args:
        target: ``package.module:function`` or ``path/to/file.py:function``.

    Returns:
        The factory object.

    Raises:
        click.ClickException: The target is malformed, does not import, or has no FACTORY.

    Example:
        >>> load_factory("fixtures.models:tiny_llama").__name__
        'tiny_llama'
    """
    module_name, sep, attribute = target.rpartition(":")
    if not sep or not module_name or not attribute:
        raise click.BadParameter(
            f"{target!r} is not MODULE:FACTORY, e.g. mymodels:build or models.py:build",
            param_hint="'MODULE:FACTORY'",
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise click.ClickException(f"cannot import {module_name}: no such file")
            spec = importlib.util.spec_from_file_location(f"_capture_factory_{path.stem}", path)
            if spec is None or spec.loader is None:
                raise click.ClickException(f"cannot import {module_name}: not a Python file")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            with _cwd_on_path():
                module = importlib.import_module(module_name)
    except click.ClickException:
        raise
    except Exception as e:  # the user's module failed to import: say which and why
        raise click.ClickException(f"cannot import {module_name}: {type(e).__name__}: {e}") from e
    factory = getattr(module, attribute, None)
    if factory is None or not callable(factory):
        raise click.ClickException(
            f"{module_name} has no callable {attribute!r}; FACTORY must be a function or class "
            "returning the model"
        )
    return factory


def _build_model(target: str) -> Any:
    import torch

    factory = load_factory(target)
    try:
        model = factory()
    except Exception as e:  # the factory itself failed: report it as the user's error
        raise click.ClickException(f"{target}() failed: {type(e).__name__}: {e}") from e
    if not isinstance(model, torch.nn.Module):
        raise click.ClickException(
            f"{target}() returned an object of type {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def _weights(module: Any) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once."""
    storages: dict[int, int] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _batch_option(values: tuple[str, ...]) -> bool | list[str | int] | None:
    if not values:
        return None
    if "all" in values:
        return True
    return [int(v) if v.isdigit() else v for v in values]


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Sends everything written to stdout (Python and file descriptor 1) to stderr for a block,
    and mutes log records below ERROR.

    torch's exporters print progress with ``print`` and from C++; the command's stdout must
    carry only its data (``-f json`` is parsed by scripts). A failing torch.export logs
    warnings with whole graphs in them; the command says the one-line reason itself
    (`replay.ExportResult.errors`), so records below ERROR are muted while torch runs.
    """
    sys.stdout.flush()
    logging.disable(logging.WARNING)
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no real descriptors (an embedding host): the Python redirect still holds
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        logging.disable(logging.NOTSET)
        sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _render_coverage(
    coverage: Any, fmt: str, headers: bool, signatures: bool, width: int | None
) -> None:
    """The coverage per group (table) or per signature (--signatures, other formats); the
    total line goes to stderr after it, as `capture check` writes its own."""
    from replay.runtime.coverage import group_coverage

    if fmt == "table" and not signatures:
        render(group_coverage(coverage), fmt, headers=headers, fit=Fit(width))
    else:
        render(coverage, fmt, headers=headers, fit=Fit(width))


@click.command("export")
@click.argument("target", metavar="MODULE:FACTORY")
@click.option(
    "--model",
    metavar="NAME",
    default=None,
    help="The model name in the store (the Recorder's name). Default: the store's only model, "
    "or the one named like the model's class.",
)
@click.option(
    "--group",
    "groups",
    metavar="NAME",
    multiple=True,
    help="Export only this call group (decode, prefill, g0, ... as `capture dims` shows them); "
    "repeatable. Default: every group.",
)
@click.option(
    "--out",
    metavar="PATH",
    default=None,
    help="Write the programs: PATH.pt2, one artifact holding every group's (and recorded "
    "sub-module's) program and a manifest, served by replay.load; or PATH.onnx (needs "
    "capture[onnx]): one ONNX file per group and recorded sub-module's group "
    "(PATH-stem.GROUP.onnx, PATH-stem.SUB.GROUP.onnx when there are several), "
    "their shared weights PATH.data and a manifest PATH.json, every file checked with "
    "onnxruntime (coverage rows of target onnx) and served by replay.load(PATH). "
    "Default: nothing written.",
)
@click.option(
    "--aoti",
    is_flag=True,
    default=False,
    help="Also compile every program with AOTInductor into the --out .pt2 artifact, without "
    "its weights (replay.load(path, compiled=True) runs the compiled form on the artifact's "
    "one copy of the weights). Slow: minutes per program. Default: off.",
)
@click.option(
    "--set-batch-dimension-for",
    "batch",
    metavar="NAME",
    multiple=True,
    help="Make axis 0 of this argument (name or position) dynamic even when it never varied; "
    "repeatable; 'all' for every input tensor. Default: only dims that varied.",
)
@click.option(
    "--named-dims",
    is_flag=True,
    default=ExportOptions.named_dims,
    help="Use named Dim(symbol, min, max) with the recorded ranges, shared and derived dims; "
    "where torch.export rejects them, bounded Dim.DYNAMIC(min, max) hints (exit 3 when neither "
    "is accepted). Default: Dim.DYNAMIC.",
)
@click.option(
    "--spec",
    type=click.Choice(list(SPECS)),
    default=ExportOptions.spec,
    help="The form of dynamic_shapes: torch.export.Dim objects (dims), or torch's ShapesSpec "
    "learned from the store (shapes, torch >= 2.14: recorded ranges, the most called size as "
    "optimization hint, trusted divisors as assumptions; every size unbacked, no retries or "
    f"regimes). Default: {ExportOptions.spec}.",
)
@click.option(
    "--probes",
    type=click.IntRange(min=0),
    default=ExportOptions.probes,
    help="Unseen sizes inside the recorded ranges checked per group besides every recorded "
    f"signature (coverage rows of kind probe); 0 for none. Default: {ExportOptions.probes}.",
)
@click.option(
    "--max-regimes",
    type=click.IntRange(min=1),
    default=ExportOptions.max_regimes,
    help="Where torch.export cuts a group's recorded range (a sliding window, a branch on a "
    "size), export each side as a regime of its own (prefill[input_ids_1<=4], ...), at most "
    f"this many per group; 1 never splits. Default: {ExportOptions.max_regimes}.",
)
@click.option(
    "--merge/--no-merge",
    default=ExportOptions.merge,
    help="Serve a group lacking an optional input (generate()'s batch-1 calls without "
    "attention_mask) with the program of a group passing it, the input filled, where the "
    "check proves it on the group's own signatures. Default: --merge.",
)
@click.option(
    "--time-budget",
    type=click.FloatRange(min=0),
    default=ExportOptions.time_budget or 0.0,
    metavar="SECONDS",
    help="Seconds of torch.export per call group; each export is stopped at the deadline. The "
    "dynamic exports (plain, retries, regimes) may use half; the recorded signatures they do "
    "not serve get one static program each, most calls first, in the rest. A group past it is "
    "named on stderr with what served it instead; 0 for no bound. Default: 300.",
)
@click.option(
    "--max-static",
    type=click.IntRange(min=0),
    default=ExportOptions.max_static,
    help="Most static programs per group, one per recorded signature its dynamic program does "
    "not serve (past the time budget, or cut where regimes cannot serve), most calls first; "
    f"0: none. Default: {ExportOptions.max_static}.",
)
@click.option(
    "--allow-ops",
    "allow_ops",
    metavar="NAME",
    multiple=True,
    help="An operator namespace, operator or overload (mylib, aten.bincount, "
    "mylib.op.default) the programs may call beyond the model's math, as the artifact will be "
    "loaded with replay.load(path, allow_ops=[...]); a program the loader would refuse is "
    "reported not covered, with the loader's reason. Repeat for several. Default: none.",
)
@click.option(
    "--keyword-only",
    is_flag=True,
    default=ExportOptions.keyword_only,
    help="Pass positional arguments by keyword in the exported program. Default: as recorded.",
)
@click.option(
    "--signatures",
    is_flag=True,
    default=False,
    help="Table: one row per recorded signature and probe (the full coverage table) instead of "
    "one row per group; -f json, jsonl and csv always have one row per signature. Default: "
    "one row per group.",
)
@format_option()
@no_headers_option
@wide_option
@click.pass_context
def export_command(
    ctx: click.Context,
    target: str,
    model: str | None,
    groups: tuple[str, ...],
    out: str | None,
    aoti: bool,
    batch: tuple[str, ...],
    named_dims: bool,
    spec: str,
    keyword_only: bool,
    probes: int,
    max_regimes: int,
    merge: bool,
    time_budget: float,
    max_static: int,
    allow_ops: tuple[str, ...],
    signatures: bool,
    fmt: str,
    no_headers: bool,
    wide: bool,
) -> None:
    """Export a model with torch.export using the recorded calls.

    MODULE:FACTORY names a function (or class) returning the model: a module
    importable from the current directory (mymodels:build) or a Python file
    (models.py:build). The model is exported once per call group of its
    recordings (prefill, decode, ...) from arguments rebuilt from the store,
    and each program is run against the eager model on every recorded
    signature, and on --probes unseen sizes inside the recorded ranges. The
    coverage goes to stdout: per group, the signatures, calls and probes
    covered (covered/total), the worst difference from eager and the first
    error; with --signatures, or -f json/jsonl/csv, one row per recorded
    signature or probe (kind, calls, covered, max_abs_diff, error). The
    total line and notes go to stderr.

    Exit status: 0 every recorded signature is covered (and every probe); 3 the
    export ran but torch.export rejected a group, some signatures or probes are
    not reproduced, or --named-dims could not be honoured (the table is printed
    and --out still written for the programs that exported);
    1 an error before exporting (no store, unknown model, a factory that does
    not import, a forward signature that no longer matches the recordings, an
    --out whose folder is missing, read-only or too full for the weights),
    with nothing written.

    \b
    Example:
      capture export mymodels:build --model LlamaForCausalLM
      capture --store runs/prod export models.py:build --out llama.pt2
      capture export mymodels:build --group decode --set-batch-dimension-for all -f json
    """
    if signatures and fmt != "table":
        raise click.UsageError(
            f"--signatures applies to the table format; -f {fmt} always has one row per signature"
        )
    if out is not None and not out.endswith(OUT_SUFFIXES):
        raise click.BadParameter(f"{out!r} must end with .pt2 or .onnx", param_hint="'--out'")
    onnx = out if out is not None and out.endswith(".onnx") else None
    if aoti and (out is None or onnx is not None):
        raise click.BadParameter("--aoti needs --out MODEL.pt2", param_hint="'--aoti'")
    if out is not None:  # before the minutes of export: a missing or read-only folder, a full disk
        check_file(out, option="--out", what="artifact", example="model.pt2")
    if onnx is not None:
        from replay.pipeline.exporting import require_onnx

        require_onnx()
    module = _build_model(target)
    if out is not None:  # the weights are written once, whatever the number of programs
        check_file(out, option="--out", what="artifact", example="model.pt2", need=_weights(module))

    from replay.pipeline.exporting import export_with

    # The same object replay.export builds from its keywords; sub-modules (recorded with
    # Recorder(modules=...)) are exported by the library for an artifact or an ONNX set.
    options = ExportOptions.of(
        set_batch_dimension_for=_batch_option(batch),
        named_dims=named_dims,
        spec=spec,
        keyword_only=keyword_only,
        probes=probes,
        max_regimes=max_regimes,
        merge=merge,
        time_budget=time_budget or None,
        max_static=max_static,
        allow_ops=allow_ops,
        groups=groups or None,
        onnx=onnx,
        modules=out is not None,
    )
    with Progress("export") as progress, stdout_to_stderr():  # progress: only on a terminal
        progress.phase("exporting each call group and checking every recorded signature")
        result = export_with(module, store_path(ctx), model, options)
    subs = result.modules
    for note in result.notes:
        click.echo(printable(f"note: {note}"), err=True)
    for sub, sub_result in subs.items():
        for note in sub_result.notes:
            click.echo(printable(f"note: {sub}.{note}"), err=True)
    for prefix, errors in [("", result.errors)] + [(f"{s}.", r.errors) for s, r in subs.items()]:
        for group, error in errors.items():
            click.echo(printable(f"error: group {prefix}{group}: {error}"), err=True)
    written = [*result.onnx.values(), *(f for r in subs.values() for f in r.onnx.values())]
    if onnx is not None and written:
        from replay.runtime.ort.manifest import manifest_path, weights_path

        written += [weights_path(onnx), manifest_path(onnx)]
    if out is not None and onnx is None and result.programs:
        with stdout_to_stderr():
            written = list(result.save(out, aoti=aoti).files)
    for path in written:
        click.echo(printable(f"wrote {path}"), err=True)
    coverage = result.all_coverage()
    _render_coverage(coverage, fmt, not no_headers, signatures, terminal_width(wide))
    from replay.runtime.coverage import coverage_total

    if result.complete:  # the sub-modules included
        click.echo(coverage_total(coverage), err=True)
        return
    for prefix, sub_result in [("", result)] + [(f"{s}.", r) for s, r in subs.items()]:
        for group, why in sub_result.not_honoured.items():
            click.echo(printable(f"not honoured: {prefix}{group}: {why}"), err=True)
    click.echo(f"export incomplete: {coverage_total(coverage)} (see the error column)", err=True)
    ctx.exit(EXIT_PARTIAL)
