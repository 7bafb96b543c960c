"""Serves a model's original generate() calls from a saved artifact, in a fresh process.

Run by tests/test_replay_artifact.py as ``python tests/serve_artifact.py SPEC.json``; it imports
only torch, transformers (to build the eager reference), safetensors and replay. SPEC names the
artifact, the model (config.json + weights saved with safetensors), the prompts (safetensors)
and which sub-modules generate() calls directly (``{"encoder": "get_encoder"}``).

Every call the model (and each sub-module) receives during generate() is copied by a forward
pre-hook; each copy is then run through the artifact's runner and through eager, and the
outputs are compared. One JSON line goes to stdout: calls, served per group, the largest
difference, whether output types match eager's, and what was unpickled (must be nothing).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import sys
from typing import Any

import torch

UNPICKLED: list[str] = []
_torch_load = torch.load
_pickle_loads = pickle.loads


def _traced_torch_load(*args: Any, **kwargs: Any) -> Any:
    if kwargs.get("weights_only") is False:
        UNPICKLED.append("torch.load(weights_only=False)")
    return _torch_load(*args, **kwargs)


def _traced_pickle_loads(*args: Any, **kwargs: Any) -> Any:
    UNPICKLED.append("pickle.loads")
    return _pickle_loads(*args, **kwargs)


torch.load = _traced_torch_load  # type: ignore[assignment]
pickle.loads = _traced_pickle_loads


def _leaves(value: Any) -> list[torch.Tensor]:
    import torch.utils._pytree as pytree

    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _cache_field(output: Any) -> str | None:
    """The field holding an output's cache, as the installed transformers names it.

    Read from the output class's own fields: the old name (``past_key_values``) is a deprecated
    property on transformers 5.24, and reading it would print a warning on stderr.
    """
    if not dataclasses.is_dataclass(output):
        return None
    names = {f.name for f in dataclasses.fields(output)}
    return next((n for n in ("cache", "past_key_values") if n in names), None)


def _live_storage_bytes() -> int:
    """Bytes of every distinct storage of a live, real tensor of the process."""
    import gc

    seen: dict[tuple[str, int], int] = {}
    for obj in gc.get_objects():
        if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type != "meta":
            storage = obj.untyped_storage()
            seen[(str(obj.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())


def main(spec_path: str) -> int:
    import safetensors.torch as st
    import transformers

    import replay

    with open(spec_path) as f:
        spec = json.load(f)
    runner = replay.load(spec["artifact"])
    storage_bytes = _live_storage_bytes()  # before the eager model exists
    config = transformers.AutoConfig.from_pretrained(spec["model_dir"])
    auto = getattr(transformers, spec["auto_class"])
    model = auto.from_config(config)
    st.load_model(model, f"{spec['model_dir']}/model.safetensors")
    model.eval()
    prompts = st.load_file(spec["prompts"])

    calls: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = []
    targets = {"": model}
    for name, accessor in spec.get("modules", {}).items():
        targets[name] = getattr(model, accessor)()

    def hook_for(name: str) -> Any:
        def hook(module: Any, args: Any, kwargs: Any) -> None:
            calls.append((name, module, copy.deepcopy(args), copy.deepcopy(kwargs)))

        return hook

    handles = [
        m.register_forward_pre_hook(hook_for(n), with_kwargs=True) for n, m in targets.items()
    ]
    with torch.no_grad():
        for i in range(len(prompts) // 2):
            model.generate(
                input_ids=prompts[f"input_ids_{i}"],
                attention_mask=prompts[f"attention_mask_{i}"],
                max_new_tokens=spec["max_new_tokens"],
                min_new_tokens=spec["max_new_tokens"],
                do_sample=False,
                pad_token_id=0,
            )
    for h in handles:
        h.remove()

    served: dict[str, int] = {}
    worst = 0.0
    types_equal = True
    with torch.no_grad():
        for name, module, args, kwargs in calls:
            run = runner.modules[name] if name else runner
            group = run.select(*args, **kwargs)
            got = run(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            expected = module(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            label = f"{name}.{group}" if name else group
            served[label] = served.get(label, 0) + 1
            types_equal &= type(got) is type(expected)
            field = _cache_field(expected)
            if field is not None:
                types_equal &= type(getattr(got, field)) is type(getattr(expected, field))
            left, right = _leaves(expected), _leaves(got)
            if len(left) != len(right):
                worst = float("inf")
                continue
            for a, b in zip(left, right, strict=True):
                if a.shape != b.shape:
                    worst = float("inf")
                elif a.numel():
                    worst = max(worst, float((a.double() - b.double()).abs().max()))
    report = {
        "calls": len(calls),
        "storage_bytes": storage_bytes,
        "served": served,
        "max_abs_diff": worst,
        "types_equal": types_equal,
        "unpickled": UNPICKLED,
        "capture_modules": sorted(
            m for m in sys.modules if m.startswith("capture.record.recorder")
        ),
    }
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
