"""(args, kwargs) -> structure + sizes, with a fast path cached per structure.

Two walks over the same tree:

- `walk()` (here) runs on every recorded call. It collects the tensor leaves and a *key*, a flat
  tuple of tokens (container types and lengths, dict keys, tensor dtype/device/rank, scalar
  values) that identifies the structure without building a pytree `TreeSpec`. It costs well
  under a microsecond per leaf.
- `describe()` (`capture.record.call_structure`, re-exported here) runs once per new key. It uses
  torch's pytree (`tree_flatten_with_path`) to get the treespec and readable key paths, and
  produces the `Structure` written to the store. It checks that torch's leaves are the ones
  `walk()` found, in the same order; when they are not (a custom node that flattens
  differently), the structure is marked `slow` and its calls are flattened with torch's pytree
  instead.

Leaf order is torch pytree's order: both walks visit containers the same way (tuple/list in
order, dict in insertion order, registered nodes through their flatten function). A call's
top-level keywords are the exception: their order carries no meaning, so a structure takes them
in the signature's order (`in_keyword_order`), whatever order the caller passed them in.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch

from capture import compat
from capture.pytree import nodes, outputs
from capture.record.call_structure import (
    OpaqueArgument,
    Structure,
    Unreadable,
    describe,
    dtype_name,
)
from capture.signature import Signature

__all__ = [
    "Structure",
    "describe",
    "walk",
    "tensor_key",
    "metadata_guard",
    "dtype_name",
    "Oversized",
    "Unreadable",
    "OpaqueArgument",
    "MAX_ITEMS",
    "MAX_KEY",
    "shapes_of",
    "in_keyword_order",
]

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
_SCALARS = (int, float, bool, str)
_OPAQUE = "<opaque>"
_NODES = compat.pytree_nodes()  # torch's pytree registry, live: class -> node definition
# A NaN argument: every float('nan') is a different object and NaN != NaN, so without one shared
# stand-in each call would make a new structure.
_NAN = float("nan")

MAX_ITEMS = 1_000
"""Items in one list/tuple/dict beyond which an argument is summarised."""
MAX_KEY = 4_000
"""Key tokens of one call (about two per leaf) beyond which an argument is summarised."""


class Oversized(Exception):
    """Raised by `walk()` past `MAX_ITEMS`/`MAX_KEY`: the recorder then uses `OpaqueArgument`s."""


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
    """A DynamicCache/StaticCache we registered: keys, values, then state leaves."""
    # The context holds each layer's class and state (a full sliding window, a linear layer's
    # step): the same children and context as the registered flatten_fn, so the cached
    # structure matches it.
    children, context, dense = nodes.walk_layers(obj)
    key.append(tp)
    key.append(context)
    if dense:
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
    if node is None and nodes.registrable(tp):
        # A cache type seen for the first time: register lazily (never released: the types
        # stay registered for the life of the process once a recorder has seen them). Only
        # a class the registry flattens: another (MtpCache) stays opaque without a new
        # reference on every call.
        nodes.acquire()
        if tp in nodes.LAYERED_CACHES:
            _walk_layers(obj, tp, tensors, key)
            return
        node = _NODES.get(tp)
    if node is None:
        key.append(_OPAQUE)
        key.append(tp)
        return
    if node.flatten_with_keys_fn is None:
        # A diffusers output registered without key paths: capture adds them (else torch's
        # pytree cannot name its leaves and `describe` would keep it opaque).
        outputs.add_keys(tp)
    children, context = node.flatten_fn(obj)
    if len(children) > MAX_ITEMS or len(key) > MAX_KEY:
        raise Oversized(tp.__name__)
    key.append(tp)
    key.append(_freeze(context))
    key.append(len(children))
    for child in children:
        walk(child, tensors, key)


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


def in_keyword_order(
    call: tuple[tuple[Any, ...], dict[str, Any]], signature: Signature
) -> tuple[tuple[tuple[Any, ...], dict[str, Any]], tuple[int, ...]] | None:
    """A call with its keywords in the canonical order, and where its tensors move.

    Keyword order is not part of a call's structure (`Signature.keyword_order`): the same
    call passed with its keywords in another order has the same structure and sizes. Returns
    None when the keywords are in that order already; else ``((args, kwargs), order)``, where
    ``order[i]`` is the position, among the tensors `walk` finds in the call as passed, of the
    ``i``-th tensor of the reordered call (nested containers keep their own order).

    Example:
        >>> sig = Signature.of(lambda x, mask=None: x)
        >>> call = ((), {"mask": torch.ones(2), "x": torch.zeros(3)})
        >>> moved, order = in_keyword_order(call, sig)
        >>> list(moved[1]), order
        (['x', 'mask'], (1, 0))
    """
    args, kwargs = call
    names = signature.keyword_order(kwargs)
    if names is None:
        return None
    first: list[Any] = []
    walk(args, first, [])
    start = len(first)
    span: dict[str, range] = {}
    for name, value in kwargs.items():
        found: list[torch.Tensor] = []
        walk(value, found, [])
        span[name] = range(start, start + len(found))
        start += len(found)
    order = tuple(range(len(first))) + tuple(i for name in names for i in span[name])
    return (args, {name: kwargs[name] for name in names}), order
