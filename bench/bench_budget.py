"""The export time budget on a model torch.export is slow on: a tiny Swin at six image sizes.

    python bench/bench_budget.py [--budget SECONDS ...] [--small N]

A `transformers.SwinModel` from a tiny config is called 20 times at six image sizes (32..72,
batch 1) under the real Recorder. For each budget (0: none, torch.export in-process),
``replay.export(model, store, time_budget=B)`` is timed, the result saved and loaded with
`replay.load`, and every ORIGINAL call (the tensors the model received) run through the
artifact's runner and compared with eager (1e-4). Then what the deadline costs an export that
ends well before it: one small ``torch.export.export`` (a tiny Llama's prefill call, dynamic
batch and sequence) run `--small` times bounded (``call_within(300, ...)``, the default budget)
and `--small` times unbounded, alternated, in this process. Prints Markdown
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import code_line, load_line, machine_line, md_table  # noqa: E402


def _record(root: str) -> tuple[Any, list[Any]]:
    from fixtures.swin import record_swin  # imports torch and transformers

    return record_swin(root)


def _run(model: Any, calls: list[Any], root: str, budget: float) -> list[Any]:
    import replay
    from fixtures.swin import served

    start = time.perf_counter()
    result = replay.export(model, root, time_budget=budget or None)
    elapsed = time.perf_counter() - start
    runner = replay.load(result.save(Path(root) / f"swin-{budget:g}.pt2"))
    answered = served(runner, model, calls)
    statics = sum("=" in name for name in result.programs)
    return [
        f"{budget:g}" if budget else "none (in-process)",
        f"{elapsed:.1f}",
        len(result.programs),
        statics,
        f"{answered}/{len(calls)}",
        result.errors.get("g0", "-")[:60],
    ]


def _small(repeat: int) -> list[Any]:
    """Seconds of one small torch.export, bounded and not, alternated (module docstring)."""
    import statistics

    import torch

    from fixtures.models import tiny_llama
    from replay.pipeline.budget.deadline import call_within

    model = tiny_llama().eval()
    ids = torch.ones(2, 8, dtype=torch.long)
    kwargs = {"input_ids": ids, "use_cache": False}
    shapes = {
        "input_ids": {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC},
        "use_cache": None,
    }

    def export() -> Any:
        return torch.export.export(model, (), kwargs, dynamic_shapes=shapes)

    export()  # imports and first-call caches, in neither column
    times: dict[str, list[float]] = {"bounded": [], "unbounded": []}
    for _ in range(repeat):
        for kind in times:
            start = time.perf_counter()
            call_within(300.0, export, model) if kind == "bounded" else export()
            times[kind].append(time.perf_counter() - start)
    bounded, unbounded = (statistics.median(times[k]) for k in ("bounded", "unbounded"))
    return [
        repeat,
        f"{bounded:.3f}",
        f"{unbounded:.3f}",
        f"{bounded / unbounded:.2f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, nargs="*", default=[60.0, 0.0])
    parser.add_argument("--small", type=int, default=10, help="small exports of each kind")
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="bench-budget-")
    model, calls = _record(root)
    rows = [_run(model, calls, root, b) for b in args.budget]
    print("### Export time budget: tiny Swin, six image sizes, 20 calls\n")
    print(machine_line())
    print(code_line())
    print(load_line() + "\n")
    header = ["time_budget s", "export s", "programs", "static", "served", "g0's error"]
    print(md_table(header, rows))
    if args.small:
        print("\n### The deadline's cost on a small export (tiny Llama, one call)\n")
        small = ["exports each", "bounded median s", "unbounded median s", "ratio"]
        print(md_table(small, [_small(args.small)]))


if __name__ == "__main__":
    main()
