"""The seam to torch's pytree internals: its registry, its serialized-type tables, the leaf
treespec and deregistering a class (``torch.utils._pytree`` outside its ``__all__``).

No torch import at import time (the store side reads treespecs without torch).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from capture.compat.versions import CHECKED_ON, warn_lost

__all__ = ["deregister_pytree_node", "pytree_nodes", "serialized_pytree_types", "leaf_treespec"]


def deregister_pytree_node(cls: type) -> bool:
    """Removes a class from torch's pytree registry.

    Private API: ``torch.utils._pytree._deregister_pytree_node`` (torch 2.13.0); there is no
    public way to undo ``register_pytree_node``. Without it `register_flattening_functions`
    cannot undo its registrations: the classes stay registered for the life of the process.

    Returns:
        True when the class was deregistered, False when this torch cannot.
    """
    import torch.utils._pytree as pytree

    try:
        deregister = pytree._deregister_pytree_node
    except AttributeError as e:
        warn_lost("deregister_pytree_node", "registered cache classes stay registered", e)
        return False
    deregister(cls)
    return True


def pytree_nodes() -> Mapping[type, Any]:
    """torch's pytree registry: class -> its node definition (``flatten_fn``, ...), live.

    Private API: ``torch.utils._pytree.SUPPORTED_NODES`` (torch 2.13.0), the table every torch
    pytree walker reads. The recorder's walker (`capture.record.flatten`) looks registered
    classes up in it, as torch's own walkers do; without it nothing can be flattened the way
    torch flattens it, so its absence is an error at import, not a fallback.

    Raises:
        ImportError: This torch has no such registry.
    """
    import torch.utils._pytree as pytree

    try:
        nodes: Mapping[type, Any] = pytree.SUPPORTED_NODES
    except AttributeError as e:
        raise ImportError(
            f"capture needs torch.utils._pytree.SUPPORTED_NODES (checked on torch "
            f"{', '.join(CHECKED_ON)}); this torch has none ({e})"
        ) from e
    return nodes


def serialized_pytree_types() -> tuple[Mapping[str, type], Mapping[type, Any]] | None:
    """torch's tables of serializable pytree classes, when this process imported torch's pytree.

    Private API: ``torch.utils._pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE`` (serialized name ->
    class) and ``SUPPORTED_SERIALIZED_TYPES`` (class -> how its context is (de)serialized),
    torch 2.13.0. `capture.pytree.treespec` reads a stored treespec against them instead of
    ``treespec_loads`` (which would import what a store names). Without them only the builtin
    containers and transformers' caches are accepted in stored treespecs.

    Returns:
        ``(name -> class, class -> serialization)``, or None when torch's pytree is not imported
        (it is never imported here: the store side runs without torch).
    """
    pytree = sys.modules.get("torch.utils._pytree")
    if pytree is None:
        return None
    try:
        return pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE, pytree.SUPPORTED_SERIALIZED_TYPES
    except AttributeError as e:
        warn_lost(
            "serialized_pytree_types",
            "stored treespecs naming user-registered classes cannot be read",
            e,
        )
        return None


def leaf_treespec() -> Any:
    """The treespec of one leaf.

    Private API: ``torch.utils._pytree.treespec_leaf`` (torch 2.13.0; ``LeafSpec()``, public
    before, is deprecated there). Without either no stored treespec can be rebuilt.

    Raises:
        ImportError: This torch has neither.
    """
    import torch.utils._pytree as pytree

    make = getattr(pytree, "treespec_leaf", None) or getattr(pytree, "LeafSpec", None)
    if make is None:
        raise ImportError(
            "torch.utils._pytree has neither treespec_leaf nor LeafSpec (capture was checked on "
            f"torch {', '.join(CHECKED_ON)})"
        )
    return make()
