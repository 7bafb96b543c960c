"""(args, kwargs) -> structure + sizes, with a fast path cached per structure.

Two walks over the same tree:

- `walk()` runs on every recorded call. It collects the tensor leaves and a *key*, a flat tuple
  of tokens (container types and lengths, dict keys, tensor dtype/device/rank, scalar values)
  that identifies the structure without building a pytree `TreeSpec`. It costs well under a
  microsecond per leaf.
- `describe()` runs once per new key. It uses torch's pytree (`tree_flatten_with_path`) to get
  the treespec and readable key paths, and produces the `Structure` written to the store. It
  checks that torch's leaves are the ones `walk()` found, in the same order; when they are not
  (a custom node that flattens differently), the structure is marked `slow` and its calls are
  flattened with torch's pytree instead.

Leaf order is torch pytree's order: both walks visit containers the same way (tuple/list in
order, dict in insertion order, registered nodes through their flatten function).
"""

from __future__ import annotations

import hashlib
import json
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture import compat
from capture.pytree import nodes
from capture.schema import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_MISSING,
    KIND_NONE,
    KIND_OPAQUE,
    KIND_STR,
    KIND_TENSOR,
    SCHEMA_VERSION,
)
from capture.signature import Signature

__all__ = [
    "Leaf",
    "Structure",
    "describe",
    "walk",
    "tensor_key",
    "metadata_guard",
    "dtype_name",
    "Oversized",
    "Summary",
    "MAX_ITEMS",
    "MAX_KEY",
    "shapes_of",
]

logger = logging.getLogger(__name__)

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_SCALARS = (int, float, bool, str)
_SCALAR_KIND = {int: KIND_INT, float: KIND_FLOAT, bool: KIND_BOOL, str: KIND_STR}
_INTEGER_DTYPES = frozenset(
    {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}
    | {getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)}
)
_OPAQUE = "<opaque>"
_NODES = compat.pytree_nodes()  # torch's pytree registry, live: class -> node definition
# Integer dtypes whose value range is not recorded: uint64 values may not fit the int64 columns.
_NO_RANGE_DTYPES = frozenset({getattr(torch, "uint64", torch.int64)} - {torch.int64})
# A NaN argument: every float('nan') is a different object and NaN != NaN, so without one shared
# stand-in each call would make a new structure (issue 12).
_NAN = float("nan")

MAX_ITEMS = 1_000
"""Items in one list/tuple/dict beyond which an argument is summarised (issue 12)."""
MAX_KEY = 4_000
"""Key tokens of one call (about two per leaf) beyond which an argument is summarised."""


class Oversized(Exception):
    """Raised by `walk()` past `MAX_ITEMS`/`MAX_KEY`: the recorder then uses `Summary` leaves."""


@dataclass(frozen=True)
class Summary:
    """Stands for an argument too large to record leaf by leaf (an opaque leaf of its type)."""

    type_name: str


# Not `capture.pytree.structure.RecordedLeaf`: that one carries its stored leaf index first, known
# only once the structure is numbered; this one is built positionally while walking a call.
@dataclass(frozen=True)
class Leaf:
    """What the store keeps about one leaf of a call's (args, kwargs) or output."""

    path: str
    argument: str | None
    position: int | None
    kind: str
    type: str
    dtype: str | None = None
    rank: int | None = None
    device: str | None = None
    value: str | None = None
    dim_offset: int | None = None
    range_index: int | None = None


@dataclass
class Structure:
    """A distinct call structure: everything but the sizes that vary between calls."""

    structure_id: str
    leaves: list[Leaf]
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


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32."""
    return str(dtype).rsplit(".", 1)[-1]


def _freeze(context: Any) -> Any:
    """A hashable stand-in for a pytree context (lists and dicts become tuples)."""
    if isinstance(context, list | tuple):
        return tuple(_freeze(c) for c in context)
    if isinstance(context, dict):
        return tuple((k, _freeze(v)) for k, v in context.items())
    try:
        hash(context)
    except TypeError:
        return repr(context)
    return context


_UNKNOWN = Signature()  # a method Python cannot tell the signature of: nothing is named

_T = "<tensor>"  # the token a tensor leaves in the key; its dtype/device/rank come after


def walk(obj: Any, tensors: list[torch.Tensor], key: list[Any]) -> None:
    """Appends the tensor leaves of `obj` to `tensors` and its container tokens to `key`.

    Tensors only leave a marker in `key`: the caller adds their dtypes, devices and ranks with
    `tensor_key()`, which is cheaper over the whole list than per leaf.
    """
    tp = type(obj)
    if tp is _Tensor or tp is _Parameter:
        tensors.append(obj)
        key.append(_T)
    elif tp is tuple or tp is list:
        if len(obj) > MAX_ITEMS or len(key) > MAX_KEY:
            raise Oversized(tp.__name__)
        key.append(tp)
        key.append(len(obj))
        for child in obj:
            walk(child, tensors, key)
    elif tp is dict:
        if len(obj) > MAX_ITEMS or len(key) > MAX_KEY:
            raise Oversized("dict")
        key.append(dict)
        key.append(tuple(obj))
        for child in obj.values():
            walk(child, tensors, key)
    elif obj is None:
        key.append(None)
    elif tp in _SCALARS:
        key.append(tp)
        key.append(obj if obj == obj else _NAN)
    elif tp in nodes.LAYERED_CACHES:
        _walk_layers(obj, tp, tensors, key)
    else:
        _walk_other(obj, tp, tensors, key)


def _walk_layers(obj: Any, tp: type, tensors: list[torch.Tensor], key: list[Any]) -> None:
    """A DynamicCache/StaticCache we registered: keys, values, then state leaves (issue 9)."""
    # The context holds each layer's class and state (a full sliding window): the same
    # children and context as the registered flatten_fn, so the cached structure matches it.
    children, context = nodes.flatten_layers(obj)
    key.append(tp)
    key.append(context)
    if all(map(_is_initialized, obj.layers)):
        # Every child is a tensor: one token for all of them (their dtypes, devices and ranks
        # are in the key built by `tensor_key`).
        tensors.extend(children)
        key.append(len(children))
        return
    for child in children:
        walk(child, tensors, key)


def _walk_other(obj: Any, tp: type, tensors: list[torch.Tensor], key: list[Any]) -> None:
    if isinstance(obj, _Tensor):  # subclasses (FakeTensor, DTensor, ...)
        tensors.append(obj)
        key.append(_T)
        return
    node = _NODES.get(tp)
    if node is None and tp.__module__.startswith("transformers") and nodes.transformers_loaded():
        # A cache type seen for the first time: register lazily (never released: the types
        # stay registered for the life of the process once a recorder has seen them).
        nodes.acquire()
        if tp in nodes.LAYERED_CACHES:
            _walk_layers(obj, tp, tensors, key)
            return
        node = _NODES.get(tp)
    if node is None:
        key.append(_OPAQUE)
        key.append(tp)
        return
    children, context = node.flatten_fn(obj)
    if len(children) > MAX_ITEMS or len(key) > MAX_KEY:
        raise Oversized(tp.__name__)
    key.append(tp)
    key.append(_freeze(context))
    key.append(len(children))
    for child in children:
        walk(child, tensors, key)


_is_initialized = operator.attrgetter("is_initialized")
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")
_device_index = _Tensor.get_device


def tensor_key(
    key: Sequence[Any],
    tensors: list[torch.Tensor],
    devices: bool = True,
    shapes: list[Any] | None = None,
) -> tuple[tuple[Any, ...], list[Any]]:
    """The full structure key (containers, dtypes, devices, ranks) and the tensors' shapes.

    `key` is what `walk()` built; a tuple is used as it is (no copy).

    `devices=False` leaves the device indices out (the recorder does so for outputs, whose
    devices follow the inputs'; the structure still records the device seen first).
    `shapes` are the tensors' sizes when the caller has them (`shapes_of` for nested tensors).
    """
    if shapes is None:
        shapes = list(map(_shape, tensors))
    return (
        tuple(key),
        tuple(map(_dtype, tensors)),
        tuple(map(_device_index, tensors)) if devices else None,
        tuple(map(len, shapes)),
    ), shapes


def metadata_guard(tensors: Sequence[torch.Tensor]) -> Callable[..., bool] | None:
    """A C++ check that tensors have the dtypes, devices and ranks of `tensors`, or None.

    `guard(*others)` is true when each of `others` has the same dtype, device, rank, tensor
    type, requires_grad and dispatch keys as its counterpart here, whatever its sizes and
    strides. It is stricter than `tensor_key()`'s dtype/device/rank tuples, so a passing check
    means an equal key; it reads that metadata in one C++ loop, about 3x faster than
    `tensor_key()` in Python. It keeps no reference to `tensors`. torch's C++ tensor checks
    (what torch.compile's guards use) are private: `capture.compat.tensor_metadata_check`.
    """
    return compat.tensor_metadata_check(tensors)


def _safe_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The sizes of a tensor; a ragged dimension of a nested tensor is -1."""
    if not t.is_nested:
        return tuple(t.shape)
    sizes = []
    for i in range(t.dim()):
        try:
            size = t.size(i)
        except RuntimeError:  # a strided nested tensor's irregular dimension
            size = -1
        sizes.append(size if type(size) is int else -1)  # a jagged one's is a SymInt
    return tuple(sizes)


def shapes_of(tensors: Sequence[torch.Tensor]) -> list[tuple[int, ...]]:
    """The sizes of each tensor as ints (nested tensors' ragged dimensions are -1)."""
    return [_safe_shape(t) for t in tensors]


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
    value: Any, path: str, argument: str | None, position: int | None
) -> tuple[Leaf, bool]:
    """Describes one leaf; the bool tells whether it is a tensor."""
    tp = type(value)
    if tp is Summary:
        return Leaf(path, argument, position, KIND_OPAQUE, value.type_name), False
    if isinstance(value, _Tensor):
        leaf = Leaf(
            path,
            argument,
            position,
            KIND_TENSOR,
            tp.__name__,
            dtype=dtype_name(value.dtype),
            rank=value.dim(),
            device=str(value.device),
        )
        return leaf, True
    if value is None:
        return Leaf(path, argument, position, KIND_NONE, "NoneType"), False
    if tp in _SCALAR_KIND:
        return (
            Leaf(path, argument, position, _SCALAR_KIND[tp], tp.__name__, value=json.dumps(value)),
            False,
        )
    return Leaf(path, argument, position, KIND_OPAQUE, f"{tp.__module__}.{tp.__qualname__}"), False


def _argument_names(leaves: list[Leaf], signature: Signature) -> list[Leaf]:
    """Fills `argument` for positional leaves from the signature ('x' for args[0])."""
    out = []
    for leaf in leaves:
        if leaf.position is not None and leaf.argument is None:
            name = signature.name_at(leaf.position)
            leaf = Leaf(**{**leaf.__dict__, "argument": name or f"args[{leaf.position}]"})
        out.append(leaf)
    return out


def _missing(signature: Signature, n_args: int, kwargs: dict[str, Any]) -> list[Leaf]:
    """Optional parameters the caller did not pass (distinct from an explicit None)."""
    return [
        Leaf(f"kwargs['{p.name}']", p.name, None, KIND_MISSING, "missing")
        for p in signature.missing(n_args, kwargs)
    ]


def _structure_id(leaves: list[Leaf], treespec: str | None) -> str:
    payload = json.dumps(
        [SCHEMA_VERSION, [list(leaf.__dict__.values()) for leaf in leaves], treespec],
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def describe(
    obj: Any,
    tensors: list[torch.Tensor],
    *,
    root: str = "inputs",
    signature: Signature = _UNKNOWN,
    track_ranges: Callable[[torch.Tensor], bool] = lambda t: False,
) -> Structure:
    """Builds the `Structure` of `obj` ((args, kwargs) when root='inputs', else an output).

    Args:
        obj: ``(args, kwargs)`` for inputs, the returned value for outputs.
        tensors: The tensors `walk()` found in `obj`, in order.
        root: 'inputs' or the prefix of output paths ('output').
        signature: The recorded method's parameters (names positional leaves, finds missing).
        track_ranges: Tells whether to record the value range of an (integer) tensor.
    """
    slow = False
    treespec: str | None = None
    try:
        flat, spec = pytree.tree_flatten_with_path(obj)
    except Exception as e:  # a user-registered flatten function failed: describe what we saw
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
    leaves: list[Leaf] = []
    offset = 0
    range_tensors: list[int] = []
    opaque: list[str] = []
    nested = False
    n_seen = 0  # tensors before this leaf (a running count: a list scan per leaf was quadratic)
    for kp, value in flat:
        path, argument, position = _root_path(kp, root)
        leaf, is_tensor = _leaf_of(value, path, argument, position)
        if is_tensor:
            range_index = None
            if (
                value.dtype in _INTEGER_DTYPES
                and value.dtype not in _NO_RANGE_DTYPES
                and value.layout is torch.strided
                and not value.is_nested
                and track_ranges(value)
            ):
                range_index = len(range_tensors)
                range_tensors.append(n_seen)
            leaf = Leaf(**{**leaf.__dict__, "dim_offset": offset, "range_index": range_index})
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
        leaves += _missing(signature, n_args, kwargs)
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
    )
