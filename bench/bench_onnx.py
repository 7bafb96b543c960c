"""Benchmark of the ONNX runner against a bare ``onnxruntime.InferenceSession``, per model size:
latency per call (prefill and decode), resident memory against the weights, the mode chosen.

    python bench/bench_onnx.py [--hidden 864 1280 1536 2048] [--repeat 10] [--workdir DIR]

For each width a 2-layer LlamaForCausalLM (intermediate twice the width: 0.05, 0.11, 0.16 and
0.28 GiB of float32 weights at the defaults) is recorded under greedy generate() with
left-padded batches (4 prompts, 6 new tokens: 24 forward calls, 4 call groups) while a forward
pre-hook keeps the original calls, and exported with ``onnx=`` and merging off (4 files sharing
one weights file). Then, in fresh processes, the load of the runner in each mode (one combined
session; a session per file) and of one bare session of one file, and the
resident memory each added after one call per file (every weight read), against a baseline
taken once the process has imported what the runner imports and opened and run one tiny
onnxruntime session: onnxruntime's first session in a process sets up what all later ones
share (its kernel registries, about 10 MB whatever the model), reported in its own column.
Finally every original call through the runner in both modes, the runner's combined session
alone (fed as a bare session is: its branch's flag set, the call's arrays) and two bare
sessions of the call's file
(one opened before the runners, one after: where a session's memory lands depends on what was
opened before it), alternated in a fresh random order each round (the machine is shared:
neighbours see the same load, and no target always follows the same one): the median wall time
and the median CPU time of the calling thread (onnxruntime runs a one-thread session on it),
as ratios to the geometric mean of the two bare sessions'; in bold, those of the mode the runner
picks for the set by default (`replay.runtime.ort.sessions`). "runner - session" is the runner's
own Python work per call as it runs in place, right after onnxruntime's pass over the weights
(the median CPU time of the combined runner less that of its session alone). Prints Markdown on
stdout with the machine's load average at each size; progress goes to stderr.
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
import json, os, sys
# code, in every kind's baseline: what the runner and its first calls import
import numpy as np, onnx, torch, onnxruntime, replay
import capture.pytree.treespec, capture.pytree.unflatten, replay.runtime.ort.combined
import replay.runtime.guards
from replay.runtime.ort.runner import load_onnx
from replay.runtime.ort.manifest import read_onnx_set
from replay.runtime.allowed import register_types
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS"))
path, kind = sys.argv[1], sys.argv[2]
files = list(read_onnx_set(path).program_files().values())
# what every kind imports, before the baseline: the output types the runner registers
register_types({t for e in read_onnx_set(path).manifest.programs for t in e.pytree_types})
# onnxruntime's first session in a process sets up what every later one shares (its kernel
# registries): a one-time cost of the library, not of the model, measured apart
from onnx import helper
add = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "add",
    [helper.make_tensor_value_info("x", 1, [1])], [helper.make_tensor_value_info("y", 1, [1])])
tiny = helper.make_model(add, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
first = rss()
onnxruntime.InferenceSession(tiny, providers=["CPUExecutionProvider"]).run(
    None, {"x": np.ones(1, np.float32)})
before = rss()
runner = None
if kind == "bare-one":  # one file alone: onnxruntime's own floor for the weights
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    files = [max(files, key=lambda f: len(f.inputs))]
    session = onnxruntime.InferenceSession(
        os.path.join(os.path.dirname(path), files[0].file), options,
        providers=["CPUExecutionProvider"])
else:
    runner = load_onnx(path, mode=kind)
# One call per file at its smallest shapes: every weight is read (paged in) once.
for f in files:
    zeros = {i.name: np.zeros(i.min, dtype=i.dtype) for i in f.inputs}
    if runner is None:
        session.run(None, zeros)
    else:
        program = next(p for p in runner.programs.values() if p.file.file == f.file)
        program.run({i.path: torch.from_numpy(zeros[i.name]) for i in f.inputs})
print(json.dumps({"rss": rss() - before, "first": before - first,
                  "mode": runner.mode if runner else "bare"}))
"""

WORKLOAD = [(1, 4, True), (2, 6, True), (3, 5, True), (1, 11, True)]

BARE_FIRST = "bare, opened first"
BARE_LAST = "bare, opened last"
SESSION = "session alone"
ONE = "runner, combined"
COPIES = "runner, per file"
TARGETS = [ONE, COPIES, SESSION, BARE_FIRST, BARE_LAST]


def _bare(path: Path, threads: int) -> Any:
    """A plain onnxruntime session of one file, default options (prepacking on) but the
    threads the runners get."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _session_alone(program: Any, arrays: dict[str, Any]) -> Any:
    """The runner's combined session run on a call's numpy arrays (its branch's flag set), as
    the bare session is run: what the combined model costs, without the runner's Python work."""
    import numpy as np

    branch = program.branch
    feeds = {branch.inputs[n]: a for n, a in arrays.items()} | {branch.flag: np.array(True)}
    fetch = [branch.outputs[n] for n in program.file.outputs.names if n is not None]
    return functools.partial(program.session.run, fetch, feeds)


def _child(root: Path, path: Path, kind: str) -> dict[str, Any]:
    """A fresh process's resident memory after loading `kind` and one call per file."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), kind],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _export(hidden: int, work: Path) -> tuple[Path, list[Any], int]:
    """The recorded original calls and the ONNX set of the `hidden`-wide Llama (reused when
    `work` has it), and the weights' bytes."""
    import replay
    from fixtures.generate_traffic import record_traffic, tiny_causal

    model = tiny_causal("llama", hidden_size=hidden, intermediate_size=2 * hidden)
    weights = sum(p.nbytes for p in model.state_dict().values())
    onnx_path = work / "out" / "model.onnx"
    sys.stderr.write(f"hidden {hidden}: recording generate() traffic...\n")
    store = work / f"store-{time.time_ns()}"
    originals = record_traffic(model, store, WORKLOAD, max_new_tokens=6)
    if not Path(f"{onnx_path}.json").exists():
        sys.stderr.write(f"hidden {hidden}: exporting with onnx=...\n")
        onnx_path.parent.mkdir(parents=True, exist_ok=True)
        replay.export(model, store, onnx=onnx_path, merge=False)
    return onnx_path, originals, weights


def _time_calls(
    onnx_path: Path, originals: list[Any], threads: int, repeat: int
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]], str]:
    """Wall and thread CPU times (ns) per (kind of call, target), and the mode the runner chose."""
    import torch

    from replay.runtime.ort.manifest import read_onnx_set
    from replay.runtime.ort.runner import load_onnx
    from replay.runtime.ort.sessions import chosen_mode

    files = read_onnx_set(onnx_path).program_files()
    first = {n: _bare(onnx_path.parent / f.file, threads) for n, f in files.items()}
    one = load_onnx(onnx_path, threads=threads, mode="combined")
    copies = load_onnx(onnx_path, threads=threads, mode="per-file")
    last = {n: _bare(onnx_path.parent / f.file, threads) for n, f in files.items()}
    shuffled = functools.partial(random.Random(0).sample, k=len(TARGETS))
    wall: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    with torch.no_grad():
        for args, kwargs in originals:
            program, feeds = copies.feeds(*args, **kwargs)
            kind = "prefill" if kwargs["input_ids"].shape[-1] > 1 else "decode"
            arrays = {n: t.numpy() for n, t in feeds.items()}
            runs = {
                ONE: one,
                COPIES: copies,
                SESSION: _session_alone(one.programs[program.name], arrays),
                BARE_FIRST: functools.partial(first[program.name].run, None, arrays),
                BARE_LAST: functools.partial(last[program.name].run, None, arrays),
            }
            for _ in range(repeat):
                for name in shuffled(TARGETS):
                    a, k = copy.deepcopy((args, kwargs))
                    t, c = time.perf_counter_ns(), time.thread_time_ns()
                    runs[name](*a, **k) if name in (ONE, COPIES) else runs[name]()
                    wall.setdefault((kind, name), []).append(time.perf_counter_ns() - t)
                    cpu.setdefault((kind, name), []).append(time.thread_time_ns() - c)
    weights = onnx_path.parent / read_onnx_set(onnx_path).weights
    return wall, cpu, chosen_mode("auto", True, str(weights))


def _row(hidden: int, weights: int, measured: dict[str, Any]) -> list[str]:
    """One size's row: ratios to the bare sessions' geometric mean, memory, mode, load."""
    wall, cpu, mode, memory = (measured[k] for k in ("wall", "cpu", "mode", "memory"))

    def median(times: dict[tuple[str, str], list[float]], kind: str, name: str) -> float:
        return statistics.median(times[(kind, name)])

    def ratios(name: str) -> str:
        cells = []
        for kind in ("prefill", "decode"):
            for times in (wall, cpu):
                bare = statistics.geometric_mean(
                    median(times, kind, b) for b in (BARE_FIRST, BARE_LAST)
                )
                cells.append(f"{median(times, kind, name) / bare:.2f}")
        return "{}/{}, {}/{}".format(*cells)

    bare_decode = statistics.geometric_mean(
        median(wall, "decode", b) for b in (BARE_FIRST, BARE_LAST)
    )
    python = median(cpu, "decode", ONE) - median(cpu, "decode", SESSION)
    return [
        f"{hidden} ({weights / 2**30:.2f} GiB)",
        mode,
        f"**{ratios(ONE if mode == 'combined' else COPIES)}**",
        ratios(ONE),
        ratios(COPIES),
        ratios(SESSION),
        f"{bare_decode / 1e6:.1f} ms, {python / 1e3:.0f} µs",
        "{combined:.2f}x, {per-file:.2f}x, {bare-one:.2f}x".format(
            **{k: v["rss"] / weights for k, v in memory.items()}
        ),
        "{:.1f} MB".format(statistics.median(v["first"] for v in memory.values()) / 1e6),
        "{:.1f}".format(measured["load"]),
    ]


def main() -> int:
    """Runs the benchmark and prints the Markdown section."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, nargs="+", default=[864, 1280, 1536, 2048])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--workdir", default=None, help="keep (and reuse) the exports here")
    options = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    import torch

    from bench.common import code_line, machine_line, md_table

    torch.set_num_threads(options.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden in options.hidden:
            work = Path(options.workdir or tmp) / f"h{hidden}"
            onnx_path, originals, weights = _export(hidden, work)
            sys.stderr.write(f"hidden {hidden}: loads in fresh processes...\n")
            memory = {k: _child(root, onnx_path, k) for k in ("combined", "per-file", "bare-one")}
            sys.stderr.write(f"hidden {hidden}: timing every original call...\n")
            wall, cpu, mode = _time_calls(onnx_path, originals, options.threads, options.repeat)
            measured = {"wall": wall, "cpu": cpu, "mode": mode, "memory": memory}
            rows.append(_row(hidden, weights, measured | {"load": os.getloadavg()[0]}))
    print("### The ONNX runner against a bare session, per model size\n")
    print(f"Machine: {machine_line(('torch', 'onnxruntime', 'onnxscript'))}; ")
    print(f"{options.threads} onnxruntime thread(s); {code_line(('replay',))}; ")
    print(f"each call {options.repeat} times per target\n")
    header = [
        "hidden (weights)",
        "mode chosen",
        "runner (mode chosen) / bare: prefill wall/CPU, decode wall/CPU",
        "runner combined / bare",
        "runner per file / bare",
        "session alone / bare",
        "bare decode, runner - session",
        "RSS / weights: combined, per file, bare one file",
        "onnxruntime's first session (each baseline)",
        "load (1 min)",
    ]
    print(md_table(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
