"""Regimes and merged groups: programs, export time, calls served.

    python bench/bench_regimes.py [--quick] [--only NAME ...]

Four workloads, each recorded once with the real Recorder under greedy generate() while a
forward pre-hook keeps deep copies of the ORIGINAL calls:

- ``demo``: the tiny Llama and the request mix of `capture demo` (batch 1 without a mask, as
  generate() leaves it out, batches 2-4 left-padded with one);
- ``mistral-sw6`` / ``phi3-sw6``: sliding window 6, prompts of 4-12 tokens without a mask;
- ``gemma3-sw6``: one sliding (6) and one full layer, batches 1-3 with masks and one request
  without, prompts on both sides of the window.

Then one ``replay.export(model, store)`` (every group: torch.export, regimes, merges, the
coverage check) is timed, the result saved, a fresh runner made from the saved file
(``replay.load``), and every original call run through it and through eager: the table says how
many calls it served and how many of those it answered off eager's tolerance (1e-4).

The script is self-contained (it does not need this tree's fixtures beyond `fixtures.models`), so
it also runs on an older checkout: copy it there and run it with that checkout first on
``sys.path`` to get the "before" rows. Prints Markdown (docs/benchmarks.md holds results).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import code_line, load_line, machine_line, md_table  # noqa: E402

WINDOW = 6
SHORT_AND_LONG = [(1, n, False) for n in range(4, 13)]
CROSSING = [(1, 4, True), (2, 5, True), (1, 8, True), (2, 10, True), (1, 3, True), (2, 7, True)]
CROSSING += [(3, 9, True), (1, 12, False)]


def _model(name: str) -> Any:
    import torch
    import transformers

    from fixtures.models import TINY_DECODER, tiny_llama

    if name == "demo":
        return tiny_llama(seed=0)
    arch = name.split("-")[0]
    config_name, model_name = {
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "phi3": ("Phi3Config", "Phi3ForCausalLM"),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    }[arch]
    params: dict[str, Any] = {**TINY_DECODER, "sliding_window": WINDOW}
    if arch == "gemma3":
        params.update(head_dim=16, layer_types=["sliding_attention", "full_attention"])
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**params))
    return model.eval()


def _workload(name: str, quick: bool) -> tuple[list[tuple[int, int, bool]], int]:
    from capture.cli.demo import MAX_NEW_TOKENS, WORKLOAD

    if name == "demo":
        work = [(b, n, b > 1) for b, n in WORKLOAD]
        return (work[:4] if quick else work), MAX_NEW_TOKENS
    work = CROSSING if name.startswith("gemma3") else SHORT_AND_LONG
    return (work[:4] if quick else work), 3


def _record(model: Any, root: str, work: list[tuple[int, int, bool]], new: int) -> list[Any]:
    import torch

    from capture.record.recorder import Recorder
    from fixtures.models import prompts

    originals: list[Any] = []

    def keep(_module: Any, args: Any, kwargs: Any) -> None:
        originals.append(copy.deepcopy((tuple(args), dict(kwargs))))

    handle = model.register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with Recorder(model, root, flush_seconds=3600), torch.no_grad():
            for batch, length, with_mask in work:
                inputs = prompts(batch, length)
                if not with_mask:
                    inputs.pop("attention_mask")
                model.generate(
                    **inputs,
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    pad_token_id=0,
                )
    finally:
        handle.remove()
    return originals


def _tensors(value: Any) -> list[Any]:
    import torch
    import torch.utils._pytree as pytree

    from capture.pytree import nodes

    with nodes.register_flattening_functions():
        return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _agrees(expected: Any, got: Any) -> bool:
    left, right = _tensors(expected), _tensors(got)
    if len(left) != len(right):
        return False
    for a, b in zip(left, right, strict=True):
        if a.shape != b.shape:
            return False
        if a.numel():
            x, y = a.double(), b.double()
            if float((x - y).abs().max()) > 1e-4 + 1e-4 * float(x.abs().max()):
                return False
    return True


def _run(name: str, quick: bool) -> list[Any]:
    import torch

    import replay

    torch.set_num_threads(1)
    model = _model(name)
    work, new = _workload(name, quick)
    root = tempfile.mkdtemp(prefix=f"bench-regimes-{name}-")
    originals = _record(model, root, work, new)
    start = time.perf_counter()
    result = replay.export(model, root)
    seconds = time.perf_counter() - start
    runner = replay.load(result.save(str(Path(root) / "model.pt2")))
    served = wrong = 0
    for args, kwargs in originals:
        with torch.no_grad():
            expected = model(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            try:
                got = runner(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            except Exception:  # the runner refused the call (CallNotServed): not served
                continue
        served += 1
        wrong += not _agrees(expected, got)
    groups = sorted({g.name for g in result.inputs.groups})
    return [
        name,
        len(originals),
        len(result.programs),
        len(groups),
        f"{served}/{len(originals)}",
        wrong,
        f"{seconds:.1f}",
    ]


NAMES = ["demo", "mistral-sw6", "phi3-sw6", "gemma3-sw6"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (smoke run)")
    parser.add_argument("--only", nargs="*", choices=NAMES, help="these workloads only")
    args = parser.parse_args(argv)
    rows = [_run(name, args.quick) for name in args.only or NAMES]
    print("#### Regimes and merges: programs and calls served by a fresh runner\n")
    print(machine_line(("torch", "transformers")))
    print(f"\n{code_line(('capture', 'replay'))}; {load_line()}\n")
    headers = ["workload", "calls", "programs", "groups", "served", "wrong", "export s"]
    print(md_table(headers, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
