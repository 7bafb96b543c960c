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

import capture
import replay

from .export_flags import export_keywords, export_option_flags
from .fit import Fit, terminal_width, wide_option
from .flags import model_option
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


def _weights(model: Any) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once."""
    storages: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


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


def _render_coverage(result: Any, fmt: str, headers: bool, signatures: bool, wide: bool) -> None:
    """The coverage per group (table) or per signature (--signatures, other formats), then the
    total line on stderr, as `capture check` writes its own."""
    coverage = result.all_coverage()
    rows = replay.group_coverage(coverage) if fmt == "table" and not signatures else coverage
    render(rows, fmt, headers=headers, fit=Fit(terminal_width(wide)))


def _check_out(out: str | None, aoti: bool, signatures: bool, fmt: str) -> None:
    """Usage errors of ``--out``, ``--aoti`` and ``--signatures``, an ``--out`` that cannot be
    written and an ONNX ``--out`` without its dependencies, before the minutes of export."""
    if signatures and fmt != "table":
        raise click.UsageError(
            f"--signatures applies to the table format; -f {fmt} always has one row per signature"
        )
    if out is not None and not out.endswith(OUT_SUFFIXES):
        raise click.BadParameter(f"{out!r} must end with .pt2 or .onnx", param_hint="'--out'")
    onnx = out if out is not None and out.endswith(".onnx") else None
    if aoti and (out is None or onnx is not None):
        raise click.BadParameter("--aoti needs --out MODEL.pt2", param_hint="'--aoti'")
    if out is not None:  # a missing or read-only folder, a full disk
        capture.check_file(out, option="--out", what="artifact", example="model.pt2")
    if onnx is not None:
        replay.require_onnx()


def _tell(result: Any) -> None:
    """The notes and the per-group errors on stderr, the sub-modules' named ``<sub>.<group>``."""
    parts = [("", result), *((f"{s}.", r) for s, r in result.modules.items())]
    for prefix, part in parts:
        for note in part.notes:
            click.echo(capture.printable(f"note: {prefix}{note}"), err=True)
    for prefix, part in parts:
        for group, error in part.errors.items():
            click.echo(capture.printable(f"error: group {prefix}{group}: {error}"), err=True)


def _finish(ctx: click.Context, result: Any) -> None:
    """The total line; what is not honoured and exit 3 when the export is incomplete."""
    total = replay.coverage_total(result.all_coverage())
    if result.complete:  # the sub-modules included
        click.echo(total, err=True)
        return
    parts = [("", result), *((f"{s}.", r) for s, r in result.modules.items())]
    for prefix, part in parts:
        for group, why in part.not_honoured.items():
            click.echo(capture.printable(f"not honoured: {prefix}{group}: {why}"), err=True)
    click.echo(f"export incomplete: {total} (see the error column)", err=True)
    ctx.exit(EXIT_PARTIAL)


@click.command("export")
@click.argument("target", metavar="MODULE:FACTORY")
@model_option(
    "The model name in the store (the Recorder's name). Default: the store's only model, "
    "or the one named like the model's class."
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
@export_option_flags
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
    /,
    target: str,
    model_name: str | None,
    out: str | None,
    aoti: bool,
    signatures: bool,
    fmt: str,
    no_headers: bool,
    wide: bool,
    **options: Any,
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
    _check_out(out, aoti, signatures, fmt)
    model = _build_model(target)
    if out is not None:  # the weights are written once, whatever the number of programs
        need = _weights(model)
        capture.check_file(out, option="--out", what="artifact", example="model.pt2", need=need)
    # Sub-modules (recorded with Recorder(modules=...)) go into an artifact or an ONNX set.
    keywords = export_keywords(options)
    with Progress("export") as progress, stdout_to_stderr():  # progress: only on a terminal
        progress.phase("exporting each call group and checking every recorded signature")
        result = replay.export(
            model, store_path(ctx), model_name, modules=out is not None, **keywords
        )
        written: tuple[str, ...] = ()
        if out is not None and result.programs:  # the one ship step, .pt2 or ONNX alike
            progress.phase(f"writing {out}")
            saved = result.save(out, aoti=aoti)
            result, written = saved.result, saved.files
    _tell(result)
    for path in written:
        click.echo(capture.printable(f"wrote {path}"), err=True)
    _render_coverage(result, fmt, not no_headers, signatures, wide)
    _finish(ctx, result)
