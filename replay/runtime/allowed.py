"""What an artifact may name beyond the built-in lists: pytree types, and the caller's operators.

**Operators.** A program calls only the model's math (`replay.runtime.pt2.operators`, the ONNX
set's standard domains: `replay.runtime.ort.checks`), and the namespaces or operators the caller
names (`allow_ops`: ``replay.load(path, allow_ops=...)``, ``capture check --allow-ops``).

**Pytree types.**
A program's input and output structure names pytree node types (``builtins.tuple``,
``transformers.cache_utils.DynamicCache``). Rebuilding one means running its registration, so a
loader accepts only types registered in the loading process already or living in an allow-listed
module whose import registers them: transformers (capture's own registrations of its caches, and
its `ModelOutput` classes) and the output-class families capture registers with key paths
(`capture.pytree.outputs.FAMILIES`: diffusers' `BaseOutput` subclasses, imported only under
``diffusers.`` and accepted only as such subclasses). Both runtimes read this one table: the
``.pt2`` reader and the ONNX set's manifest; ``capture check`` (no torch) reads the prefixes.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable

from capture.errors import CaptureError
from capture.pytree import outputs
from replay.runtime.checked_json import DOTTED
from replay.runtime.guards import ArtifactError

__all__ = ["ALLOWED_MODULES", "AllowOps", "allow_ops", "loadable_type", "register_types"]

AllowOps = frozenset[str]
"""Operator namespaces (``mylib``) and operators (``mylib.op``) a caller allows."""

ALLOWED_MODULES = ("transformers.", *(family.prefix for family in outputs.FAMILIES))
"""Modules whose pytree registrations an artifact may ask the loader to import."""


def loadable_type(name: str) -> bool:
    """Whether `load` may rebuild a pytree node type a program names: a type of
    `ALLOWED_MODULES` (``transformers.*``, ``diffusers.*``: registered by importing its module)
    or one registered with torch's pytree in this process (without torch imported, as in
    ``capture check``, only the former).

    Example:
        >>> loadable_type("transformers.cache_utils.DynamicCache"), loadable_type("evil.Thing")
        (True, False)
        >>> loadable_type("diffusers.models.unets.unet_2d_condition.UNet2DConditionOutput")
        True
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
    for name in types:  # registered by the caller's import of the library: key paths added
        if name in known and outputs.family_of(name) is not None:
            outputs.add_keys(known[name])
    missing = sorted(t for t in types if t not in known)
    if not missing:
        return
    if any(t.startswith("transformers.") for t in missing):
        nodes.acquire()  # held for the life of the process: the runner needs them on every call
    for name in missing:
        if name in known:
            continue
        if outputs.family_of(name) is not None:
            try:
                outputs.load_output_type(name)
            except CaptureError as e:
                raise ArtifactError(f"the artifact's programs name {name}: {e}") from e
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


def allow_ops(names: Iterable[str] | None) -> AllowOps:
    """The caller's extra namespaces/operators, normalised (``mylib::op`` -> ``mylib.op``).

    A name is a namespace (``mylib``: every operator of a library the serving process loads),
    one operator (``mylib.op``, ``aten._int_mm``: every overload) or one overload
    (``quantized_decomposed.quantize_per_tensor.default``), in any namespace; ``aten`` as a
    whole is refused (it holds the file and printing operators the list keeps out: name its
    operators one by one).

    Raises:
        ArtifactError: A name that is none of these.

    Example:
        >>> sorted(allow_ops(["mylib", "other::fused", "aten._int_mm", "qd.quantize.default"]))
        ['aten._int_mm', 'mylib', 'other.fused', 'qd.quantize.default']
    """
    out = set()
    for name in names or ():
        text = str(name).replace("::", ".")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}", text):
            raise ArtifactError(
                f"allow_ops: {str(name)[:80]!r} is not an operator namespace (mylib), one "
                "operator (mylib.op, aten._int_mm) or one overload (mylib.op.default)"
            )
        if text == "aten":
            raise ArtifactError(
                "allow_ops: 'aten' would allow every torch operator, files and printing among "
                "them; name the operators (aten._int_mm, aten.bincount)"
            )
        out.add(text)
    return frozenset(out)
