"""A node's arguments are named as its operator's schema names them.

The graph check reads a node's arguments by name (`effects`: ``train``, ``dropout_p``, ``self``;
`budget`: ``size``, ``shape``, ``repeats``) while the program builder passes the positional
ones by position, as torch does. A program that names a positional argument after another one
(``train=False`` written where torch reads ``p``) would pass one check and run another value,
so `check_names` holds every ``aten`` node to its schema: a positional argument carries the
name of the schema's argument at its position, a keyword one a name the schema has.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping
from typing import Any

from replay.runtime.guards import ArtifactError

__all__ = ["check_names"]

_SCHEMA_NAMES: dict[int, tuple[str, ...]] = {}
"""id(operator overload) -> its schema's argument names, read once per process."""


def check_names(target: Any, node: Mapping[str, Any], source: str) -> None:
    """Refuses a node whose argument names are not its operator's (module docstring).

    Args:
        target: The resolved operator (an ``OpOverload``; other targets are not checked).
        node: The node's JSON.
        source: The entry's name, for errors.

    Raises:
        ArtifactError: One line naming the node and the argument.
    """
    names = _SCHEMA_NAMES.get(id(target))
    if names is None:
        schema = getattr(target, "_schema", None)
        if schema is None or not str(getattr(target, "namespace", "")) == "aten":
            return
        names = _SCHEMA_NAMES[id(target)] = tuple(a.name for a in schema.arguments)
    position = 0
    for item in node.get("inputs") or ():
        name = item.get("name", "") if isinstance(item, dict) else ""
        if item.get("kind", 1) == 2 and name and not keyword.iskeyword(name):
            expected, ok = name, name in names
        else:
            expected = names[position] if position < len(names) else "nothing"
            ok = name == expected
            position += 1
        if not ok:
            raise ArtifactError(
                f"{source}: node {str(node.get('name'))[:80]} ({str(node.get('target'))[:120]}) "
                f"passes {str(name)[:40]!r} where the operator takes {expected!r}; torch.export "
                "names each argument as the operator's schema does, so it is not loaded"
            )
