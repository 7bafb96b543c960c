"""Benchmark of the shipped artifact: `replay.load` time and the runner's routing cost per call.

    python bench/bench_artifact.py [--repeat N]

Records a tiny LlamaForCausalLM's generate() traffic (fixtures: batch 1-3, 5 prompts), exports
every group, saves the artifact, then in a fresh Python process: times `replay.load` (imports
included), measures the RSS it adds (anonymous and file-backed) and what a second load of the
same file adds (the difference is the modules the first load imports), and, on one original
decode call (a forward pre-hook copy), the median of N calls of the runner against N calls of
the program's own ``ep.module()`` (the runner adds the structure match and the range guards).
Prints one Markdown section on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import copy, gc, json, os, statistics, sys, time
def rss():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) * 1024
    return out
t0 = time.perf_counter()
import torch
import replay
base = rss()
runner = replay.load(sys.argv[1])
load_s = time.perf_counter() - t0
gc.collect()
first = rss()
again_runner = replay.load(sys.argv[1])  # modules imported now: what one more load costs
gc.collect()
again = rss()
del again_runner
from fixtures.models import prompts, tiny_llama
model = tiny_llama(0)
calls = []
model.register_forward_pre_hook(lambda m, a, k: calls.append(copy.deepcopy(k)), with_kwargs=True)
with torch.no_grad():
    model.generate(
        **prompts(2, 7), max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0
    )
call = calls[-1]
group = runner.select(**call)
program = runner.programs[group].module()
def timed(fn):
    out = []
    for _ in range(int(sys.argv[2])):
        kwargs = copy.copy(call)
        t = time.perf_counter_ns(); fn(**kwargs); out.append(time.perf_counter_ns() - t)
    return statistics.median(out) / 1e3
with torch.no_grad():
    timed(runner); timed(program)
    runner_us, program_us = timed(runner), timed(program)
    route_us = timed(runner.select)
result = {"load_s": load_s, "group": group, "runner_us": runner_us, "program_us": program_us,
          "route_us": route_us, "load_avg": os.getloadavg()[0], "base": base, "first": first,
          "again": again}
print(json.dumps(result))
"""


def main() -> int:
    """Runs the benchmark and prints the Markdown section."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    options = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    import replay
    from fixtures.stores import record_llama

    with tempfile.TemporaryDirectory() as tmp:
        sys.stderr.write("recording and exporting the tiny Llama...\n")
        model, _ = record_llama(Path(tmp) / "store")
        artifact = Path(tmp) / "llama.pt2"
        replay.export(model, Path(tmp) / "store").save(artifact)
        size = artifact.stat().st_size
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(artifact), str(options.repeat)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
    result = json.loads(done.stdout)
    print("### Artifact: load and routing (tiny Llama, 4 programs)\n")
    print("| | |\n|---|---|")
    print(f"| archive size | {size / 1e6:.1f} MB |")
    print(f"| `import torch, replay` + `replay.load` (fresh process) | {result['load_s']:.2f} s |")
    print(
        f"| decode call (group {result['group']}), `ep.module()` alone, median | "
        f"{result['program_us']:.0f} µs |"
    )
    print(f"| the same call through the runner, median | {result['runner_us']:.0f} µs |")
    print(f"| `runner.select` alone (match + guards), median | {result['route_us']:.0f} µs |")
    print(f"| load average (1 min) during the run | {result['load_avg']:.1f} |")
    grow = {k: result["first"][k] - result["base"][k] for k in ("RssAnon", "RssFile")}
    more = {k: result["again"][k] - result["first"][k] for k in ("RssAnon", "RssFile")}
    print(
        f"| RSS growth of the first `replay.load` (after `import torch, replay`) | anon "
        f"{grow['RssAnon'] / 2**20:.0f} MiB, file {grow['RssFile'] / 2**20:.0f} MiB |"
    )
    print(
        f"| RSS growth of a second `replay.load` of the same file | anon "
        f"{more['RssAnon'] / 2**20:.0f} MiB, file {more['RssFile'] / 2**20:.0f} MiB |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
