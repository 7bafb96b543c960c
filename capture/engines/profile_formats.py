"""Optimization profiles in the engines' own syntax: trtexec, torch_tensorrt, ONNX Runtime.

trtexec flags, ``torch_tensorrt.Input`` lines, ONNX Runtime TensorRT provider options
(`capture profiles -f ...`). Torch-TensorRT takes several optimization profiles per engine
through ``Input(profiles=[...])``: the list index is the profile index, "auto" selection is
first-fit in index order, every input declares the same number of profiles, and every size is
at least 1 (its documented form, checked by tests/test_profiles.py).

Every format names inputs as `capture.engines.profiles.export_names` does (torch.export placeholder
names, kept by ``torch.onnx.export`` as the ONNX input names) and writes a shape as its sizes
joined with ``x`` (``1x16``) where the tool wants a string. Comment lines (``#``) say which
model, group and profile follow. Only text is built here; the CLI writes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from capture.engines.profiles import Profile

__all__ = ["TEXT_FORMATS", "format_profiles"]

TEXT_FORMATS = ("trtexec", "torch-tensorrt", "onnxruntime")


def _dims(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


def _header(p: Profile) -> str:
    return (
        f"# {p.model_name}, group {p.group}, profile {p.index}: {p.calls} calls, "
        f"opt = a signature sent by {p.opt_calls} of them"
    )


def _trtexec(profiles: Sequence[Profile]) -> list[str]:
    lines = []
    for p in profiles:
        flags = []
        for flag, attr in (("minShapes", "min"), ("optShapes", "opt"), ("maxShapes", "max")):
            spec = ",".join(f"{i.name}:{_dims(getattr(i, attr))}" for i in p.inputs)
            flags.append(f"--{flag}={spec}")
        lines += [_header(p), " ".join(flags)]
    return lines


_TORCH_DTYPES = re.compile(r"^[a-z0-9_]+$")


def _at_least_one(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(max(1, int(v)) for v in shape)


def _torch_tensorrt(profiles: Sequence[Profile]) -> list[str]:
    """One list of ``torch_tensorrt.Input(profiles=[...])`` per call group: each input lists
    the group's profiles in order (the list index is TensorRT's optimization-profile index;
    ``optimization_profile(m, "auto")`` takes the first whose range holds the call)."""
    lines = ["import torch", "import torch_tensorrt"]
    by_group: dict[tuple[str, str], list[Profile]] = {}
    for p in profiles:
        by_group.setdefault((p.model_name, p.group), []).append(p)
    for (model_name, group), members in by_group.items():
        variable = re.sub(r"\W", "_", f"inputs_{group}")
        lines += [
            "",
            f"# {model_name}, group {group}: {len(members)} profile(s), "
            f"{sum(p.calls for p in members)} calls",
        ]
        lines += [f"#   profile {p.index}: " + _header(p).split(": ", 1)[1] for p in members]
        zero = sorted({i.name for p in members for i in p.inputs if 0 in i.min or 0 in i.opt})
        if zero:
            lines.append(
                f"# recorded at size 0: {', '.join(zero)}; TensorRT takes sizes >= 1, so their "
                "profiles start at 1"
            )
        lines.append(f"{variable} = [")
        for k, first in enumerate(members[0].inputs):
            dtype = (
                f"dtype=torch.{first.dtype}, "
                if first.dtype and _TORCH_DTYPES.match(first.dtype)
                else ""
            )
            lines += ["    torch_tensorrt.Input(", "        profiles=["]
            for p in members:
                i = p.inputs[k]
                low, opt, high = _at_least_one(i.min), _at_least_one(i.opt), tuple(i.max)
                if not all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
                    raise ValueError(
                        f"{group} profile {p.index}: {i.name} opt {opt} not in [{low}, {high}]"
                    )
                lines.append(
                    f'            {{"min_shape": {low!r}, "opt_shape": {opt!r}, '
                    f'"max_shape": {high!r}}},'
                )
            lines += ["        ],", f"        {dtype}name={first.name!r},", "    ),"]
        lines.append("]")
    return lines


def _onnxruntime(profiles: Sequence[Profile]) -> list[str]:
    lines: list[str] = []
    by_group: dict[tuple[str, str], list[Profile]] = {}
    for p in profiles:
        by_group.setdefault((p.model_name, p.group), []).append(p)
    for (model_name, group), members in by_group.items():
        # Several profiles: the same input name repeated, one shape per profile (the
        # TensorRT provider's syntax for multiple optimization profiles).
        options = {
            f"trt_profile_{attr}_shapes": ",".join(
                f"{i.name}:{_dims(getattr(i, attr))}" for p in members for i in p.inputs
            )
            for attr in ("min", "opt", "max")
        }
        lines += [
            f"# {model_name}, group {group}: {len(members)} profile(s), "
            f"{sum(p.calls for p in members)} calls",
            json.dumps(options),
        ]
    return lines


def format_profiles(profiles: Sequence[Profile], fmt: str) -> str:
    """The profiles as one of `TEXT_FORMATS`, without a trailing newline.

    Args:
        profiles: From `capture.engines.profiles.build_profiles`.
        fmt: ``trtexec`` (one ``--minShapes=... --optShapes=... --maxShapes=...`` line per
            profile), ``torch-tensorrt`` (Python: per group, a list of
            ``torch_tensorrt.Input(profiles=[{"min_shape", "opt_shape", "max_shape"}, ...])``,
            one profile dict per profile in order, min >= 1 and min <= opt <= max) or
            ``onnxruntime`` (per group, a JSON object of the TensorRT provider's
            ``trt_profile_min_shapes`` / ``_opt_`` / ``_max_`` options).

    Raises:
        ValueError: Unknown format.

    Example:
        >>> print(format_profiles(build_profiles(groups), "trtexec"))  # doctest: +SKIP
        # M, group g0, profile 0: 3 calls, opt = a signature sent by 1 of them
        --minShapes=x:1x4 --optShapes=x:1x4 --maxShapes=x:8x4
    """
    if fmt == "trtexec":
        return "\n".join(_trtexec(profiles))
    if fmt == "torch-tensorrt":
        return "\n".join(_torch_tensorrt(profiles))
    if fmt == "onnxruntime":
        return "\n".join(_onnxruntime(profiles))
    raise ValueError(f"unknown profile format {fmt!r}; use one of {', '.join(TEXT_FORMATS)}")
