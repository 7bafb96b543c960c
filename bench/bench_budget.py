"""The export time budget on a model torch.export is slow on: a tiny Swin at six image sizes.

    python bench/bench_budget.py [--budget SECONDS ...]

A `transformers.SwinModel` from a tiny config is called 20 times at six image sizes (32..72,
batch 1) under the real Recorder. For each budget (0: none, torch.export in-process),
``replay.export(model, store, time_budget=B)`` is timed, the result saved and loaded with
`replay.load`, and every ORIGINAL call (the tensors the model received) run through the
artifact's runner and compared with eager (1e-4). Prints Markdown (docs/benchmarks.md).
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
    import torch

    import replay

    start = time.perf_counter()
    result = replay.export(model, root, time_budget=budget or None)
    elapsed = time.perf_counter() - start
    runner = replay.load(result.save(Path(root) / f"swin-{budget:g}.pt2"))
    served = 0
    for x in calls:
        with torch.no_grad():
            want = model(pixel_values=x).last_hidden_state
            try:
                got = runner(pixel_values=x).last_hidden_state
            except Exception:  # noqa: BLE001 - a call the artifact does not serve
                continue
        served += bool(torch.allclose(got, want, atol=1e-4, rtol=1e-4))
    statics = sum("=" in name for name in result.programs)
    return [
        f"{budget:g}" if budget else "none (in-process)",
        f"{elapsed:.1f}",
        len(result.programs),
        statics,
        f"{served}/{len(calls)}",
        result.errors.get("g0", "-")[:60],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, nargs="+", default=[60.0, 0.0])
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


if __name__ == "__main__":
    main()
