"""Recorded metadata -> example tensors and ``(args, kwargs)``, restored with the stored treespec.

The store keeps no tensor contents, so every tensor is made up from what was recorded about it:
dtype, shape (a size vector of the call) and, for integer tensors, the value range of the call.

- float (and complex) tensors: ``randn`` from a seeded generator;
- integer tensors: uniform in the recorded ``[int_min, int_max]`` (token ids stay valid
  indices); a mask-like tensor (its argument or path says ``mask``) whose range lies within
  [0, 1], or that has no recorded range, starts as all ones; other integer tensors without a
  recorded range are zeros. Then masks, positions and cache positions are rewritten in the
  patterns production sends (`replay.inputs.patterns`: left/right-padded rows when the mask's
  recorded minimum is 0, never a whole row; positions that agree with the mask and the cache
  length);
- bool tensors: all True.

Everything is drawn from one generator seeded by `seed`, in leaf order, so rebuilding the same
signature twice gives identical tensors: the coverage check builds fresh inputs for eager and for
the exported program, because a forward may mutate its inputs (a DynamicCache grows in place).

``(args, kwargs)`` is restored with `capture.pytree.treespec` (an allow-list parser) +
``tree_unflatten`` inside `capture.pytree.nodes.register_flattening_functions()`. Missing arguments
are not treespec leaves (they are left out of the call); None leaves are (an explicit None, the
empty layers of a prefill DynamicCache).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from capture import schema, untrusted
from capture.errors import ReplayError
from capture.pytree import nodes
from capture.pytree.treespec import UnsafeTreespec, to_treespec
from capture.pytree.treespec import parse as parse_treespec
from replay.inputs import patterns, tokens
from replay.inputs.options import DEFAULT_SEED

if TYPE_CHECKING:
    from capture.pytree.recorded_structure import RecordedLeaf, RecordedStructure

__all__ = [
    "DEFAULT_SEED",
    "dtype_of",
    "is_mask",
    "make_tensor",
    "rebuild",
    "resolve_device",
    "scalar",
    "unflatten",
]

_MASK = re.compile(r"mask", re.IGNORECASE)
_INT64_MAX = 2**63 - 1


def dtype_of(name: str) -> torch.dtype:
    """``torch.float32`` for ``'float32'`` (the stored dtype names)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ReplayError(f"unknown recorded dtype {name!r}")
    return dtype


def is_mask(leaf: RecordedLeaf) -> bool:
    """True for a mask-like leaf: its argument or path names a mask."""
    return bool(_MASK.search(leaf.argument or "") or _MASK.search(leaf.path))


def resolve_device(recorded: str | None, device: str | torch.device | None) -> torch.device:
    """`device` when given, else the recorded device when this machine has it, else CPU."""
    if device is not None:
        return torch.device(device)
    if recorded and recorded.startswith("cuda") and torch.cuda.is_available():
        return torch.device(recorded)
    return torch.device("cpu")


MAX_EXAMPLE_BYTES = 4 << 30
"""Largest example tensor replay builds (4 GiB); a recorded size above it is refused."""


def _check_size(dtype: torch.dtype, size: tuple[int, ...]) -> None:
    """Refuses negative sizes and tensors over `MAX_EXAMPLE_BYTES`, in one line."""
    numel = 1
    for s in size:
        if s < 0:
            raise ReplayError(f"the recorded size {list(size)} has a negative dimension")
        numel *= s
    nbytes = numel * dtype.itemsize
    if nbytes > MAX_EXAMPLE_BYTES:
        raise ReplayError(
            f"the recorded size {list(size)[:8]} of a {dtype} tensor needs {nbytes:,} bytes, "
            f"over replay's limit of {MAX_EXAMPLE_BYTES:,}; the store's sizes are not plausible"
        )


def make_tensor(
    dtype: torch.dtype,
    shape: Sequence[int],
    *,
    low: int | None = None,
    high: int | None = None,
    mask: bool = False,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """An example tensor (module docstring for the filling rules).

    Example:
        >>> make_tensor(torch.int64, (2, 3), low=5, high=5).tolist()
        [[5, 5, 5], [5, 5, 5]]
    """
    size = tuple(int(s) for s in shape)
    _check_size(dtype, size)
    if dtype == torch.bool:
        out = torch.ones(size, dtype=dtype)
    elif dtype.is_floating_point or dtype.is_complex:
        out = torch.randn(size, generator=generator, dtype=torch.float32).to(dtype)
    elif mask and (low is None or high is None or (low >= 0 and high <= 1)):
        out = torch.ones(size, dtype=dtype)
    elif low is None or high is None:
        out = torch.zeros(size, dtype=dtype)
    else:
        top = min(int(high) + 1, _INT64_MAX)
        out = torch.randint(int(low), top, size, generator=generator, dtype=torch.int64)
        out = out.to(dtype)
    return out if device is None or device.type == "cpu" else out.to(device)


def scalar(leaf: RecordedLeaf) -> Any:
    """The recorded value of a scalar leaf (JSON in the ``value`` column), or None."""
    try:
        return None if leaf.value is None else untrusted.loads(leaf.value)
    except ValueError:  # stored data: one line, not a traceback
        raise ReplayError(f"{leaf.path}: the recorded value is not JSON") from None


def rebuild(
    structure: RecordedStructure,
    sizes: Sequence[int],
    ranges: tuple[Sequence[int | None], Sequence[int | None]] | None = None,
    *,
    seed: int = DEFAULT_SEED,
    device: str | torch.device | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Rebuilds the ``(args, kwargs)`` of one recorded signature.

    Args:
        structure: The recorded structure (`capture.analysis.groups.Group.structure`): its leaves,
            in leaf order, and its JSON treespec.
        sizes: The size vector (``calls.dims``): every tensor's shape, in leaf order.
        ranges: (int_min, int_max) of the signature, indexed by ``range_index``; None when
            value ranges were not recorded.
        seed: Seed of the generator.
        device: Where to put the tensors (default: the recorded device when available, else CPU).

    Returns:
        ``(args, kwargs)`` as the recorded calls passed them.

    Raises:
        ReplayError: The structure holds an object that cannot be rebuilt (an opaque leaf), its
            treespec is missing, or `sizes` does not fit it.

    Example:
        >>> args, kwargs = rebuild(group.structure, [2, 6, 2, 6])  # doctest: +SKIP
    """
    if not structure.treespec:
        raise ReplayError(
            "the recorded structure has no treespec (a node type torch's pytree cannot "
            "serialize); its calls cannot be rebuilt"
        )
    generator = torch.Generator().manual_seed(seed)
    lows, highs = ranges if ranges is not None else ([], [])
    values: list[Any] = []
    present = [leaf for leaf in structure.leaves if leaf.kind != schema.KIND_MISSING]
    for leaf in present:
        if leaf.kind == schema.KIND_TENSOR:
            offset, rank = int(leaf.dim_offset or 0), leaf.ndim
            if offset + rank > len(sizes):
                raise ReplayError(
                    f"{leaf.path}: the size vector has {len(sizes)} sizes, the structure "
                    f"needs {offset + rank}"
                )
            index = leaf.range_index
            low = lows[index] if index is not None and index < len(lows) else None
            high = highs[index] if index is not None and index < len(highs) else None
            values.append(
                make_tensor(
                    dtype_of(str(leaf.dtype)),
                    sizes[offset : offset + rank],
                    low=low,
                    high=high,
                    mask=is_mask(leaf),
                    generator=generator,
                    device=resolve_device(leaf.device, device),
                )
            )
        elif leaf.kind == schema.KIND_OPAQUE:
            raise ReplayError(
                f"{leaf.path} is an object of type {leaf.type} that torch's pytree "
                "cannot flatten; register it with torch.utils._pytree to replay it"
            )
        else:
            values.append(scalar(leaf))
    # Masks padded, positions consistent with the mask and the cache (replay.inputs.patterns); the
    # special token ids the model counts, as many as recorded (replay.inputs.tokens).
    patterns.apply(present, values, lows)
    tokens.place(present, values, lows, highs)
    return unflatten(structure, values)


def unflatten(
    structure: RecordedStructure, values: list[Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` from a recorded structure's stored treespec and its leaf values.

     The treespec is read by our own allow-list parser, never by torch's ``treespec_loads``
    : a store is data.

     Args:
         structure: The recorded structure (its treespec; named in errors).
         values: One value per leaf that is not missing, in leaf order.

     Raises:
         ReplayError: The treespec is missing or refused, or its leaf count differs from
             `values`.
    """
    treespec, source = structure.treespec, structure.source
    if not treespec:
        raise ReplayError("the recorded structure has no treespec; the call cannot be rebuilt")
    with nodes.register_flattening_functions():
        try:
            spec = to_treespec(parse_treespec(treespec, source), source)
        except UnsafeTreespec as e:
            raise ReplayError(str(e)) from None
        if spec.num_leaves != len(values):
            raise ReplayError(
                f"the recorded treespec has {spec.num_leaves} leaves, the structure rows "
                f"{len(values)}"
            )
        try:
            args, kwargs = pytree.tree_unflatten(values, spec)
        except (ValueError, TypeError, IndexError, KeyError) as e:
            # A registered class's unflatten refused the stored context (another version).
            raise ReplayError(f"the recorded structure cannot be rebuilt: {e}") from None
    return tuple(args), dict(kwargs)
