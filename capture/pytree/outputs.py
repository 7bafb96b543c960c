"""Model libraries' output classes as pytree nodes with key paths (diffusers' `BaseOutput`).

transformers registers every `ModelOutput` subclass with torch's pytree, key paths included, so
a ``CausalLMOutputWithPast`` flattens to ``output['logits']``, ... . diffusers registers its
`BaseOutput` subclasses too (``UNet2DConditionOutput``, ``AutoencoderKLOutput``: a dict of
fields), but without a ``flatten_with_keys_fn``: ``tree_flatten_with_path`` (what the
recorder's `capture.record.call_structure.describe`, torch.export's output spec and the ONNX output
names use) refuses them, and the recorder would keep the whole output as one opaque leaf.

capture owns this registration: `FAMILIES` lists the libraries whose output classes it takes,
each by its package prefix and output base class. For a class of such a family that its library
registered without key paths, `add_keys` adds them (the dict flattening the library already
registered, with ``MappingKey`` paths: the leaves, their order and the serialized name do not
change). It never imports the library (a class it sees was made by the caller's own imports);
the loader of an artifact calls `load_output_type`, which imports only a module under a family's
prefix and accepts only a subclass of the family's base class.

The key paths stay for the life of the process: they change nothing else about the class.
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass
from typing import Any

from capture.errors import CaptureError

__all__ = [
    "FAMILIES",
    "OutputFamily",
    "add_keys",
    "add_keys_to_registered",
    "family_of",
    "load_output_type",
]


@dataclass(frozen=True)
class OutputFamily:
    """One library whose output classes capture registers with key paths.

    Attributes:
        prefix: The library's package prefix (``"diffusers."``): the serialized names of its
            classes start with it, and an artifact may name them.
        base_module: The module defining the output base class.
        base_name: The output base class (every output class of the library subclasses it).
    """

    prefix: str
    base_module: str
    base_name: str

    def base(self) -> type | None:
        """The base class when its library is imported in this process (never imports it)."""
        module = sys.modules.get(self.base_module)
        base = getattr(module, self.base_name, None) if module is not None else None
        return base if isinstance(base, type) else None


FAMILIES: tuple[OutputFamily, ...] = (
    OutputFamily("diffusers.", "diffusers.utils.outputs", "BaseOutput"),
)
"""The libraries whose output classes `add_keys` completes (transformers' need nothing)."""

_LOCK = threading.Lock()
_DONE: set[type] = set()
_OTHER: set[type] = set()  # registered without key paths, but no family's: left as they are


def _family(tp: type) -> OutputFamily | None:
    for family in FAMILIES:
        base = family.base()
        if base is not None and issubclass(tp, base) and tp is not base:
            return family
    return None


def add_keys(tp: type) -> bool:
    """Gives `tp`'s pytree registration key paths when it is an output class of `FAMILIES`.

    Returns:
        True when `tp` now flattens with key paths (added here, or it had them); False for a
        class that is not registered, or registered without key paths by someone else.
    """
    from capture import compat

    node = compat.pytree_nodes().get(tp)
    if node is None:
        return False
    if node.flatten_with_keys_fn is not None or tp in _DONE:
        return True
    if tp in _OTHER:
        return False
    with _LOCK:
        if _family(tp) is None:
            _OTHER.add(tp)
            return False
        _add(tp, node)
        _DONE.add(tp)
    return True


def _add(tp: type, node: Any) -> None:
    import torch.utils._pytree as pytree

    flatten = node.flatten_fn

    def flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, Any]], Any]:
        # The library's own flatten (a dict's values and keys): the same leaves, in order.
        values, context = flatten(obj)
        return [(pytree.MappingKey(k), v) for k, v in zip(context, values, strict=True)], context

    from capture import compat

    # torch's registry has no public way to complete a registration; its entry is replaced by
    # the same node with key paths (one dict assignment: a walker sees the old or the new one).
    compat.pytree_nodes()[tp] = node._replace(flatten_with_keys_fn=flatten_with_keys)  # type: ignore[index]


def add_keys_to_registered() -> None:
    """`add_keys` for every registered class of an imported family (an export or a load in a
    process that never recorded: the model's module registered its output classes)."""
    from capture import compat

    if not any(family.base() is not None for family in FAMILIES):
        return
    missing = [
        tp
        for tp, node in list(compat.pytree_nodes().items())
        if node.flatten_with_keys_fn is None and tp not in _OTHER
    ]
    for tp in missing:
        add_keys(tp)


def family_of(name: str) -> OutputFamily | None:
    """The family whose classes a serialized type name may designate (by prefix; no import).

    Example:
        >>> family_of("diffusers.models.unets.unet_2d_condition.UNet2DConditionOutput").prefix
        'diffusers.'
        >>> family_of("evil.Thing") is None
        True
    """
    return next((f for f in FAMILIES if name.startswith(f.prefix)), None)


def load_output_type(name: str) -> type:
    """Imports the output class an artifact names and registers it with key paths.

    Only a module under a family's prefix is imported, and only a subclass of the family's
    base class its library registered with torch's pytree is accepted.

    Raises:
        CaptureError: The name is no family's, its module cannot be imported, or it does not
            designate a registered output class of the family.
    """
    family = family_of(name)
    if family is None:
        raise CaptureError(f"{name} is not an output class of {', '.join(_prefixes())}")
    module_name, _, class_name = name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        importlib.import_module(family.base_module)
    except ImportError as e:
        raise CaptureError(f"{name} needs {module_name}, which cannot be imported: {e}") from e
    tp = getattr(module, class_name, None)
    base = family.base()
    if not isinstance(tp, type) or base is None or not issubclass(tp, base) or tp is base:
        raise CaptureError(
            f"{name} is not an output class of {family.prefix.rstrip('.')} "
            f"(a subclass of {family.base_module}.{family.base_name})"
        )
    if not add_keys(tp):
        raise CaptureError(f"{name} is not registered with torch's pytree by its library")
    return tp


def _prefixes() -> list[str]:
    return [f.prefix.rstrip(".") for f in FAMILIES]
