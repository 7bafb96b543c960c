"""The CUDA checks: the recorder on GPU tensors, and an artifact loaded and served on CUDA.

    python tools/cuda_check.py prepare DIR   # here, on CPU: record, export, save
    python tools/cuda_check.py run DIR       # on a machine with CUDA (--device cpu: a dry run)

``prepare`` records a tiny Llama's ``generate()`` traffic on CPU, exports it with `replay.export`
and saves the artifact (``DIR/llama.pt2``) and the model's weights and config
(``DIR/model``, ``save_pretrained``). ``run`` moves that model to CUDA and serves the same
workload there under a Recorder while a forward pre-hook keeps copies of the ORIGINAL calls the
model received (`fixtures.generate_traffic.record_traffic`); then it loads the artifact with
``replay.load(device="cuda")`` and runs every original call through the runner and through the
CUDA eager model (`fixtures.generate_traffic.serve_originals`). One JSON object on stdout: what
the recorder counted and wrote, the load time, calls served and correct.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (batch, prompt length, with mask): batch 1 without a mask, batch 2 left-padded.
WORKLOAD = ((1, 5, False), (2, 7, True), (1, 9, False), (2, 4, True))


def prepare(work: Path) -> None:
    import replay
    from fixtures.generate_traffic import record_traffic, tiny_causal

    model = tiny_causal("llama")
    record_traffic(model, work / "store-cpu", WORKLOAD, name="llama")
    result = replay.export(model, work / "store-cpu", model_name="llama")
    result.save(work / "llama.pt2")
    model.save_pretrained(work / "model")
    print(json.dumps({"prepared": str(work), "notes": len(result.notes)}))


def run(work: Path, device: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    import capture
    import replay
    from fixtures.generate_traffic import record_traffic, serve_originals

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here")
    model = AutoModelForCausalLM.from_pretrained(work / "model").to(device).eval()
    store = work / f"served-{device}"
    originals = record_traffic(model, store, WORKLOAD, name="llama")
    opened = capture.open_store(store)
    recorded = opened.summary()
    files = {
        str(f.relative_to(store)): f.stat().st_size for f in sorted(store.rglob("*")) if f.is_file()
    }
    distinct = opened.query("select count(distinct call_id) as n from calls").to_pylist()[0]["n"]
    devices = sorted(
        {
            str(t.device)
            for args, kwargs in originals
            for t in [*args, *kwargs.values()]
            if isinstance(t, torch.Tensor)
        }
    )
    started = time.perf_counter()
    runner = replay.load(work / "llama.pt2", device=device)
    load_s = time.perf_counter() - started
    weights_on = sorted(
        {t.device.type for p in runner.programs.values() for t in p.state_dict.values()}
    )
    verdicts = serve_originals(model, runner, originals)
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name() if device == "cuda" else device,
                "original_calls": len(originals),
                "original_devices": devices,
                "recorded_calls": recorded.calls,
                "recorded_errors": recorded.errors,
                "distinct_call_ids": distinct,
                "store_files": files,
                "load_s": round(load_s, 3),
                "weights_on": weights_on,
                "served": sum(v.group is not None for v in verdicts),
                "correct": sum(v.correct for v in verdicts),
                "wrong_or_refused": [v.reason for v in verdicts if not v.correct][:3],
            },
            indent=1,
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("prepare", "run"))
    parser.add_argument("work", type=Path)
    parser.add_argument("--device", default="cuda", help="where run serves (cpu: a dry run)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.step == "prepare":
        prepare(args.work)
    else:
        run(args.work, args.device)


if __name__ == "__main__":
    main()
