"""capture and replay on a GPU: load, per-call cost, the recorder under generate(), both devices.

    python bench/bench_cuda.py WORK [--device cuda] [--quick] [--aoti]

One run measures, on a bf16 Llama of 8 layers (hidden 1024, vocab 32000: 0.39 GB of weights;
``--quick``: the tests' 2-layer tiny Llama in float32, for a dry run on a CPU):

- **load**: ``replay.load(path, device=D)`` against ``from_pretrained(dir, device_map=D)`` of
  the same weights (each in a fresh child process, the median of 3), and each one's first
  answer (a prefill) counted from the start of the load;
- **per call**: the runner against eager on the original calls the model received under
  ``generate()`` (a forward pre-hook's copies), a prefill and a decode step at batch 1 and 8:
  the median of ``--calls`` calls each, every call synchronized, eager and runner alternating;
- **the recorder**: ``generate()`` with and without a Recorder in ``--rounds`` paired rounds
  (the per-step difference as a share of a decode step, median and spread), and the per-call
  cost of ``value_ranges="all"`` against the default on decode calls; the device
  synchronizations a recorded call adds (``torch.cuda.set_sync_debug_mode``);
- **both devices**: an artifact exported on the CPU serves the device's calls, and one
  exported on the device serves the CPU's, every answer checked against eager there;
- ``--aoti``: ``save(aoti=True)``, ``replay.load(compiled=True)`` and a decode step at batch 1
  against eager.

Prints Markdown tables (docs/benchmarks.md holds the result) and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import md_table  # noqa: E402

BIG = dict(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=8,
    max_position_embeddings=2048,
)
# (batch, prompt length, with mask): batch 1 without a mask, batch 8 left-padded.
WORKLOAD = ((1, 32, False), (8, 32, True), (1, 48, False), (8, 24, True))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _model(device: str, quick: bool) -> Any:
    import torch

    from fixtures.generate_traffic import tiny_causal

    if quick:
        return tiny_causal("llama").to(device)
    return tiny_causal("llama", dtype=torch.bfloat16, **BIG).to(device)


def _timed(device: str, fn: Callable[[], Any]) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _per_call(device: str, model: Any, runner: Any, call: Any, n: int) -> tuple[float, float]:
    """Median seconds of eager and of the runner on one original call (fresh copies each)."""
    import torch

    eager, served = [], []
    with torch.no_grad():
        for _ in range(3):  # warm both
            model(*copy.deepcopy(call[0]), **copy.deepcopy(call[1]))
            runner(*copy.deepcopy(call[0]), **copy.deepcopy(call[1]))
        for _ in range(n):
            a, k = copy.deepcopy(call)
            eager.append(_timed(device, lambda a=a, k=k: model(*a, **k)))
            a, k = copy.deepcopy(call)
            served.append(_timed(device, lambda a=a, k=k: runner(*a, **k)))
    return statistics.median(eager), statistics.median(served)


def _pick(originals: list[Any], batch: int, decode: bool) -> Any:
    """The first original call of `batch` rows that is a decode step (one new token) or not."""
    for args, kwargs in originals:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[0] == batch and (ids.shape[1] == 1) == decode:
            return args, kwargs
    raise SystemExit(f"no {'decode' if decode else 'prefill'} call at batch {batch}")


_LOAD_CHILD = """
import sys, time, torch
sys.path.insert(0, {root!r})
start = time.perf_counter()
if {which!r} == "replay":
    import replay
    model = replay.load({artifact!r}, device={device!r})
else:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained({weights!r}, device_map={device!r}, dtype="auto")
if {device!r}.startswith("cuda"):
    torch.cuda.synchronize()
print(time.perf_counter() - start)
"""


def _load_in_child(which: str, work: Path, device: str) -> float:
    """Seconds `which` takes to load in a fresh process (torch imported first), median of 3."""
    code = _LOAD_CHILD.format(
        root=str(ROOT),
        which=which,
        artifact=str(work / "model.pt2"),
        weights=str(work / "weights"),
        device=device,
    )
    runs = []
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
        runs.append(float(out[-1]))
    return statistics.median(runs)


def _first_answer(which: str, work: Path, device: str, call: Any) -> float:
    """Seconds from the start of a load to the first answer (an original prefill), here."""
    import torch
    from transformers import AutoModelForCausalLM

    import replay

    a, k = copy.deepcopy(call)
    _sync(device)
    start = time.perf_counter()
    if which == "replay":
        model: Any = replay.load(work / "model.pt2", device=device)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            work / "weights", device_map=device, dtype="auto"
        )
    with torch.no_grad():
        model(*a, **k)
    _sync(device)
    return time.perf_counter() - start


def _recorder_rounds(device: str, model: Any, work: Path, rounds: int) -> dict[str, float]:
    """Per-step seconds of generate() bare and recorded, paired rounds; the overhead's spread."""
    import torch

    import capture
    from capture.demo_model import prompts

    steps = 16
    inputs = {k: v.to(device) for k, v in prompts(1, 32).items()}
    inputs.pop("attention_mask")

    def generate() -> None:
        model.generate(
            **inputs, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0
        )

    shares = []
    bare_steps = []
    with torch.no_grad():
        generate()
        for i in range(rounds):
            bare = _timed(device, generate)
            with capture.Recorder(model, work / f"rounds-{i}", name="llama"):
                recorded = _timed(device, generate)
            bare_steps.append(bare / steps)
            shares.append((recorded - bare) / bare)
    return {
        "decode_step_ms": statistics.median(bare_steps) * 1e3,
        "overhead_median_pct": statistics.median(shares) * 100,
        "overhead_min_pct": min(shares) * 100,
        "overhead_max_pct": max(shares) * 100,
    }


def _value_ranges(device: str, model: Any, call: Any, work: Path, n: int) -> dict[str, float]:
    """Per-call µs a recorder adds with value_ranges 'cpu' (default) and 'all'; syncs added."""
    import torch

    import capture

    def cost(ranges: str | None) -> float:
        times = []
        recorder = (
            capture.Recorder(model, work / f"ranges-{ranges}", name="llama", value_ranges=ranges)
            if ranges
            else None
        )
        if recorder:
            recorder.start()
        try:
            with torch.no_grad():
                for _ in range(n):
                    a, k = copy.deepcopy(call)
                    times.append(_timed(device, lambda a=a, k=k: model(*a, **k)))
        finally:
            if recorder:
                recorder.stop()
        return statistics.median(times)

    bare = cost(None)
    out = {
        "default_us": (cost("cpu") - bare) * 1e6,
        "all_us": (cost("all") - bare) * 1e6,
    }
    if device.startswith("cuda"):
        out["syncs_bare"], out["syncs_recorded"] = _syncs(model, call, work)
    return out


def _syncs(model: Any, call: Any, work: Path) -> tuple[int, int]:
    """Synchronization warnings of one call, bare and under a value_ranges='all' recorder."""
    import torch

    import capture

    def count() -> int:
        a, k = copy.deepcopy(call)
        with warnings.catch_warnings(record=True) as seen, torch.no_grad():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model(*a, **k)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in seen)

    bare = count()
    with capture.Recorder(model, work / "syncs", name="llama", value_ranges="all"):
        recorded = count()
    return bare, recorded


def _cross(model: Any, work: Path, device: str, quick: bool) -> dict[str, str]:
    """An artifact exported on one device serves the other's original calls, checked."""
    import replay
    from fixtures.generate_traffic import record_traffic, serve_originals

    out = {}
    cpu_model = _model("cpu", quick)
    cpu_model.load_state_dict(model.state_dict())
    on = {"cpu": cpu_model, device: model}
    workload = WORKLOAD[:2]
    for made, served in (("cpu", device), (device, "cpu")):
        store = work / f"cross-{made}"
        record_traffic(on[made], store, workload, name="llama")
        replay.export(on[made], store, model_name="llama").save(work / f"cross-{made}.pt2")
        originals = record_traffic(on[served], work / f"cross-calls-{served}", workload)
        runner = replay.load(work / f"cross-{made}.pt2", device=served)
        tol = 2e-2 if not quick else 1e-4
        verdicts = serve_originals(on[served], runner, originals, atol=tol, rtol=tol)
        good = sum(v.correct for v in verdicts)
        out[f"exported on {made}, served on {served}"] = f"{good}/{len(verdicts)}"
    return out


def _aoti(device: str, model: Any, result: Any, work: Path, call: Any, n: int) -> dict[str, Any]:
    import replay

    started = time.perf_counter()
    result.save(work / "compiled.pt2", aoti=True)
    saved = time.perf_counter() - started
    runner = replay.load(work / "compiled.pt2", device=device, compiled=True)
    eager, compiled = _per_call(device, model, runner, call, n)
    return {"save_s": saved, "eager_ms": eager * 1e3, "compiled_ms": compiled * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="a tiny float32 Llama: a dry run")
    parser.add_argument("--calls", type=int, default=50, help="timed calls per case")
    parser.add_argument("--rounds", type=int, default=20, help="paired generate() rounds")
    parser.add_argument("--aoti", action="store_true", help="also compile with AOTInductor")
    options = parser.parse_args()
    work: Path = options.work
    work.mkdir(parents=True, exist_ok=True)

    import torch
    import transformers

    import replay
    from fixtures.generate_traffic import record_traffic, serve_originals

    device = options.device
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"device {name}; torch {torch.__version__}; transformers {transformers.__version__}\n")
    model = _model(device, options.quick)
    model.save_pretrained(work / "weights")
    weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9

    started = time.perf_counter()
    originals = record_traffic(model, work / "store", WORKLOAD, name="llama", max_new_tokens=8)
    result = replay.export(model, work / "store", model_name="llama")
    exported = time.perf_counter() - started
    result.save(work / "model.pt2")
    runner = replay.load(work / "model.pt2", device=device)
    tol = 1e-4 if options.quick else 2e-2
    verdicts = serve_originals(model, runner, originals, atol=tol, rtol=tol)
    correct = sum(v.correct for v in verdicts)
    print(
        f"{weights_gb:.2f} GB of weights; {len(originals)} original calls, exported and "
        f"recorded in {exported:.0f} s; {correct}/{len(verdicts)} served equal to eager\n"
    )

    prefill_1 = _pick(originals, 1, False)
    load = {
        w: (_load_in_child(w, work, device), _first_answer(w, work, device, prefill_1))
        for w in ("from_pretrained", "replay")
    }
    rows = [
        [
            what,
            f"{load['from_pretrained'][i]:.3f}",
            f"{load['replay'][i]:.3f}",
            f"{load['replay'][i] / load['from_pretrained'][i]:.2f}",
        ]
        for i, what in enumerate(("load, fresh process (s)", "load to first answer (s)"))
    ]
    calls = {}
    for batch in (1, 8):
        for decode in (False, True):
            kind = "decode" if decode else "prefill"
            eager, served = _per_call(
                device, model, runner, _pick(originals, batch, decode), options.calls
            )
            calls[f"{kind} b{batch}"] = (eager, served)
            rows.append(
                [
                    f"{kind}, batch {batch} (ms)",
                    f"{eager * 1e3:.2f}",
                    f"{served * 1e3:.2f}",
                    f"{served / eager:.2f}",
                ]
            )
    print(md_table(["", "eager / from_pretrained", "replay", "ratio"], rows), "\n")

    decode_1 = _pick(originals, 1, True)
    recorder = _recorder_rounds(device, model, work, options.rounds)
    ranges = _value_ranges(device, model, decode_1, work, options.calls)
    print(
        md_table(
            ["recorder", "value"], [[k, f"{v:.2f}"] for k, v in {**recorder, **ranges}.items()]
        )
    )
    cross = _cross(model, work, device, options.quick)
    print("\n" + md_table(["artifact", "served equal to eager"], list(cross.items())))
    compiled = _aoti(device, model, result, work, decode_1, options.calls) if options.aoti else {}
    if compiled:
        speed = compiled["eager_ms"] / compiled["compiled_ms"]
        print(
            f"\nAOTInductor: saved in {compiled['save_s']:.0f} s; decode batch 1 "
            f"{compiled['compiled_ms']:.2f} ms vs eager {compiled['eager_ms']:.2f} ms "
            f"({speed:.2f}x eager's speed)"
        )
    print(
        json.dumps(
            {
                "device": name,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "weights_gb": weights_gb,
                "served": correct,
                "calls": len(verdicts),
                "load": load,
                "per_call_s": calls,
                "recorder": recorder,
                "value_ranges": ranges,
                "cross": cross,
                "aoti": compiled,
            }
        )
    )


if __name__ == "__main__":
    main()
