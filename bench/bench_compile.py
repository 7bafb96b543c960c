"""torch.compile warm start: graphs compiled for real generate() traffic, with and without hints.

    python bench/bench_compile.py [--quick]

A tiny Llama's greedy ``generate()`` traffic is recorded with the real Recorder; then the same
model runs the recorded workload and a second workload of new (batch, prompt length) pairs
inside the recorded ranges, with ``model.forward = torch.compile(model.forward,
backend="aot_eager")``, once as is and once after ``replay.compile_hints(store).apply(model)``.
Graphs are counted with torch's own counter (``torch._dynamo.utils.counters["stats"]
["unique_graphs"]``) after each workload; frames compiled (``counters["frames"]["total"]``)
beside them; seconds are the wall time of both workloads (compilation included). Prints
Markdown (docs/benchmarks.md holds the result).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import code_line, load_line, machine_line, md_table  # noqa: E402

RECORDED = [(2, 5), (3, 8), (1, 6), (4, 9), (2, 12), (3, 4)]
INSIDE = [(3, 6), (2, 7), (4, 5), (2, 10), (3, 11)]
"""Inside the recorded ranges of their groups (batch 1 runs without a mask: its own groups)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two requests per workload")
    options = parser.parse_args()
    recorded = RECORDED[:2] if options.quick else RECORDED
    inside = INSIDE[:2] if options.quick else INSIDE

    import capture
    import replay
    from fixtures.compile_traffic import compiled_generate
    from fixtures.models import run_generate, tiny_llama

    model = tiny_llama(0)
    with tempfile.TemporaryDirectory() as root:
        with capture.Recorder(model, root, name="llama"):
            run_generate(model, recorded, max_new_tokens=3)
        hints = replay.compile_hints(root)
    groups = len(hints.groups)
    runs = {
        "without hints": compiled_generate(model, [recorded, inside]),
        "with `compile_hints`": compiled_generate(model, [recorded, inside], hints),
    }
    print("## torch.compile warm start\n")
    print(f"{machine_line(('torch', 'transformers'))}; {load_line()}; {code_line()}\n")
    print(
        f"tiny Llama, {len(recorded)} recorded generate() requests ({groups} call groups), "
        f"then {len(inside)} new requests inside the recorded ranges; aot_eager backend\n"
    )
    rows = [
        [name, r.graphs[0], r.graphs[1] - r.graphs[0], r.graphs[1], r.frames[1], f"{r.seconds:.1f}"]
        for name, r in runs.items()
    ]
    headers = ["run", "graphs (recorded)", "new graphs (inside)", "graphs", "frames", "s"]
    print(md_table(headers, rows))


if __name__ == "__main__":
    main()
