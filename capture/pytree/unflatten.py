"""A program's outputs put back into its output structure, by a builder made once.

The ONNX runner's files (`replay.runtime.ort.program`) and the ``.pt2`` graphs
(`replay.runtime.pt2.program`) rebuild their outputs this way.

`torch.utils._pytree.tree_unflatten` rebuilds a tree by walking its spec on every call: slices of
the leaf list, a lookup of each node's registration, then the node's own unflatten function. A
runner answers every call of a file with the same structure, so `builder` walks the spec once,
at the file's first call, into a function from the leaves to the tree that calls the same
registered unflatten functions with the same contexts.

A transformers output class (``CausalLMOutputWithPast``, every ``ModelOutput``) is the one node
built another way. Its registered unflatten calls the dataclass constructor, whose field
assignments and ``__post_init__`` re-read the class's fields about ten times per call. What they
leave behind is simple: the instance holds every field as an attribute, and, as a mapping, the
fields that are not None, in field order. `_fast_model_output` builds that directly, under two
conditions:

- the constructor would take that path: a field is a tensor leaf (never None at run time); a
  ``ModelOutput`` given only its first field, and that not a tensor, reads it as an iterator of
  pairs instead;
- it is proven on the first call: that call's output is built both ways from its own leaves,
  and unless the types, the mappings' items (the same objects, in the same order) and the
  attributes all agree, the file keeps torch's unflatten.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any

__all__ = ["builder"]

Build = Callable[[Iterator[Any]], Any]
"""Builds one subtree, taking its leaves from the iterator in order."""


def builder(spec: Any, first: Sequence[Any]) -> tuple[Callable[[Sequence[Any]], Any], Any]:
    """A function that builds what ``tree_unflatten(values, spec)`` builds, and the tree of
    `first`, the first call's leaves.

    The direct builds are proven on `first` (module docstring): built both ways, they must give
    the same arrangement of the same objects, or the function is torch's own unflatten.

    Args:
        spec: The output treespec (`capture.pytree.treespec`).
        first: One call's leaves: the ONNX outputs' tensors and the program's constants.

    Returns:
        ``(build, tree)``: ``build(values)`` gives the output tree over `values` (one per
        leaf, in order); `tree` is `first`'s, built by torch's unflatten.
    """
    import torch
    import torch.utils._pytree as pytree

    tree = pytree.tree_unflatten(list(first), spec)
    kinds = iter([isinstance(leaf, torch.Tensor) for leaf in first])
    try:
        build = _node(spec, kinds)[0]
        same = _same(build(iter(first)), tree)
    except Exception:  # a node whose unflatten the direct build cannot call as torch does
        same = False
    if not same:
        return lambda values: pytree.tree_unflatten(list(values), spec), tree
    return lambda values: build(iter(values)), tree


def _node(spec: Any, tensors: Iterator[bool]) -> tuple[Build, bool]:
    """The builder of one subtree, and whether it is a tensor leaf; `tensors` yields, per leaf
    in order, whether it is a tensor."""
    import torch.utils._pytree as pytree

    if spec.is_leaf():
        return next, next(tensors)
    built = [_node(child, tensors) for child in spec.children()]
    children = [b for b, _ in built]
    context = spec.context
    fast = _fast_model_output(spec, children, [t for _, t in built])
    if fast is not None:
        return fast, False
    fast = _fast_cache(spec, built)
    if fast is not None:
        return fast, False
    unflatten = pytree.SUPPORTED_NODES[spec.type].unflatten_fn
    return (lambda it: unflatten([child(it) for child in children], context)), False


def _fast_model_output(spec: Any, children: list[Build], tensors: list[bool]) -> Build | None:
    """The direct build of a transformers ``ModelOutput`` node (module docstring), or None."""
    cls = spec.type
    names = spec.context
    if not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        return None
    try:
        from transformers.utils.generic import ModelOutput
    except ImportError:
        return None
    if not issubclass(cls, ModelOutput) or not isinstance(names, list | tuple):
        return None
    fields = [f.name for f in dataclasses.fields(cls)]
    if not set(names) <= set(fields) or len(set(names)) != len(names) or not any(tensors):
        return None  # no field sure to be non-None: the constructor decides what it holds
    at = {name: i for i, name in enumerate(names)}
    present = [(name, at[name]) for name in fields if name in at]  # in field order
    blank = dict.fromkeys(fields)  # every field None, in field order
    setitem = OrderedDict.__setitem__
    new = cls.__new__

    def build(it: Iterator[Any]) -> Any:
        values = [child(it) for child in children]
        out = new(cls)
        attributes = blank.copy()
        for name, i in present:
            value = values[i]
            attributes[name] = value
            if value is not None:
                setitem(out, name, value)
        out.__dict__.update(attributes)
        return out

    return build


def _fast_cache(spec: Any, built: list[tuple[Build, bool]]) -> Build | None:
    """The direct build of a layered cache whose children are all tensor leaves
    (`capture.pytree.direct`), or None."""
    from capture.pytree import nodes

    if spec.type not in nodes.LAYERED_CACHES or not all(t for _, t in built):
        return None
    if any(not child.is_leaf() for child in spec.children()):
        return None
    from capture.pytree.direct import layered_cache

    build = layered_cache(spec.type, spec.context, len(built))
    if build is None:
        return None
    count = len(built)
    return lambda it: build(list(islice(it, count)))


def _same(a: Any, b: Any) -> bool:
    """Whether two trees built from the same leaves arrange the same objects the same way:
    types, mapping items in order, sequence items, attributes in order, leaves by identity."""
    import torch

    if a is b:
        return True
    if type(a) is not type(b) or isinstance(a, torch.Tensor):
        return False
    if isinstance(a, dict):
        if list(a) != list(b) or not all(_same(a[k], b[k]) for k in a):
            return False
    elif isinstance(a, list | tuple):
        if len(a) != len(b) or not all(_same(x, y) for x, y in zip(a, b, strict=True)):
            return False
    if hasattr(a, "__dict__"):
        da, db = vars(a), vars(b)
        return list(da) == list(db) and all(_same(da[k], db[k]) for k in da)
    return isinstance(a, dict | list | tuple) or a == b
