"""Benchmark of the runners' own Python per call, beside the time of the program they run.

    python bench/bench_runner_call.py [--repeat N] [--profile]

Records a tiny LlamaForCausalLM's generate() traffic (fixtures: batch 1-3, 5 prompts), exports
it as a ``.pt2`` artifact and as an ONNX set, loads both, and on one original decode call and
one original prefill call (forward pre-hook copies) reports the lowest of five medians of N
calls each:

- **program**: the program alone (``ep.module()`` for the ``.pt2`` runner; onnxruntime's
  ``run`` on the runner's own feeds for the ONNX runner);
- **runner**: the same call through the runner;
- **runner Python**: the runner with its engine answered at once by the answer the engine gave
  the same call (the ``.pt2`` program's fx graph; onnxruntime's run): routing, guards, the
  program's flattening and size checks, feeds, output conversion and the output tree, with no
  engine time in it.

Prints one Markdown section on stdout (with the machine's load average); progress goes to
stderr. ``--profile`` also prints the top of a cProfile of the ONNX runner's Python on stderr.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _median_us(fn: Callable[..., Any], call: dict[str, Any], repeat: int) -> float:
    """The wall time of ``fn(**call)`` in µs (a shallow copy each): the lowest of five medians
    of `repeat` calls, so that a loaded machine's pauses weigh less."""
    medians = []
    for _ in range(5):
        out = []
        for _ in range(repeat):
            kwargs = copy.copy(call)
            t = time.perf_counter_ns()
            fn(**kwargs)
            out.append(time.perf_counter_ns() - t)
        medians.append(statistics.median(out) / 1e3)
    return min(medians)


class _Answered:
    """An onnxruntime session's C object stand-in that returns one call's answer at once."""

    def __init__(self, real: Any, fetch: list[str], feeds: dict[str, Any], numpy: bool) -> None:
        self._arrays = real.run(fetch, feeds, None) if numpy else None
        self._values = None if numpy else real.run_with_ort_values(feeds, fetch, None)

    def run(self, fetch: Any, feeds: Any, options: Any) -> Any:
        return self._arrays

    def run_with_ort_values(self, feeds: Any, fetch: Any, options: Any) -> Any:
        return self._values


def _feed(t: Any, numpy: bool) -> Any:
    """A tensor as the runner feeds it to onnxruntime (a numpy array or a DLPack OrtValue)."""
    from replay.runtime.ort.program import _ort_value

    return t.numpy() if numpy else _ort_value(t)


def _pt2(artifact: Path, call: dict[str, Any], repeat: int) -> dict[str, float]:
    """The ``.pt2`` runner's figures on one call."""
    import torch.utils._pytree as pytree

    import replay

    runner: Any = replay.load(artifact)
    entry, _ = runner._router.route((), runner._router.spelled(dict(call)))
    module = runner._runnables[entry.program]
    program_us = _median_us(module, call, repeat)
    runner_us = _median_us(runner, call, repeat)
    # the graph answers at once: what is left is the runner's and the program's own Python
    # (flattening the call, the program's size checks, the output tree)
    graph = module.graph_module
    args, kwargs = (), {k: call[k] for k in module._keys}
    flat = pytree.tree_flatten((args, kwargs))[0]
    answer = graph(*[flat[src] if t is None else t for src, t in module._wiring.feeds])
    module.graph_module = lambda *values: answer
    python_us = _median_us(runner, call, repeat)
    return {"program": program_us, "runner": runner_us, "python": python_us}


def _onnx(target: Path, call: dict[str, Any], repeat: int, profile: bool) -> dict[str, float]:
    """The ONNX runner's figures on one call."""
    import replay

    runner: Any = replay.load(target)
    program, by_name = runner.feeds(**call)
    sess = program.session._sess
    fetch = program._fetch
    numpy = program._numpy
    feeds = {**program._flags, **{k: _feed(v, numpy) for k, v in by_name.items()}}
    program_us = _median_us(lambda: sess.run(fetch, feeds, None), {}, repeat)
    runner_us = _median_us(runner, call, repeat)
    runner(**call)  # the output builder made
    program.session = type("Session", (), {"_sess": _Answered(sess, fetch, feeds, numpy)})()
    python_us = _median_us(runner, call, repeat)
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(repeat):
            runner(**copy.copy(call))
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    return {"program": program_us, "runner": runner_us, "python": python_us}


def main() -> int:
    """Runs the benchmark and prints the Markdown section."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--profile", action="store_true")
    options = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    import torch

    import replay
    from fixtures.models import prompts
    from fixtures.stores import record_llama

    torch.set_num_threads(1)
    calls: list[dict[str, Any]] = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sys.stderr.write("recording and exporting the tiny Llama...\n")
        model, _ = record_llama(Path(tmp) / "store")
        result = replay.export(model, Path(tmp) / "store", onnx=Path(tmp) / "llama.onnx")
        result.save(Path(tmp) / "llama.pt2")
        hook = model.register_forward_pre_hook(
            lambda m, a, k: calls.append(copy.deepcopy(k)), with_kwargs=True
        )
        with torch.no_grad():
            model.generate(
                **prompts(2, 7), max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0
            )
        hook.remove()
        with torch.no_grad():
            for kind, call in (("prefill", calls[0]), ("decode", calls[-1])):
                sys.stderr.write(f"timing the {kind} call...\n")
                pt2 = _pt2(Path(tmp) / "llama.pt2", call, options.repeat)
                onnx = _onnx(Path(tmp) / "llama.onnx", call, options.repeat, options.profile)
                rows.append((kind, pt2, onnx))
    print("### Runner: its own Python per call (tiny Llama, batch 2)\n")
    print("| call | artifact | program alone | through the runner | Python, engine stubbed |")
    print("|---|---|---|---|---|")
    for kind, pt2, onnx in rows:
        for name, got in ((".pt2", pt2), ("ONNX", onnx)):
            print(
                f"| {kind} | {name} | {got['program']:.0f} µs | {got['runner']:.0f} µs | "
                f"{got['python']:.1f} µs |"
            )
    load = os.getloadavg()[0]
    print(f"\nLowest of 5 medians of {options.repeat} calls; load average (1 min) {load:.1f}.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
