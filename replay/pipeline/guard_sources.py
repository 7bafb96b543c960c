"""Exported programs whose inputs are reached through a custom pytree key, made callable.

torch 2.13 spells the input guards of ``ep.module()`` with the *source* names of each input's key
path and a capture cache key's `GetAttrKey` name differs from its ``keystr``: `fix_guard_sources`
rewrites them (`replay.pipeline.exporting` calls it on every program it exports). The guards are a
private attribute of the program: read and written through `capture.compat`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.utils._pytree as pytree

from capture import compat
from capture.pytree import nodes

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["fix_guard_sources"]


def fix_guard_sources(ep: ExportedProgram) -> None:
    """Makes ``ep.module()`` runnable when an input is reached through a custom key.

    torch 2.13 writes the input guards with the *source* names of the key path
    (``L['past_key_values'].key_cache_0``, from `GetAttrKey.name`) and then replaces them with
    ``pytree.keystr`` of the same path (``.key_cache[0]`` for capture's `CacheKey`); when the two
    differ the guard function refers to an undefined ``L`` and every call fails with NameError.
    Rewriting the guards with ``keystr`` spellings is what torch does for the standard keys.

    Args:
        ep: A program `replay.pipeline.exporting` just exported (changed in place).

    Example:
        >>> fix_guard_sources(torch.export.export(model, args))  # doctest: +SKIP
    """
    code = compat.guards_code(ep)
    if not code or not ep.example_inputs:
        return
    with nodes.register_flattening_functions():
        flat, _ = pytree.tree_flatten_with_path(ep.example_inputs)
    replace: dict[str, str] = {}
    for path, _ in flat:
        source = "L"
        for key in path[1:]:
            if isinstance(key, pytree.MappingKey):
                source += f"[{key.key!r}]"
            elif isinstance(key, pytree.SequenceKey):
                source += f"[{key.idx}]"
            elif isinstance(key, pytree.GetAttrKey):
                source += f".{key.name}"
        spelled = "L" + pytree.keystr(tuple(path[1:]))
        if source != spelled:
            replace[source] = spelled
    if replace:
        fixed = []
        for guard in code:
            for old in sorted(replace, key=len, reverse=True):
                guard = guard.replace(old, replace[old])
            fixed.append(guard)
        compat.set_guards_code(ep, fixed)
