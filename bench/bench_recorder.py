"""Benchmarks of the recording path: added latency per call, memory, writer throughput.

    python bench/bench_recorder.py            # full run (the numbers in docs/benchmarks.md)
    python bench/bench_recorder.py --quick    # a smoke run, same sections, fewer calls

Prints one Markdown section on stdout (progress goes to stderr). What is measured:

- **(a) small call** ``model(x, y)`` with two 2x6 float32 tensors, and **(b) LLM decode step**
  ``model(input_ids=(1,1), attention_mask=(1,L+1), position_ids=(1,1), past_key_values=<32-layer
  DynamicCache of (1,8,L,64) float32>)`` where the module returns ``(logits, cache)`` without
  computing anything, so the recorder is what is measured. Variants: bare module, the module
  wrapped by `capture.Recorder` (recording every call), and by `torch.onnx.InputObserver`
  (default: keeps the first 3 calls; and with ``store_n_calls`` large enough to keep every
  call, which clones every input and output tensor). Every variant is its own instance of the
  module, called through ``nn.Module.__call__`` under ``torch.no_grad()``. Each iteration calls
  every variant once, in a rotating order (interleaved, so drift and load hit all of them
  alike), and times each call alone with ``time.perf_counter_ns``. Added latency = quantile of
  the wrapped variant - same quantile of the bare module, same process, same run. The
  keep-every-call InputObserver runs in a second interleaved run with its own bare baseline,
  so its clones do not evict the caches or feed the GC under the Recorder's calls.
- **(c) memory** over 100k recorded calls of (a), with the writer flushing a segment every 10k
  rows: RSS every 10k calls, and tracemalloc's traced Python memory before/after.
- **(d) writer throughput**: 500k copies of the record the Recorder queues for one call of (a)
  (and 100k of (b)) handed to a `StoreWriter` and timed until the last Parquet file is renamed
  into place; the writer's own stages on one segment; and the recorder driven from a tight
  loop for (a) and (b) (calls/s, dropped calls, total cost per call including the writer
  thread and the cyclic GC).
- **wrapper**: the real wrapper of (a) and (b) timed with `timeit` (min and median of 7
  repeats) under option sets that switch its parts off (outputs, value ranges, every call
  sampled out), against the bare module, plus where `walk`, the guards and the shapes spend
  their time on the cache.

The sections live in `recorder_cases.py` (modules, inputs, interleaved timing),
`recorder_latency.py` ((a), (b), wrapper), `recorder_memory.py` ((c)) and `recorder_writer.py`
((d)). Only public API times the hot path: a `capture.Recorder` around a module.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import code_line, load_line, machine_line  # noqa: E402
from recorder_cases import LAYERS, Decode, Small, decode_inputs, log, small_inputs  # noqa: E402
from recorder_latency import latency_section, wrapper_section  # noqa: E402
from recorder_memory import memory_section  # noqa: E402

TARGET_A_US = 10.0
TARGET_B_US = 40.0


# -- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="few calls: a smoke run")
    parser.add_argument("--cache-len", type=int, default=128, help="L, cached tokens (128)")
    parser.add_argument(
        "--only", default="a,b,c,d,wrapper", help="comma-separated sections (a,b,c,d,wrapper)"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    only = set(opts.only.split(","))
    q = opts.quick
    n_a = 2_000 if q else 50_000
    n_b = 300 if q else 5_000
    n_mem = 20_000 if q else 100_000
    n_writer = 50_000 if q else 500_000
    n_writer_b = 10_000 if q else 100_000
    n_loop = 20_000 if q else 200_000
    number = 2_000 if q else 20_000
    torch.set_num_threads(1)
    if opts.child:  # (c) in a fresh process, so RSS is not inflated by the other sections
        store = tempfile.mkdtemp(prefix="capture-bench-mem-", dir="/tmp")
        try:
            print(memory_section(n_mem, store))
        finally:
            shutil.rmtree(store, ignore_errors=True)
        return 0
    store = tempfile.mkdtemp(prefix="capture-bench-", dir="/tmp")
    out: list[str] = []
    load_start = load_line()
    t_start = time.perf_counter()
    try:
        cmd = "python bench/bench_recorder.py" + (" --quick" if q else "")
        if opts.cache_len != 128:
            cmd += f" --cache-len {opts.cache_len}"
        out += [
            "## Recorder benchmarks" + (" (quick run: too few calls to trust)" if q else ""),
            "",
            f"- Command: `{cmd}`",
            f"- Machine: {machine_line()}",
            f"- Code: {code_line()}",
            "- `torch.set_num_threads(1)`; every call under `torch.no_grad()`; the store is a "
            "temporary directory under /tmp (local disk).",
            f"- Load at start: {load_start}",
            "",
        ]
        added_a: dict[str, float] = {}
        added_b: dict[str, float] = {}
        a_args, a_kwargs = small_inputs()
        b_args, b_kwargs = decode_inputs(opts.cache_len)
        if "a" in only:
            log("(a) small call")
            text, added_a = latency_section(
                "(a) Added latency, `model(x, y)` with two 2x6 float32 tensors",
                Small,
                a_args,
                a_kwargs,
                n=n_a,
                warmup=1_000,
                target_us=TARGET_A_US,
                store=os.path.join(store, "a"),
                observer_n=n_a // 5,
                observer_reset_every=1_000,
                extra_recorders={},
            )
            out.append(text)
        if "b" in only:
            log("(b) decode step")
            text, added_b = latency_section(
                f"(b) Added latency, LLM decode step with a {LAYERS}-layer DynamicCache "
                f"(L={opts.cache_len})",
                Decode,
                b_args,
                b_kwargs,
                n=n_b,
                warmup=100,
                target_us=TARGET_B_US,
                store=os.path.join(store, "b"),
                observer_n=max(50, n_b // 10),
                observer_reset_every=16,
                extra_recorders={"value_ranges='none'": dict(value_ranges="none")},
            )
            out.append(text)
            out.append(
                "Inputs of (b): `input_ids` (1,1) int64, `attention_mask` (1,L+1) int64, "
                f"`position_ids` (1,1) int64, `past_key_values` = `capture.make_dynamic_cache` of "
                f"{LAYERS} layers of (1,8,L,64) float32 keys and values ({2 * LAYERS} tensors), "
                "all passed as keywords as `generate()` does; the module returns "
                "`(logits (1,1,32000), past_key_values)`, so the Recorder also walks the cache "
                "in the output. The "
                "keep-every-call InputObserver clones "
                f"{2 * 2 * LAYERS * 8 * opts.cache_len * 64 * 4 / 2**20:.0f} MiB of cache per call "
                "(input and output), so its cost grows linearly with L; the Recorder's does not "
                "depend on L. Cache classes are registered with torch pytree "
                "(`capture.register_flattening_functions()`) for every variant, so the "
                "InputObserver really clones the cache.",
            )
            out.append("")
        if "wrapper" in only:
            log("wrapper")
            out.append("### Hot-path breakdown (the real wrapper, by option)")
            out.append("")
            out.append(
                wrapper_section(
                    "(a) small call, the real wrapper by option",
                    Small,
                    a_args,
                    a_kwargs,
                    number=number,
                    store=os.path.join(store, "wrapper-a"),
                    measured_ns=added_a.get("capture.Recorder (every call)", float("nan")),
                )
            )
            out.append(
                wrapper_section(
                    "(b) decode step, the real wrapper by option",
                    Decode,
                    b_args,
                    b_kwargs,
                    number=max(200, number // 20),
                    store=os.path.join(store, "wrapper-b"),
                    measured_ns=added_b.get("capture.Recorder (every call)", float("nan")),
                )
            )
        if "c" in only:
            log("(c) memory (fresh subprocess)")
            child = [sys.executable, os.path.abspath(__file__), "--only", "c", "--child"]
            result = subprocess.run(
                child + (["--quick"] if q else []), capture_output=True, text=True, check=True
            )
            out.append(result.stdout)
        if "d" in only:
            # imported here: it reads the writer's internals, so sections (a)-(c) also time an
            # older checkout of capture (PYTHONPATH=<checkout>) for before/after comparisons
            from recorder_writer import writer_section

            log("(d) writer")
            out.append(
                writer_section(
                    n_writer, n_writer_b, n_loop, store, (b_args, b_kwargs), opts.cache_len
                )
            )
        out.append(
            f"Total run time {time.perf_counter() - t_start:.0f} s; load at end: {load_line()}."
        )
        out.append("")
    finally:
        shutil.rmtree(store, ignore_errors=True)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
