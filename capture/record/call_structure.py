"""A call's input structure, the recorder's side: described once per new structure key.

The store side of the same concept is `capture.pytree.recorded_structure` (`RecordedStructure`,
read back from the ``structures`` table; `RecordedLeaf`, the leaf record both sides use); this
module builds what is written there: `describe()`
flattens a call's ``(args, kwargs)`` (or output) with torch's pytree, names each leaf's path and
argument, marks the missing optionals, decides which integer tensors have their value range
recorded (and a static cache's fill level on any device, and the special token
counts of token inputs: `capture.record.tokens`), and hashes it all into a `structure_id`.
`capture.record.flatten.walk` is the per-call fast path that finds a described structure again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture.pytree import nodes
from capture.pytree.recorded_structure import RecordedLeaf
from capture.record import tokens
from capture.renames import same_argument
from capture.schema import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_MISSING,
    KIND_NONE,
    KIND_OPAQUE,
    KIND_STR,
    KIND_TENSOR,
    STRUCTURE_ID_VERSION,
)
from capture.signature import Signature

__all__ = [
    "OpaqueArgument",
    "Structure",
    "Unreadable",
    "describe",
    "dtype_name",
]

logger = logging.getLogger(__name__)

_Tensor = torch.Tensor
_SCALAR_KIND = {int: KIND_INT, float: KIND_FLOAT, bool: KIND_BOOL, str: KIND_STR}
_INTEGER_DTYPES = frozenset(
    {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
    | {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
)
# Integer dtypes whose value range is not recorded: uint64 values may not fit the int64 columns.
_NO_RANGE_DTYPES = frozenset({getattr(torch, "uint64", torch.int64)} - {torch.int64})


class Unreadable(Exception):
    """Raised by `describe(strict=True)` when torch's pytree cannot flatten what `walk()` read.

    The recorder then records the argument that fails as an `OpaqueArgument`: the call
    is recorded, the leaf names the class.
    """


@dataclass(frozen=True)
class OpaqueArgument:
    """Stands for an argument too large to record leaf by leaf, or unreadable: one opaque leaf
    naming its type (`capture.record.summaries`)."""

    type_name: str


_UNKNOWN = Signature()  # a method Python cannot tell the signature of: nothing is named


@dataclass
class Structure:
    """A distinct call structure: everything but the sizes that vary between calls."""

    structure_id: str
    leaves: list[RecordedLeaf]
    treespec: str | None
    n_args: int
    n_tensors: int
    # Positions (in the tensor list) of the tensors whose value range is tracked.
    range_tensors: tuple[int, ...] = ()
    # True when torch's pytree and `walk()` disagree: flatten this structure with pytree.
    slow: bool = False
    opaque: list[str] = field(default_factory=list)
    # True when a tensor leaf is nested: its sizes are read with `shapes_of` (ragged: -1).
    nested: bool = False
    # Per token input whose special ids are counted (after the ranges in int_min/int_max):
    # (tensor position, ids, the ids as a tensor); see `capture.record.tokens`.
    counts: tuple[tuple[int, tuple[int, ...], torch.Tensor], ...] = ()
    # True when a tracked tensor is not on the CPU: its range is read later, without a device
    # sync, by the writer thread (`capture.record.device_ranges`).
    deferred: bool = False
    # A call that passed its keywords in another order than the structure's
    # (`capture.record.flatten.in_keyword_order`): the structure's keyword order, and the
    # position, in the call as passed, of each of the structure's tensors.
    keywords: tuple[str, ...] | None = None
    order: tuple[int, ...] | None = None


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32."""
    return str(dtype).rsplit(".", 1)[-1]


def _root_path(kp: Sequence[Any], root: str) -> tuple[str, str | None, int | None]:
    """('args[0]', argument name, position) from a key path under (args, kwargs) or output."""
    if root != "inputs":
        return root + pytree.keystr(tuple(kp)), None, None
    first, rest = kp[0], tuple(kp[1:])
    is_args = isinstance(first, pytree.SequenceKey) and first.idx == 0
    path = ("args" if is_args else "kwargs") + pytree.keystr(rest)
    if not rest:
        return path, None, None
    top = rest[0]
    if is_args and isinstance(top, pytree.SequenceKey):
        return path, None, top.idx
    if isinstance(top, pytree.MappingKey):
        return path, str(top.key), None
    return path, None, None


def _leaf_of(
    index: int, value: Any, path: str, argument: str | None, position: int | None
) -> tuple[RecordedLeaf, bool]:
    """Describes leaf `index`; the bool tells whether it is a tensor."""
    tp = type(value)
    at = (index, path, argument, position)
    if tp is OpaqueArgument:
        return RecordedLeaf(*at, KIND_OPAQUE, value.type_name), False
    if isinstance(value, _Tensor):
        leaf = RecordedLeaf(
            *at,
            KIND_TENSOR,
            tp.__name__,
            dtype=dtype_name(value.dtype),
            rank=value.dim(),
            device=str(value.device),
        )
        return leaf, True
    if value is None:
        return RecordedLeaf(*at, KIND_NONE, "NoneType"), False
    if tp in _SCALAR_KIND:
        return RecordedLeaf(*at, _SCALAR_KIND[tp], tp.__name__, value=json.dumps(value)), False
    return RecordedLeaf(*at, KIND_OPAQUE, f"{tp.__module__}.{tp.__qualname__}"), False


def _argument_names(leaves: list[RecordedLeaf], signature: Signature) -> list[RecordedLeaf]:
    """Fills `argument` for positional leaves from the signature ('x' for args[0])."""
    out = []
    for leaf in leaves:
        if leaf.position is not None and leaf.argument is None:
            name = signature.name_at(leaf.position)
            leaf = replace(leaf, argument=name or f"args[{leaf.position}]")
        out.append(leaf)
    return out


def _missing(
    signature: Signature, n_args: int, kwargs: dict[str, Any], first: int
) -> list[RecordedLeaf]:
    """Optional parameters the caller did not pass (distinct from an explicit None), as leaves
    numbered from `first`.

    A keyword passed under a renamed argument's other spelling (`capture.renames`) passes the
    parameter: a model declaring ``cache`` called with ``past_key_values=`` misses no cache.
    """
    passed = [same_argument(k, signature.keyword_names) or k for k in kwargs]
    return [
        RecordedLeaf(first + i, f"kwargs['{p.name}']", p.name, None, KIND_MISSING, "missing")
        for i, p in enumerate(signature.missing(n_args, passed))
    ]


# What a structure id hashes of each leaf: its columns but its index (the position in the list).
_HASHED = tuple(f.name for f in fields(RecordedLeaf) if f.name != "leaf")


def _structure_id(leaves: list[RecordedLeaf], treespec: str | None) -> str:
    payload = json.dumps(
        [STRUCTURE_ID_VERSION, [[getattr(leaf, f) for f in _HASHED] for leaf in leaves], treespec],
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _flatten(
    obj: Any, tensors: list[torch.Tensor], root: str, strict: bool
) -> tuple[list[tuple[Any, Any]], str | None, bool]:
    """`obj`'s leaves with their key paths, its serialized treespec (None when it has none),
    and whether its calls must be flattened with torch's pytree (`Structure.slow`)."""
    slow = False
    treespec: str | None = None
    try:
        flat, spec = pytree.tree_flatten_with_path(obj)
    except Exception as e:  # a user-registered flatten function failed: describe what we saw
        if strict:
            raise Unreadable(f"{type(e).__name__}: {e}") from e
        logger.warning("torch pytree could not flatten a %s: %s", root, e)
        flat, spec = [((pytree.SequenceKey(i),), t) for i, t in enumerate(tensors)], None
        slow = True
    if spec is not None:
        try:
            treespec = pytree.treespec_dumps(spec)
        except Exception as e:  # a node type without serialized_type_name: keep going without
            logger.info("treespec of a %s cannot be serialized: %s", root, e)
    pytree_tensors = [v for _, v in flat if isinstance(v, _Tensor)]
    if len(pytree_tensors) != len(tensors) or any(
        a is not b for a, b in zip(pytree_tensors, tensors, strict=False)
    ):
        slow = True
    return flat, treespec, slow


def describe(
    obj: Any,
    tensors: list[torch.Tensor],
    *,
    root: str = "inputs",
    signature: Signature = _UNKNOWN,
    track_ranges: Callable[[torch.Tensor], bool] = lambda t: False,
    strict: bool = False,
    special_ids: Sequence[int] = (),
) -> Structure:
    """Builds the `Structure` of `obj` ((args, kwargs) when root='inputs', else an output).

    Args:
        obj: ``(args, kwargs)`` for inputs, the returned value for outputs.
        tensors: The tensors `walk()` found in `obj`, in order.
        root: 'inputs' or the prefix of output paths ('output').
        signature: The recorded method's parameters (names positional leaves, finds missing).
        track_ranges: Tells whether to record the value range of an (integer) tensor.
        strict: Raise `Unreadable` when torch's pytree cannot flatten `obj` (the recorder then
            records the failing argument as an opaque leaf); else describe the tensors `walk`
            found, flattened with torch's pytree on every call.
        special_ids: Ids to count in token inputs whose range is tracked
            (`capture.record.tokens`).

    Raises:
        Unreadable: With `strict`, a flatten function failed.
    """
    flat, treespec, slow = _flatten(obj, tensors, root, strict)
    leaves: list[RecordedLeaf] = []
    offset = 0
    range_tensors: list[int] = []
    opaque: list[str] = []
    nested = deferred = False
    fills: set[str] = set()  # caches whose fill level is tracked
    tensor_of: dict[int, int] = {}  # leaf index -> tensor position
    n_seen = 0  # tensors before this leaf (a running count: a list scan per leaf was quadratic)
    for kp, value in flat:
        path, argument, position = _root_path(kp, root)
        leaf, is_tensor = _leaf_of(len(leaves), value, path, argument, position)
        if is_tensor:
            range_index = None
            if _tracked(path, value, track_ranges, fills, root):
                range_index = len(range_tensors)
                range_tensors.append(n_seen)
                deferred = deferred or value.device.type != "cpu"
            tensor_of[len(leaves)] = n_seen
            leaf = replace(leaf, dim_offset=offset, range_index=range_index)
            offset += value.dim()
            n_seen += 1
            nested = nested or value.is_nested
        elif leaf.kind == KIND_OPAQUE:
            opaque.append(f"{leaf.path} ({leaf.type})")
        leaves.append(leaf)
    n_args = 0
    if root == "inputs":
        args, kwargs = obj
        n_args = len(args)
        leaves = _argument_names(leaves, signature)
        leaves, counts = tokens.token_counts(leaves, tensor_of, len(range_tensors), special_ids)
        leaves += _missing(signature, n_args, kwargs, len(leaves))
    else:
        counts = ()
    n_tensors = sum(1 for leaf in leaves if leaf.kind == KIND_TENSOR)
    return Structure(
        structure_id=_structure_id(leaves, treespec),
        leaves=leaves,
        treespec=treespec,
        n_args=n_args,
        n_tensors=n_tensors,
        range_tensors=tuple(range_tensors),
        slow=slow,
        opaque=opaque,
        nested=nested,
        counts=counts,
        deferred=deferred,
    )


_FILL = f".{nodes.FILL_LEVEL}["


def _tracked(
    path: str,
    value: torch.Tensor,
    track_ranges: Callable[[torch.Tensor], bool],
    fills: set[str],
    root: str,
) -> bool:
    """Whether a tensor's value range is recorded: a dense integer tensor's only.

    A static cache's fill level is recorded on any device: its first layer's, once
    per cache (every layer of a cache advances alike; replay gives the others the same value).
    """
    if (
        value.dtype not in _INTEGER_DTYPES
        or value.dtype in _NO_RANGE_DTYPES
        or value.layout is not torch.strided
        or value.is_nested
    ):
        return False
    at = path.find(_FILL)
    if at < 0:
        return track_ranges(value)
    if root != "inputs" or path[:at] in fills:
        return False
    fills.add(path[:at])
    return True
