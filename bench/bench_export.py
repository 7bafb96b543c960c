"""Export + coverage time of `capture demo`'s decode group: recorded signatures only vs probes.

    python bench/bench_export.py            # 3 repetitions per variant
    python bench/bench_export.py --quick    # 1 repetition

Records the demo's workload once (`capture.cli.demo.WORKLOAD` through `generate()` on the
demo's tiny Llama, as `capture demo` does) into a temporary store, then times
`replay.export(model, store, model_name=DEMO_MODEL, groups=[EXPORT_GROUP], ...)`
(torch.export of the group plus the coverage check) in this process, per variant,
interleaved across repetitions:

- ``probes=0``: the recorded signatures only, the check before probes existed (the baseline);
- ``probes=4``: the default, every recorded signature plus up to 4 probes;
- ``named_dims=True``: the default probes with named dims (torch 2.13 rejects the named cache
  Dim of this grouped-query attention model, so a second export with bounded hints runs).

Every program goes through the loader's validation before its rows are claimed
(`replay.artifact.loadable.refusal`); the time it takes inside each export is measured apart
(the ``validation s`` column: its median over the repetitions).

Prints one Markdown section on stdout (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import code_line, load_line, machine_line, md_table, median  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "probes=0 (recorded only, before)": {"probes": 0},
    "probes=4 (default, after)": {"probes": 4},
    "probes=4, named_dims=True": {"probes": 4, "named_dims": True},
}


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark and prints its Markdown section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition per variant")
    options = parser.parse_args(argv)
    import torch

    import replay
    import replay.pipeline.chain as chain
    from capture.cli.demo import DEMO_MODEL, EXPORT_GROUP, MAX_NEW_TOKENS, WORKLOAD
    from capture.record.recorder import Recorder
    from fixtures.models import run_generate, tiny_llama

    repeats = 1 if options.quick else 3
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    validation: dict[str, list[float]] = {name: [] for name in VARIANTS}
    spent = [0.0]
    checked = chain.refusal

    def timed(*args: Any, **kwargs: Any) -> str | None:
        start = time.perf_counter()
        try:
            return checked(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    chain.refusal = timed  # type: ignore[assignment]
    rows: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as root:
        model = tiny_llama(seed=0)
        with Recorder(model, root, name=DEMO_MODEL):
            run_generate(model, WORKLOAD, max_new_tokens=MAX_NEW_TOKENS)
        for rep in range(repeats):
            for name, kwargs in VARIANTS.items():
                print(f"[{rep + 1}/{repeats}] {name}", file=sys.stderr)
                torch.manual_seed(0)
                spent[0] = 0.0
                start = time.perf_counter()
                result = replay.export(
                    model, root, model_name=DEMO_MODEL, groups=[EXPORT_GROUP], **kwargs
                )
                times[name].append(time.perf_counter() - start)
                validation[name].append(spent[0])
                kinds = result.coverage.column("kind").to_pylist()
                rows[name] = (
                    f"{kinds.count('recorded')} recorded + {kinds.count('probe')} probes, "
                    f"complete={result.complete}"
                )
    table = md_table(
        ["variant", "coverage rows", "median s", "min s", "max s", "validation s"],
        [
            [
                name,
                rows[name],
                f"{median(t):.1f}",
                f"{min(t):.1f}",
                f"{max(t):.1f}",
                f"{median(validation[name]):.2f}",
            ]
            for name, t in times.items()
        ],
    )
    print(f"### Export + coverage of the demo's {EXPORT_GROUP} group\n")
    print(f"Machine: {machine_line(('torch', 'transformers'))}. {load_line()} at the end.")
    print(f"Code: {code_line(('replay',))}. {repeats} repetition(s), interleaved.\n")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
