"""Export + coverage time of `replay.export` on the demo and on a sliding-window model.

    python bench/bench_fidelity.py [--quick] [--repeat N] [--time-budget SECONDS]

Two workloads, each recorded once with the real Recorder under greedy generate():

- ``demo``: the tiny Llama and the request mix of `capture demo` (capture.cli.demo.WORKLOAD);
- ``mistral-sw``: a tiny Mistral whose sliding window (8) is shorter than most prompts,
  left-padded batches of 1-3 and one request without an attention mask.

Then ``replay.export(model, store)`` (every group: torch.export + the coverage check) is timed
`--repeat` times. The ORIGINAL calls (a forward pre-hook's copies) are also run through the
programs: the table says how many calls a program served, and how many of those it answered
wrong while the coverage table said covered. The recorder's cache walk on a 32-layer
decode-step cache (plain and sliding window) is timed too: it carries the window's
state. Prints Markdown (docs/benchmarks.md holds results).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import code_line, load_line, machine_line, md_table  # noqa: E402

SLIDING_WORKLOAD = [(1, 7, True), (2, 9, True), (3, 10, True), (1, 12, False), (2, 6, True)]


def _workloads(quick: bool) -> list[tuple[str, Any, list[tuple[int, int, bool]], int]]:
    from capture.cli.demo import MAX_NEW_TOKENS, WORKLOAD
    from fixtures.generate_traffic import tiny_causal
    from fixtures.models import tiny_llama

    demo = [(batch, length, True) for batch, length in WORKLOAD]
    sliding = SLIDING_WORKLOAD[:2] if quick else SLIDING_WORKLOAD
    return [
        ("demo", tiny_llama(), demo[:2] if quick else demo, MAX_NEW_TOKENS),
        ("mistral-sw", tiny_causal("mistral", sliding_window=8), sliding, 5),
    ]


def _run(
    name: str,
    model: Any,
    workload: list[tuple[int, int, bool]],
    new_tokens: int,
    repeat: int,
    options: dict[str, Any],
) -> list[Any]:
    import torch

    import capture
    import replay
    from fixtures.generate_traffic import check_originals, record_traffic

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix=f"bench-fidelity-{name}-")
    originals = record_traffic(model, root, workload, name=name, max_new_tokens=new_tokens)
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = replay.export(model, root, model_name=name, **options)
        times.append(time.perf_counter() - start)
    assert result is not None
    with capture.open_store(root) as store:
        verdicts = check_originals(model, result, store, originals)
    rows = result.coverage.to_pylist()
    return [
        name,
        len(originals),
        len(result.inputs.groups),
        f"{sum(r['covered'] for r in rows)}/{len(rows)}",
        sum(v.served for v in verdicts),
        sum(1 for v in verdicts if v.covered and not v.correct),
        f"{statistics.median(times):.1f}",
        f"{min(times):.1f}–{max(times):.1f}",
    ]


def _walk_rows(layers: int = 32, cache_len: int = 128) -> list[list[Any]]:
    """Median µs of the recorder's cache walk (`capture.record.flatten.walk`) on one decode step."""
    import timeit

    import torch
    import transformers.cache_utils as cu

    from capture.pytree import nodes
    from capture.record import flatten

    def cache(layer: Any) -> Any:
        out = cu.DynamicCache()
        out.layers = []
        for _ in range(layers):
            item, states = layer(), torch.zeros(1, 8, cache_len, 64)
            item.keys, item.values, item.is_initialized = states, states, True
            if hasattr(item, "cumulative_length"):
                item.cumulative_length = 2 * cache_len  # a full window
            out.layers.append(item)
        return out

    nodes.acquire()
    rows = []
    for name, layer in [
        ("DynamicLayer", cu.DynamicLayer),
        ("DynamicSlidingWindowLayer", lambda: cu.DynamicSlidingWindowLayer(cache_len + 1)),
    ]:
        obj = cache(layer)

        def step(obj: Any = obj) -> None:
            flatten.walk(obj, [], [])

        runs = [t / 5000 * 1e6 for t in timeit.repeat(step, number=5000, repeat=7)]
        rows.append([f"{layers} x {name}", f"{statistics.median(runs):.1f}", f"{min(runs):.1f}"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="timed exports per workload")
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="replay.export's time_budget (0: none, in-process; default: the library's)",
    )
    parser.add_argument("--walk-only", action="store_true", help="only the cache-walk timing")
    args = parser.parse_args(argv)
    walk = md_table(["cache (decode step)", "walk median µs", "min µs"], _walk_rows())
    if args.walk_only:
        print(f"#### Recorder cache walk\n\n{load_line()}\n\n{walk}")
        return 0
    options = {} if args.time_budget is None else {"time_budget": args.time_budget or None}
    rows = [_run(n, m, w, t, args.repeat, options) for n, m, w, t in _workloads(args.quick)]
    print("#### replay.export: export + coverage (all groups)\n")
    print(machine_line(("torch", "transformers")))
    print(f"\n{code_line(('capture', 'replay'))}; {load_line()}\n")
    print(
        md_table(
            [
                "workload",
                "calls",
                "groups",
                "signatures covered",
                "calls served",
                "covered but wrong",
                "median s",
                "range s",
            ],
            rows,
        )
    )
    print(f"\n#### Recorder cache walk\n\n{walk}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
