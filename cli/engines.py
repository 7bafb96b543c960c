"""`capture profiles` and `capture buckets`: engine settings sized from the recorded traffic.

Thin commands over `capture.engines.profiles`, `capture.engines.profile_formats` and
`capture.engines.buckets`; they read the store through DuckDB and pyarrow and never import torch.
"""

from __future__ import annotations

import json
from typing import Any

import click

from .fit import Fit, constant_columns, terminal_width, wide_option
from .flags import choice_format_option, count_option, group_option, model_option
from .main import store_path
from .output import FORMATS, render, render_document, write_text

__all__ = ["profiles_command", "buckets_command"]

_PROFILE_FORMATS = (*FORMATS, "trtexec", "torch-tensorrt", "onnxruntime")


@click.command("profiles")
@model_option()
@group_option(
    "Only this call group (decode, prefill, g0, ... as `capture dims` shows them). "
    "Default: every group."
)
@click.option(
    "--opt",
    type=click.Choice(["mode", "p50", "p90"]),
    default="mode",
    help="How opt is targeted per shared symbol: the size with the most calls, or the 50th / "
    "90th percentile over calls; opt is then the recorded signature nearest to the targets. "
    "Default: mode.",
)
@count_option(
    "--max-profiles",
    1,
    "Most profiles per group; a group gets several only when its size distribution has "
    "several peaks. Default: 1.",
)
@choice_format_option(
    _PROFILE_FORMATS,
    "table, json, jsonl, csv (one row per profile and input), or the tool's own syntax: "
    "trtexec flags, torch_tensorrt.Input Python lines, ONNX Runtime TensorRT provider "
    "options. Default: table.",
)
@wide_option
@click.pass_context
def profiles_command(
    ctx: click.Context,
    model_name: str | None,
    group: str | None,
    opt: str,
    max_profiles: int,
    fmt: str,
    wide: bool,
) -> None:
    """Print TensorRT min/opt/max shape profiles per call group.

    For every tensor input of a call group: the smallest and largest
    recorded shape, and an opt shape that production actually sent (a real
    recorded signature, never a mix of sizes from different calls). Input
    names are the names torch.export gives the inputs (the flattened
    argument path joined with _, e.g. past_key_values_key_cache_0), which
    torch.onnx.export keeps as the ONNX input names. On a terminal the
    table leaves out the argument path (and model and profile, when they
    are the same in every row) unless --wide.

    \b
    Example:
      capture profiles
      capture profiles --group decode -f trtexec
      capture profiles --model LlamaForCausalLM -f onnxruntime --max-profiles 3
      capture profiles -f torch-tensorrt --opt p90
    """
    import capture

    options: dict[str, Any] = {"group": group, "opt": opt, "max_profiles": max_profiles}
    with capture.open_store(store_path(ctx)) as store:
        if fmt not in FORMATS:  # the engine's own syntax
            profiles = capture.store_profiles(store, model_name, **options)
            write_text(capture.format_profiles(profiles, fmt))
            return
        table = store.profiles(model_name, **options)
    hide = ("path", *constant_columns(table, ["model", "profile"]))
    fit = Fit(
        terminal_width(wide),
        hide=hide,
        keep_end=("input",),
        whole=_SHAPES,
        drop_first=("opt_calls", "calls", "dtype"),
    )
    render(table, fmt, fit=fit)


_SHAPES = ("min_shape", "opt_shape", "max_shape")


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "0.00%"


def _buckets_text(summary: dict[str, Any], rows: list[dict[str, int]]) -> str:
    from capture.analysis.symbol_sizes import BATCH

    from .output import table_text

    calls = int(summary["calls"])
    work = int(summary["work"])
    padding = int(summary["padding"])
    buckets = list(summary["buckets"])
    groups = ", ".join(summary["groups"])
    lines = [
        f"{summary['model']}, symbol {summary['symbol']} ({summary['measures']}; groups {groups}):",
        f"{calls:,} calls, {summary['distinct_sizes']} distinct sizes from {summary['min']} to "
        f"{summary['max']}",
        "",
        table_text(rows),
        "",
        f"padding with these {len(buckets)} sizes: {padding:,} "
        f"({_percent(padding, work)} of the {work:,} useful; {padding / calls:.4g} per call)",
    ]
    if summary["measures"] != BATCH:
        # vLLM's and SGLang's CUDA-graph sizes are batch sizes: no flags for lengths.
        lines += [
            "",
            f"{summary['symbol']} is a {summary['measures']}: vLLM's and SGLang's capture sizes "
            "are batch sizes,",
            f"so no engine flags are printed; pad each {summary['measures']} up to the next "
            "of these sizes.",
        ]
        return "\n".join(lines)
    vllm = list(summary["vllm_sizes"])
    vllm_padding = int(summary["vllm_padding"])
    uncovered = int(summary["vllm_uncovered_calls"])
    sizes = json.dumps(buckets)
    lines += [
        f"padding with vLLM's default sizes cut to {summary['budget']} {json.dumps(vllm)}: "
        f"{vllm_padding:,} ({_percent(vllm_padding, work)}; {vllm_padding / calls:.4g} per call)"
        + (
            f", and {uncovered:,} calls ({_percent(uncovered, calls)}) larger than "
            f"{vllm[-1]} that no captured size holds"
            if uncovered
            else ""
        ),
        "",
        "vLLM:   --compilation-config '"
        + json.dumps({"cudagraph_capture_sizes": buckets, "compile_sizes": buckets})
        + "'",
        f"Python: CompilationConfig(cudagraph_capture_sizes={sizes}, compile_sizes={sizes})",
        "SGLang: --cuda-graph-bs " + " ".join(str(b) for b in buckets),
    ]
    return "\n".join(lines)


@click.command("buckets")
@click.option(
    "--symbol",
    metavar="NAME",
    default=None,
    help="The shared symbol to size (batch, input_ids_1, past_key_values_2, ... as the symbol "
    "column of `capture dims` names them). Default: the only one; when the calls have "
    "several, their batch symbol (the sizes CUDA graphs are captured for), named on the "
    "output's first line.",
)
@count_option("--budget", None, "How many sizes to choose. Default: none, required.")
@model_option("The model (the Recorder's name). Default: the store's only model.")
@group_option("Only this call group's calls. Default: every group that has the symbol.")
@choice_format_option(
    ("table", "json"),
    "table: the sizes, the padding next to vLLM's default sizes, and lines to paste into "
    "vLLM and SGLang; json: the same as one document. Default: table.",
)
@click.pass_context
def buckets_command(
    ctx: click.Context,
    symbol: str | None,
    budget: int,
    model_name: str | None,
    group: str | None,
    fmt: str,
) -> None:
    """Choose the N batch or sequence sizes that pad recorded calls least.

    Each recorded call runs at the smallest chosen size that holds it (a
    batch of 5 runs as 8 when 4 and 8 are chosen); the chosen sizes minimise
    the total padding over the recorded calls, exactly (dynamic programming
    over the recorded distribution), and the largest is the largest size
    recorded. Every group with one of the symbol's dims counts, also where
    it never varied (batch 1). For a batch symbol, prints the padding next
    to that of vLLM's default capture sizes ([1, 2, 4] + range(8, 256, 8)
    + range(256, 513, 16)) cut to N, and ready lines for vLLM
    (cudagraph_capture_sizes, compile_sizes) and SGLang (--cuda-graph-bs);
    those are batch sizes, so a sequence or cache length gets no flags.

    \b
    Example:
      capture buckets --budget 4
      capture buckets --symbol batch --budget 8
      capture buckets --symbol input_ids_1 --budget 4 --group prefill
      capture buckets --symbol batch --budget 4 -f json
    """
    from capture import METADATA_BUCKETS, open_store

    with open_store(store_path(ctx)) as store:
        table = store.buckets(symbol, budget, model_name=model_name, group=group)
    summary = json.loads((table.schema.metadata or {})[METADATA_BUCKETS])
    rows = table.to_pylist()
    if fmt == "json":
        render_document({**summary, "rows": rows}, "json")
    else:
        write_text(_buckets_text(summary, rows))
