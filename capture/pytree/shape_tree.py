"""Dynamic shapes arranged like the inputs: one entry per pytree leaf, as torch.export wants.

Tuples stay tuples, lists lists, dicts dicts; a registered class (a transformers cache) becomes the
list of its children, so a `DynamicCache` gives a flat list of ``2 * layers`` per-tensor dicts.
Shared by `InputObserver` (`capture.seeds.alignment`) and `replay.ModelInputs`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch.utils._pytree as pytree

from capture.pytree import nodes

__all__ = ["dynamic_shapes_from_spec", "dynamic_shapes_like", "registered"]


@contextlib.contextmanager
def registered() -> Iterator[None]:
    """Registers the transformers caches with torch pytree for a block, if transformers is loaded.

    Example:
        >>> with registered():
        ...     pass
    """
    if not nodes.transformers_loaded():
        yield
        return
    with nodes.register_flattening_functions():
        yield


def dynamic_shapes_from_spec(spec: pytree.TreeSpec, leaves: Sequence[Any]) -> Any:
    """Rebuilds `leaves` (one dynamic shape per pytree leaf) in the structure torch.export wants.

    Tuples stay tuples, lists lists, dicts dicts; a registered class (a transformers cache)
    becomes the list of its children, recursively, so a `DynamicCache` gives a flat list of
    ``2 * layers`` per-tensor dicts.

    Args:
        spec: The treespec of the inputs (``torch.utils._pytree.tree_flatten(inputs)[1]``).
        leaves: One entry per leaf of `spec`: a ``{dim: Dim}`` dict for a tensor, else None.

    Returns:
        The nested dynamic shapes.

    Example:
        >>> import torch.utils._pytree as pytree
        >>> _, spec = pytree.tree_flatten(({"a": 1}, [2]))
        >>> dynamic_shapes_from_spec(spec, [{0: "n"}, None])
        ({'a': {0: 'n'}}, [None])
    """
    it = iter(leaves)

    def build(node: pytree.TreeSpec) -> Any:
        if node.is_leaf():
            return next(it)
        children = [build(child) for child in node.children()]
        kind = node.type
        if kind is type(None):
            return None
        if kind is list:
            return children
        if isinstance(kind, type) and issubclass(kind, dict):
            return dict(zip(node.context, children, strict=True))
        if isinstance(kind, type) and issubclass(kind, tuple):  # tuples and namedtuples
            return tuple(children)
        return children

    return build(spec)


def dynamic_shapes_like(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """Maps every leaf of `obj` with `leaf` and rebuilds the result as dynamic shapes.

    Args:
        obj: Inputs (any pytree; caches must be registered, see `registered`).
        leaf: Called on every leaf (tensor, scalar, None) in pytree order.

    Returns:
        The structure of `dynamic_shapes_from_spec`.

    Example:
        >>> import torch
        >>> dynamic_shapes_like((torch.zeros(2, 3),), lambda t: {0: "batch"})
        ({0: 'batch'},)
    """
    flat, spec = pytree.tree_flatten(obj)
    return dynamic_shapes_from_spec(spec, [leaf(x) for x in flat])
