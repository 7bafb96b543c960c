"""Benchmark of the ONNX target: export cost, size on disk, session creation, memory,
and latency per call of the ONNX runner against the ``.pt2`` runner and eager.

    python bench/bench_onnx.py [--hidden 256] [--repeat 20]

Records a 2-layer LlamaForCausalLM (``--hidden`` wide) under greedy generate() with left-padded
batches (4 prompts, 6 new tokens: 24 forward calls, 4 call groups, exported with merging off:
4 programs, 4 files) while a forward pre-hook keeps the original calls; exports it with
and without ``onnx=`` (the difference is the ONNX
cost: conversion, writing, the onnxruntime check of every row); then, in fresh processes, times
the load of the ONNX set (the runner's one session for the set, the default; its session per
file, ``share_weights=False``; plain ``onnxruntime.InferenceSession``s of the files, and of one
file alone) and of the ``.pt2`` artifact, and reads the resident memory it added, also after
one call per file (every weight read); finally the latency of every original call through
eager, the ``.pt2`` runner, both ONNX runner modes and the runner's one session alone,
alternated per call in a shuffled order with two bare sessions of the call's file fed the same
tensors (one opened before the runners, one after: where a session's memory lands depends on
what was opened before it): the median wall time and the median CPU time of the calling thread
(onnxruntime runs a one-thread session on it), each as a ratio to the geometric mean of the two
bare sessions'; then the same with the ONNX targets only (the runner's two modes and the two
bare sessions), as a server calls its runner, no torch call in between. Prints Markdown on
stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHILD = """
import json, os, sys, time
# code, in every kind's baseline: what the runner and its first calls import
import numpy as np, onnx, torch, onnxruntime, replay
import capture.pytree.treespec, replay.runtime.ort.combined, replay.runtime.guards
from replay.runtime.ort.runner import load_onnx
from replay.runtime.ort.manifest import read_onnx_set
from replay.runtime.allowed import register_types
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
path, kind = sys.argv[1], sys.argv[2]
if kind.startswith("onnx"):
    files = list(read_onnx_set(path).program_files().values())
    # what every kind imports, before the baseline: the output types the runner registers
    register_types({t for e in read_onnx_set(path).manifest.programs for t in e.pytree_types})
before = rss()
t = time.perf_counter()
runner = None
if kind.startswith("onnx-bare"):  # plain sessions, as a user would open the files
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    if kind == "onnx-bare-one":  # one file alone: onnxruntime's own floor for the weights
        files = [max(files, key=lambda f: len(f.inputs))]
    sessions = {f.file: onnxruntime.InferenceSession(
        os.path.join(os.path.dirname(path), f.file), options, providers=["CPUExecutionProvider"]
    ) for f in files}
elif kind in ("onnx", "onnx-copies"):
    runner = load_onnx(path, share_weights=kind == "onnx")
else:
    runner = replay.load(path)
seconds = time.perf_counter() - t
loaded = rss() - before
if kind.startswith("onnx"):
    # One call per file at its smallest shapes: every weight is read (paged in) once.
    for f in files:
        zeros = {i.name: np.zeros(i.min, dtype=i.dtype) for i in f.inputs}
        if runner is None:
            sessions[f.file].run(None, zeros)
        else:
            program = next(p for p in runner.programs.values() if p.file.file == f.file)
            program.run({i.path: torch.from_numpy(zeros[i.name]) for i in f.inputs})
    print(json.dumps({"load_s": seconds, "rss": loaded, "rss_run": rss() - before}))
else:
    print(json.dumps({"load_s": seconds, "rss": loaded}))
"""

WORKLOAD = [(1, 4, True), (2, 6, True), (3, 5, True), (1, 11, True)]


BARE_FIRST = "bare InferenceSession, opened before the runners (same file, same feeds)"
BARE_LAST = "bare InferenceSession, opened after the runners"
SESSION = "the runner's one session alone (same feeds)"
ONE = "ONNX runner, one session (default)"
COPIES = "ONNX runner, a session per file"
LOADS = {
    "onnx-bare-one": "one bare InferenceSession of one file",
    "onnx-bare": "a bare InferenceSession per file",
    "onnx": "ONNX runner, one session (default)",
    "onnx-copies": "ONNX runner, a session per file",
    "pt2": "replay.load of the .pt2",
}


def _bare(path: Path, threads: int) -> Any:
    """A plain onnxruntime session of one file, default options (prepacking on) but the
    threads the runners get."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _session_alone(program: Any, arrays: dict[str, Any]) -> Any:
    """The runner's one session run on a call's numpy arrays (its branch's flag set), as the
    bare session is run: what the combined model costs, without the runner's Python work."""
    import numpy as np

    branch = program.branch
    feeds = {branch.inputs[n]: a for n, a in arrays.items()} | {branch.flag: np.array(True)}
    fetch = [branch.outputs[n] for n in program.file.outputs.names if n is not None]
    return functools.partial(program.session.run, fetch, feeds)


def _latency_table(
    times: dict[tuple[str, str], list[float]],
    cpu: dict[tuple[str, str], list[float]],
    names: list[str],
) -> str:
    """Median wall and thread CPU time per call, per kind of call, as ratios to the geometric
    mean of the two bare sessions' medians."""
    from bench.common import md_table

    rows = []
    for kind in ("prefill", "decode"):
        if (kind, BARE_FIRST) not in times:
            continue
        base, base_cpu = (
            statistics.geometric_mean(
                statistics.median(m[(kind, b)]) for b in (BARE_FIRST, BARE_LAST)
            )
            for m in (times, cpu)
        )
        for name in names:
            values = times.get((kind, name), [])
            if values:
                median, on_cpu = statistics.median(values), statistics.median(cpu[(kind, name)])
                onnx = name.startswith(("ONNX", "bare", SESSION))
                rows.append(
                    [
                        kind,
                        name,
                        len(values),
                        f"{median / 1e3:.0f}",
                        f"{median / base:.3f}" if onnx else "",
                        f"{on_cpu / 1e3:.0f}",
                        f"{on_cpu / base_cpu:.3f}" if onnx else "",
                    ]
                )
    header = ["calls", "target", "n", "median µs", "/ bare*", "CPU µs (thread)", "/ bare*"]
    return md_table(header, rows)


def _child(root: Path, path: Path, kind: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), kind],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> int:
    """Runs the benchmark and prints the Markdown section."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch and onnxruntime threads (timings)"
    )
    parser.add_argument("--no-latency", action="store_true", help="sizes, load and memory only")
    parser.add_argument("--workdir", default=None, help="keep (and reuse) the export here")
    options = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    import torch

    import replay
    from bench.common import code_line, machine_line, md_table
    from fixtures.generate_traffic import record_traffic, tiny_causal
    from replay.runtime.ort.manifest import read_onnx_set
    from replay.runtime.ort.runner import load_onnx

    hidden = options.hidden
    torch.set_num_threads(options.threads)
    model = tiny_causal("llama", hidden_size=hidden, intermediate_size=2 * hidden)
    weights = sum(p.nbytes for p in model.state_dict().values())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(options.workdir or tmp)
        onnx_path, pt2 = work / "out" / "model.onnx", work / "model.pt2"
        sys.stderr.write("recording generate() traffic...\n")
        store = work / f"store-{time.time_ns()}"
        originals = record_traffic(model, store, WORKLOAD, max_new_tokens=6)
        torch_s = onnx_s = float("nan")
        if not Path(f"{onnx_path}.json").exists() or not pt2.exists():
            sys.stderr.write("exporting without ONNX...\n")
            t = time.perf_counter()
            plain = replay.export(model, store, merge=False)
            torch_s = time.perf_counter() - t
            plain.save(pt2)
            sys.stderr.write("exporting with ONNX...\n")
            onnx_path.parent.mkdir(exist_ok=True)
            t = time.perf_counter()
            replay.export(model, store, onnx=onnx_path, merge=False)
            onnx_s = time.perf_counter() - t
        on_disk = sum(f.stat().st_size for f in onnx_path.parent.iterdir() if f.suffix != ".json")
        loads = {
            kind: _child(root, p, kind)
            for kind, p in [
                ("onnx-bare-one", onnx_path),
                ("onnx-bare", onnx_path),
                ("onnx", onnx_path),
                ("onnx-copies", onnx_path),
                ("pt2", pt2),
            ]
        }
        router = replay.load(pt2)
        # Where a session's memory lands depends on what was opened before it (measured: the
        # sessions opened last ran up to 10 % faster), so bare sessions are opened both before
        # and after the runners, and the ratios are to the geometric mean of the two.
        files = read_onnx_set(onnx_path).program_files()
        first = {n: _bare(onnx_path.parent / f.file, options.threads) for n, f in files.items()}
        one = load_onnx(onnx_path, threads=options.threads)
        copies = load_onnx(onnx_path, threads=options.threads, share_weights=False)
        targets = {
            "eager": model,
            "pt2 runner": router,
            ONE: one,
            COPIES: copies,
        }
        last = {n: _bare(onnx_path.parent / f.file, options.threads) for n, f in files.items()}
        sys.stderr.write("timing every original call...\n")
        shuffled = functools.partial(random.Random(0).sample, k=len(targets) + 3)
        shuffled_onnx = functools.partial(random.Random(1).sample, k=4)
        times: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        # the same, ONNX targets only: a serving process calls its runner call after call,
        # with no eager torch in between to evict what the runner's Python work reads
        onnx_only = [ONE, COPIES, BARE_FIRST, BARE_LAST]
        times_onnx: dict[tuple[str, str], list[float]] = {}
        cpu_onnx: dict[tuple[str, str], list[float]] = {}
        with torch.no_grad():
            for args, kwargs in [] if options.no_latency else originals:
                group = router.select(*args, **kwargs)
                kind = "prefill" if group.startswith("prefill") else "decode"
                program, feeds = copies.feeds(*args, **kwargs)
                arrays = {n: t.numpy() for n, t in feeds.items()}
                # alternated per call, in a fresh random order each round: the machine is
                # shared (neighbours see the same load), and a call's speed depends on what
                # ran before it (caches), so no target always follows the same one
                runs = {
                    **targets,
                    BARE_FIRST: functools.partial(first[program.name].run, None, arrays),
                    BARE_LAST: functools.partial(last[program.name].run, None, arrays),
                    SESSION: _session_alone(one.programs[program.name], arrays),
                }
                for _ in range(options.repeat):
                    for order, wall, on_cpu in (
                        (shuffled(list(runs)), times, cpu),
                        (shuffled_onnx(onnx_only), times_onnx, cpu_onnx),
                    ):
                        for name in order:
                            a, k = copy.deepcopy((args, kwargs))
                            t, c = time.perf_counter_ns(), time.thread_time_ns()
                            runs[name](*a, **k) if name in targets else runs[name]()
                            wall.setdefault((kind, name), []).append(time.perf_counter_ns() - t)
                            on_cpu.setdefault((kind, name), []).append(time.thread_time_ns() - c)
    print(f"### ONNX target: 2-layer Llama, hidden {hidden}, 4 groups\n")
    print(f"Machine: {machine_line(('torch', 'onnxruntime', 'onnxscript'))}; timings with ")
    print(f"{options.threads} thread(s) for torch and onnxruntime; {code_line(('replay',))}; ")
    print("load average {:.2f} / {:.2f} / {:.2f} at the end\n".format(*os.getloadavg()))
    print(
        md_table(
            ["what", "value"],
            [
                ["export, torch only (4 groups, checks)", f"{torch_s:.1f} s"],
                ["export with onnx= (+ conversion, write, onnxruntime check)", f"{onnx_s:.1f} s"],
                ["weights (parameters + buffers)", f"{weights / 2**20:.2f} MiB"],
                [
                    "ONNX set on disk (4 files + shared weights)",
                    f"{on_disk / 2**20:.2f} MiB ({on_disk / weights:.3f}x)",
                ],
                *[
                    [
                        f"load: {LOADS[kind]} (fresh process)",
                        f"{v['load_s'] * 1e3:.0f} ms, +{v['rss'] / 2**20:.1f} MiB RSS"
                        + (
                            f" (+{v['rss_run'] / 2**20:.1f} MiB after one call per file: "
                            f"{v['rss_run'] / weights:.2f}x the weights)"
                            if "rss_run" in v
                            else ""
                        ),
                    ]
                    for kind, v in loads.items()
                ],
            ],
        )
    )
    print()
    print(_latency_table(times, cpu, [BARE_FIRST, BARE_LAST, SESSION, *targets]))
    print("\n\\* bare: the geometric mean of the two bare sessions' medians\n")
    print("ONNX targets only, in a shuffled order per round (no torch call in between):\n")
    print(_latency_table(times_onnx, cpu_onnx, onnx_only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
