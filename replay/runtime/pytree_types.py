"""Which pytree node types an artifact may name, and how a loader registers them.

A program's input and output structure names pytree node types (``builtins.tuple``,
``transformers.cache_utils.DynamicCache``). Rebuilding one means running its registration, so a
loader accepts only types registered in the loading process already or living in an allow-listed
module whose import registers them (capture's own registrations for transformers' caches). Both
runtimes read this one table: the ``.pt2`` reader and the ONNX set's manifest.
"""

from __future__ import annotations

import importlib

from replay.runtime.checked_json import DOTTED
from replay.runtime.guards import ArtifactError

__all__ = ["ALLOWED_MODULES", "loadable_type", "register_types"]

ALLOWED_MODULES = ("transformers.",)
"""Modules whose pytree registrations an artifact may ask the loader to import."""


def loadable_type(name: str) -> bool:
    """Whether `load` may rebuild a pytree node type a program names: a ``transformers.*`` type
    (registered by importing its module) or one registered with torch's pytree in this process
    (without torch imported, as in ``capture check``, only the former).

    Example:
        >>> loadable_type("transformers.cache_utils.DynamicCache"), loadable_type("evil.Thing")
        (True, False)
    """
    from capture import compat

    if not DOTTED.match(name):
        return False
    tables = compat.serialized_pytree_types()  # None without torch imported: capture check
    registered = tables is not None and name in tables[0]
    return registered or name.startswith(ALLOWED_MODULES)


def register_types(types: set[str]) -> None:
    """Registers the pytree node types the programs name (allow-listed modules only)."""
    import torch.utils._pytree  # noqa: F401 (torch's pytree tables exist once it is imported)

    from capture import compat
    from capture.pytree import nodes

    tables = compat.serialized_pytree_types()
    if tables is None:
        raise ArtifactError("torch's pytree registry cannot be read: the artifact cannot load")
    known = tables[0]
    missing = sorted(t for t in types if t not in known)
    if not missing:
        return
    if any(t.startswith("transformers.") for t in missing):
        nodes.acquire()  # held for the life of the process: the runner needs them on every call
    for name in missing:
        if name in known:
            continue
        module = name.rpartition(".")[0]
        if not module.startswith(ALLOWED_MODULES):
            raise ArtifactError(
                f"the artifact's programs name the pytree type {name}, which the loader does not "
                f"register (only {', '.join(ALLOWED_MODULES)} types are); register it with "
                "torch.utils._pytree before replay.load"
            )
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ArtifactError(f"the artifact needs {module} to load: {e}") from e
        if name not in known:
            raise ArtifactError(f"{name} is not a pytree node type after importing {module}")
