"""Benchmark of `Recorder(..., payloads=...)`: the hot path with payloads off, and a sampled call.

    python bench/bench_payloads.py              # both parts (the numbers in docs/benchmarks.md)
    python bench/bench_payloads.py --off-only   # part 1 only; runs against a tree without payloads

Prints Markdown on stdout (progress on stderr). Uses bench_recorder's modules and inputs:
(a) ``model(x, y)`` with two 2x6 float32 tensors, (b) an LLM decode step with a 32-layer
DynamicCache of (1, 8, L, 64) float32 whose forward computes nothing.

1. **Payloads off.** Interleaved in one process (bench_recorder's `run_interleaved`): the bare
   module, the Recorder as constructed by default, and (when the tree has payloads) a Recorder
   with payloads on at a rate that never samples (1e-12), which pays the per-call draw only.
   Added latency = quantile of the variant - same quantile of the bare module. To compare with
   the code before payloads, run ``--off-only`` with ``PYTHONPATH`` at a checkout of that code
   and at this one, alternately.
2. **A sampled call.** The Recorder with ``payloads=1.0`` (every call sampled, caps and queue
   large enough to keep them all) against the Recorder without, interleaved: the added latency
   is what one sampled call costs on the calling thread (flatten + copies). Then the time the
   payload thread needs to write them all (close()), per file and in MB/s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import code_line, load_line, machine_line, md_table, median, p90, us  # noqa: E402
from recorder_cases import (  # noqa: E402
    Decode,
    Small,
    Variant,
    decode_inputs,
    run_interleaved,
    small_inputs,
)

import capture  # noqa: E402

try:
    from capture.record.recorder_options import Payloads
except ImportError:  # a tree from before payloads: part 1 compares the plain recorder only
    Payloads = None  # type: ignore[assignment,misc]


def log(msg: str) -> None:
    print(f"[bench_payloads] {msg}", file=sys.stderr, flush=True)


def _added(v: Variant, bare: Variant) -> tuple[str, str]:
    return us(median(v.samples) - median(bare.samples)), us(p90(v.samples) - p90(bare.samples))


def off_section(n: int, warmup: int, store: str) -> str:
    rows = []
    for title, make, inputs in (
        ("(a) small call", Small, small_inputs()),
        ("(b) decode, L=128", Decode, decode_inputs(128)),
    ):
        args, kwargs = inputs
        bare = Variant("bare", make())
        variants = [bare]
        recs = []
        m = make()
        recs.append(capture.Recorder(m, f"{store}/off", flush_seconds=3600).start())
        variants.append(Variant("Recorder (payloads off)", m))
        if Payloads is not None:
            m = make()
            never = Payloads(rate=1e-12)
            recs.append(capture.Recorder(m, f"{store}/never", payloads=never).start())
            variants.append(Variant("Recorder (payloads on, rate 1e-12)", m))
        log(f"{title}: {n} interleaved iterations")
        run_interleaved(variants, args, kwargs, n, warmup)
        for r in recs:
            r.stop()
        for v in variants[1:]:
            rows.append([title, v.name, *_added(v, bare)])
    return md_table(["call", "variant", "added median (µs)", "added p90 (µs)"], rows)


def sampled_section(store: str) -> str:
    rows = []
    for title, make, inputs, n in (
        ("(a) small call", Small, small_inputs(), 2000),
        ("(b) decode, L=32 (4.2 MB of cache)", Decode, decode_inputs(32), 40),
    ):
        args, kwargs = inputs
        m_off, m_on = make(), make()
        rec_off = capture.Recorder(m_off, f"{store}/s-off", flush_seconds=3600).start()
        policy = Payloads(rate=1.0, max_call_bytes=2**30, max_store_bytes=2**40, max_pending=n + 20)
        root = f"{store}/s-on-{make.__name__}"
        rec_on = capture.Recorder(m_on, root, flush_seconds=3600, payloads=policy).start()
        off, on = Variant("off", m_off), Variant("on", m_on)
        log(f"{title}: {n} interleaved calls, every one sampled")
        run_interleaved([off, on], args, kwargs, n, 5)
        t0 = time.perf_counter()
        rec_on.stop()
        drain = time.perf_counter() - t0
        rec_off.stop()
        stats = rec_on.stats()
        written = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
        files = stats["payloads"]
        rows.append(
            [
                title,
                us(median(on.samples) - median(off.samples)),
                us(p90(on.samples) - p90(off.samples)),
                f"{files} (dropped {stats['payloads_dropped']})",
                f"{written / max(files, 1) / 1e6:.3f}",
                f"{drain * 1e3:.0f}",
            ]
        )
    return md_table(
        [
            "call",
            "added per sampled call, median (µs)",
            "p90 (µs)",
            "files",
            "MB per file",
            "stop() waited for the writer (ms)",
        ],
        rows,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--off-only", action="store_true")
    parser.add_argument("--n", type=int, default=20_000)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    store = tempfile.mkdtemp(prefix="bench-payloads-")
    try:
        print(f"- machine: {machine_line()}\n- load: {load_line()}\n- code: {code_line()}\n")
        print("#### Payloads off: added latency per call\n")
        print(off_section(opts.n, 500, store))
        if not opts.off_only and Payloads is not None:
            print("\n#### A sampled call (payloads=1.0)\n")
            print(sampled_section(store))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
