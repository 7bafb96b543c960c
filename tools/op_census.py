"""The operator census: the operators real models emit under torch.export (the list's evidence).

Builds a tiny-config instance of every architecture of transformers' auto mappings (one model
class per ``model_type``: the causal LM where there is one, else the seq2seq LM, the masked LM,
the image-text-to-text model, the image, audio and speech heads, else the base model) and of
diffusers' UNet2DCondition, transformer and VAE blocks, exports each with ``torch.export`` on CPU
(``strict=False``, one at a time, each in a forked process killed past its time or memory
limit) and collects the operators their
graphs call, as the loader spells them (``torch.ops.aten.add.Tensor``). Each architecture is
recorded as exported, or not with why (its tiny config or inputs could not be built, torch.export
failed, the time limit). Results accumulate in ``tools/op_census.json`` (a run resumes where the
last stopped); ``--report`` writes ``docs/op_census.md`` from it. ``tests/test_op_census.py``
checks that every census operator is on the list (`replay.runtime.pt2.operators`) or refused with
its reason (`replay.runtime.pt2.op_table.REFUSED_OPS`, docs/trust.md).

Run: ``python tools/op_census.py [--limit-s 60] [--budget-s 3600] [--only llama,bert]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tools/op_census.json"
REPORT = ROOT / "docs/op_census.md"

MAPPINGS = (
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "MODEL_FOR_CTC_MAPPING_NAMES",
    "MODEL_MAPPING_NAMES",
)
"""Where each ``model_type``'s class is looked for, in order (the first mapping naming it)."""

_SIZES = {
    "hidden_size": 64, "d_model": 64, "n_embd": 64, "embed_dim": 64, "dim": 64, "d_embed": 64,
    "intermediate_size": 128, "ffn_dim": 128, "d_ff": 128, "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128, "n_inner": 128, "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 64,
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "encoder_layers": 2,
    "decoder_layers": 2, "num_decoder_layers": 2, "num_encoder_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "num_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": 16,
}  # fmt: skip
"""Config attributes shrunk, where the config has them (and in its sub-configs)."""

_SUBCONFIGS = ("text_config", "vision_config", "audio_config", "encoder_config", "decoder_config")


def classes() -> list[tuple[str, str, str]]:
    """``(model_type, class name, mapping)`` for every architecture, in `MAPPINGS` order."""
    from transformers.models.auto import modeling_auto

    seen: dict[str, tuple[str, str, str]] = {}
    for mapping in MAPPINGS:
        for model_type, name in getattr(modeling_auto, mapping).items():
            if model_type not in seen and isinstance(name, str):
                seen[model_type] = (model_type, name, mapping.removesuffix("_MAPPING_NAMES"))
    return list(seen.values())


def _shrink(config: Any) -> None:
    for key, value in _SIZES.items():
        if isinstance(getattr(config, key, None), int) and not isinstance(value, bool):
            setattr(config, key, min(getattr(config, key), value))
    for key in ("depths", "layers_per_stage"):
        depths = getattr(config, key, None)
        if isinstance(depths, list) and all(isinstance(v, int) for v in depths):
            setattr(config, key, [1] * len(depths))
    for key in _SUBCONFIGS:
        sub = getattr(config, key, None)
        if sub is not None and hasattr(sub, "to_dict"):
            _shrink(sub)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if isinstance(heads, int) and isinstance(hidden, int) and hidden % heads:
        config.num_attention_heads = 1


def build(model_type: str, class_name: str) -> Any:
    """The tiny model of one architecture, in eval mode."""
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    _shrink(config)
    config._attn_implementation = "sdpa" if hasattr(config, "_attn_implementation") else None
    cls = getattr(transformers, class_name)
    try:
        model = cls(config)
    except Exception:
        config._attn_implementation = "eager"
        model = cls(config)
    return model.eval()


def inputs(model: Any) -> dict[str, Any]:
    """Example keyword arguments from the model's main input and config."""
    import torch

    config = model.config
    text = getattr(config, "text_config", None) or config
    vision = getattr(config, "vision_config", None) or config
    main = getattr(model, "main_input_name", "input_ids")
    vocab = getattr(text, "vocab_size", None) or 100
    kwargs: dict[str, Any] = {}
    if main == "input_ids" or main not in ("pixel_values", "input_values", "input_features"):
        kwargs["input_ids"] = torch.randint(3, max(4, min(int(vocab), 100)), (1, 8))
        kwargs["attention_mask"] = torch.ones(1, 8, dtype=torch.long)
    if main == "pixel_values":
        found = getattr(vision, "image_size", 32)
        size = found[0] if isinstance(found, (list, tuple)) else found
        channels = getattr(vision, "num_channels", 3)
        kwargs["pixel_values"] = torch.randn(1, channels, int(size), int(size))
    if main == "input_values":
        kwargs["input_values"] = torch.randn(1, 4000)
    if main == "input_features":
        bins = getattr(config, "num_mel_bins", 80)
        frames = 2 * getattr(config, "max_source_positions", 1500)
        kwargs["input_features"] = torch.randn(1, bins, frames)
    if getattr(config, "is_encoder_decoder", False) and "input_ids" not in kwargs:
        kwargs["decoder_input_ids"] = torch.ones(1, 4, dtype=torch.long)
    elif getattr(config, "is_encoder_decoder", False):
        kwargs["decoder_input_ids"] = kwargs["input_ids"][:, :4]
    return kwargs


def operators(program: Any) -> list[str]:
    """The targets of every graph (and subgraph) of a program, as the loader spells them."""
    import torch

    out: set[str] = set()
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            if node.op != "call_function":
                continue
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                out.add(f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}")
            elif isinstance(target, torch._ops.HigherOrderOperator):
                out.add(f"torch.ops.higher_order.{target.name()}")  # type: ignore[no-untyped-call]
            else:
                module_name = getattr(target, "__module__", "") or ""
                out.add(f"{module_name}.{getattr(target, '__name__', str(target))}")
    return sorted(out)


def census_one(name: str, make: Any) -> dict[str, Any]:
    """Builds and exports one architecture; its entry (exported, or why not)."""
    import torch

    from capture.pytree import nodes

    entry: dict[str, Any] = {"name": name, "status": "exported", "reason": None, "ops": []}
    stage = "build"
    try:
        model, kwargs = make()
        stage = "export"
        with torch.no_grad(), nodes.register_flattening_functions():  # transformers' caches
            try:
                program = torch.export.export(model, (), kwargs=kwargs, strict=False)
            except Exception:
                if "input_ids" not in kwargs:
                    raise
                # a cache the model cannot build from a bare call (hybrid state-space layers)
                kwargs = {**kwargs, "use_cache": False}
                program = torch.export.export(model, (), kwargs=kwargs, strict=False)
                entry["note"] = "exported with use_cache=False"
        entry["ops"] = operators(program)
    except Exception as e:  # every failure is recorded, the census goes on
        first = (str(e).strip().splitlines() or [""])[0]
        entry.update(status=f"{stage} failed", reason=f"{type(e).__name__}: {first[:200]}")
    return entry


def _rss(pid: int) -> int:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def contained(name: str, make: Any, limit_s: float, max_bytes: int) -> dict[str, Any]:
    """`census_one` in a forked child, killed past `limit_s` seconds or `max_bytes` of memory
    (a shrunk config can still ask for gigabytes, a C++ kernel can ignore a signal)."""
    start = time.monotonic()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one architecture, its entry on the pipe
        os.close(read)
        code = 0
        try:
            data = json.dumps(census_one(name, make)).encode()
        except BaseException as e:  # noqa: BLE001 (the child reports everything, then exits)
            data = json.dumps({"name": name, "status": "failed", "reason": repr(e)[:200]}).encode()
            code = 1
        with os.fdopen(write, "wb") as f:
            f.write(data)
        os._exit(code)
    os.close(write)
    why = None
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() - start > limit_s:
            why = ("timeout", f"past {limit_s:.0f} s")
        elif _rss(pid) > max_bytes:
            why = ("memory", f"over {max_bytes >> 20} MiB")
        if why is not None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.2)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    entry: dict[str, Any]
    if why is not None or not data:
        status, reason = why or ("crashed", "the process died")
        entry = {"name": name, "status": status, "reason": reason, "ops": []}
    else:
        entry = json.loads(data)
    entry["seconds"] = round(time.monotonic() - start, 1)
    return entry


def _transformers_job(model_type: str, class_name: str) -> Any:
    def make() -> tuple[Any, dict[str, Any]]:
        model = build(model_type, class_name)
        return model, inputs(model)

    return make


def jobs(only: set[str] | None) -> list[tuple[str, Any, str]]:
    """``(name, make, family)`` of every architecture: diffusers' blocks, then transformers'
    taken from each mapping in turn (a run cut short covers every family)."""
    from itertools import chain, zip_longest

    from tools.census_diffusers import diffusers_jobs

    out: list[tuple[str, Any, str]] = [
        (n, make, "diffusers") for n, make in diffusers_jobs() if only is None or n in only
    ]
    by_family: dict[str, list[tuple[str, Any, str]]] = {}
    for t, c, m in classes():
        if only is None or t in only:
            by_family.setdefault(m, []).append((f"{t}:{c}", _transformers_job(t, c), m))
    turns = zip_longest(*by_family.values())
    return out + [job for job in chain.from_iterable(turns) if job is not None]


def load() -> dict[str, Any]:
    if OUT.exists():
        return json.loads(OUT.read_text())  # type: ignore[no-any-return]
    return {"versions": {}, "architectures": {}}


def save(data: dict[str, Any]) -> None:
    import diffusers
    import torch
    import transformers

    done = data["architectures"].values()
    counts: Counter[str] = Counter(op for a in done for op in a["ops"])
    data["versions"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "diffusers": diffusers.__version__,
    }
    data["tried"] = len(data["architectures"])
    data["exported"] = sum(a["status"] == "exported" for a in done)
    data["ops"] = dict(sorted(counts.items()))
    temp = OUT.with_suffix(".json.tmp")
    temp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    temp.replace(OUT)  # whole or not at all: a run may be stopped at any time


def run(
    limit_s: int, budget_s: float, only: set[str] | None, max_mib: int, retry: bool = False
) -> None:
    """Every architecture not yet in the census (`retry`: those whose export failed), until
    `budget_s` seconds have passed."""
    import torch

    torch.set_num_threads(1)
    data = load()
    start = time.monotonic()
    for name, make, family in jobs(only):
        known = data["architectures"].get(name)
        if retry and (known is None or known["status"] != "export failed"):
            continue
        if not retry and known is not None and only is None:
            continue
        if time.monotonic() - start > budget_s:
            break
        entry = contained(name, make, limit_s, max_mib << 20)
        entry["family"] = family
        data["architectures"][name] = entry
        save(data)
        print(f"{name}: {entry['status']} ({entry['seconds']} s)", file=sys.stderr)


def report() -> None:
    """docs/op_census.md from the census JSON."""
    from replay.runtime.pt2.op_table import REFUSED_OPS
    from replay.runtime.pt2.operators import op_kind

    data = load()
    archs = data["architectures"].values()
    status = Counter(a["status"] for a in archs)
    lines = [
        "# Operator census",
        "",
        "What real models emit under `torch.export` (CPU, `strict=False`): the evidence of the",
        "allow-list (`replay.runtime.pt2.operators`). Written by `python tools/op_census.py",
        "--report` from `tools/op_census.json`; every operator below is allowed or refused with",
        "its reason (docs/trust.md), as `tests/test_op_census.py` checks.",
        "",
        f"Versions: {', '.join(f'{k} {v}' for k, v in data['versions'].items())}.",
        f"Architectures tried: {data['tried']}; exported: {data['exported']}; "
        + "; ".join(f"{k}: {v}" for k, v in sorted(status.items()) if k != "exported")
        + ".",
        "",
        "| family (where the class was found) | tried | exported |",
        "|---|---|---|",
    ]
    families = Counter(a["family"] for a in archs)
    for family, tried in sorted(families.items()):
        exported = sum(a["family"] == family and a["status"] == "exported" for a in archs)
        lines.append(f"| {family} | {tried} | {exported} |")
    lines += [
        "",
        "| operator | architectures | verdict |",
        "|---|---|---|",
    ]
    for op, count in data["ops"].items():
        short = op.removeprefix("torch.ops.")
        name = short.removeprefix("aten.")
        kind = op_kind(op)
        reason = REFUSED_OPS.get(name, REFUSED_OPS.get(op))
        verdict = kind or (f"refused: {reason}" if reason else "REFUSED, no reason given")
        lines.append(f"| `{short}` | {count} | {verdict} |")
    lines += ["", "## Not exported", "", "| architecture | status | reason |", "|---|---|---|"]
    for a in sorted(archs, key=lambda a: a["name"]):
        if a["status"] != "exported":
            reason = str(a["reason"]).replace("|", "/").replace("\n", " ")[:160]
            lines.append(f"| {a['name']} | {a['status']} | {reason} |")
    REPORT.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-s", type=int, default=60, help="seconds per model (60)")
    parser.add_argument("--budget-s", type=float, default=3600, help="seconds in all (3600)")
    parser.add_argument("--max-mib", type=int, default=3072, help="memory per model (3072)")
    parser.add_argument("--only", default=None, help="model types, comma-separated (all)")
    parser.add_argument("--report", action="store_true", help="write docs/op_census.md only")
    parser.add_argument("--retry-failed", action="store_true", help="only the failed exports")
    args = parser.parse_args()
    if args.report:
        report()
        return
    only = set(args.only.split(",")) if args.only else None
    run(args.limit_s, args.budget_s, only, args.max_mib, args.retry_failed)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
