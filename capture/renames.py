"""Arguments a library renamed between its versions: one table, one canonical name each.

transformers 5.24 renamed ``forward``'s ``past_key_values`` and ``cache_params`` to ``cache``,
and keeps accepting the old names (until 5.40 for ``forward``). During a rolling upgrade one store
holds calls recorded under both spellings of the same argument. `RENAMED` maps every old name to
the current one; everything that compares argument names across calls reads it through this
module, never through a name test of its own:

- the recorder binds a call passing an old name to the parameter it renames (a model declaring
  ``cache`` and called with ``past_key_values=`` has no missing ``cache``:
  `capture.record.call_structure`);
- the analysis gives the structures that differ only by spelling one call group, named and
  shaped after its most recent recording (`capture.analysis.groups`), so the groups, dims and
  symbols of a store spanning an upgrade are those of a store recorded under one version;
- the exported program is called with the spelling it was exported with, whatever the caller
  passes (`replay.runtime.runner`).

The recorded data keep what the calls passed. Imports nothing but the standard library.

Example:
    >>> canonical("past_key_values"), canonical("cache_params"), canonical("input_ids")
    ('cache', 'cache', 'input_ids')
    >>> canonical_path("kwargs['past_key_values'].key_cache[0]")
    "kwargs['cache'].key_cache[0]"
    >>> respell({"ids": 1, "past_key_values": 2}, ["ids", "cache"])
    {'ids': 1, 'cache': 2}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

__all__ = ["RENAMED", "canonical", "canonical_path", "same_argument", "respell", "spelling_key"]

RENAMED: Mapping[str, str] = {
    # transformers 5.24: forward's cache argument (the old names accepted until 5.40)
    "past_key_values": "cache",
    "cache_params": "cache",
}
"""Old argument name -> its current name."""

_TOP = re.compile(r"^(kwargs\[')([^']*)('\])")

_V = TypeVar("_V")


def canonical(name: str) -> str:
    """The current name of an argument (itself when no library renamed it)."""
    return RENAMED.get(name, name)


def canonical_path(path: str) -> str:
    """A leaf path with its top-level keyword spelled by its current name."""
    match = _TOP.match(path)
    if match is None or match.group(2) not in RENAMED:
        return path
    return f"{match.group(1)}{RENAMED[match.group(2)]}{match.group(3)}{path[match.end() :]}"


def same_argument(name: str, names: Iterable[str]) -> str | None:
    """The spelling of argument `name` among `names` (`name` itself first), or None.

    Example:
        >>> same_argument("past_key_values", ["input_ids", "cache"])
        'cache'
        >>> same_argument("mask", ["input_ids"]) is None
        True
    """
    names = list(names)
    if name in names:
        return name
    wanted = canonical(name)
    return next((n for n in names if canonical(n) == wanted), None)


_SAME = ("position", "kind", "type", "dtype", "rank", "value", "dim_offset", "range_index")
"""The columns of a structure's rows that must agree for two spellings to be one structure."""


def spelling_key(rows: Iterable[Mapping[str, Any]]) -> tuple[Any, ...]:
    """A recorded structure's rows (``structures`` table, leaf order) with every renamed
    argument spelled by its current name: equal for structures that differ only by spelling.

    Example:
        >>> old = [{"path": "kwargs['past_key_values']", "argument": "past_key_values",
        ...         "kind": "none"}]
        >>> new = [{"path": "kwargs['cache']", "argument": "cache", "kind": "none"}]
        >>> spelling_key(old) == spelling_key(new)
        True
    """
    rows = list(rows)
    leaves = tuple(
        (
            canonical_path(str(r["path"])),
            canonical(r["argument"]) if r.get("argument") else None,
            *(r.get(c) for c in _SAME),
        )
        for r in rows
    )
    # The treespec says what the leaves do not: a cache layer's state (a sliding window full or
    # filling) lives in its context, so two structures that differ there stay two.
    treespec = next((r["treespec"] for r in rows if r.get("treespec")), None)
    return (*leaves, _respelled_json(treespec))


def _respelled_json(text: str | None) -> str | None:
    """A stored JSON text (a treespec) with every renamed argument's name, as a JSON string,
    spelled by its current name."""
    if text is None:
        return None
    for old, new in RENAMED.items():  # a dict's keys sit in a context, JSON inside JSON
        text = text.replace(f'\\"{old}\\"', f'\\"{new}\\"').replace(f'"{old}"', f'"{new}"')
    return text


def respell(kwargs: dict[str, _V], accepted: Iterable[str]) -> dict[str, _V]:
    """`kwargs` with each keyword a renamed argument spelled as `accepted` spells it.

    Keywords `accepted` does not know under any spelling stay as they are (the caller's checks
    name them). Returns `kwargs` itself when nothing is respelled.
    """
    accepted = set(accepted)
    if not kwargs.keys() - accepted or not any(
        canonical(k) != k or k in RENAMED.values() for k in kwargs
    ):
        return kwargs
    out: dict[str, Any] = {}
    for key, value in kwargs.items():
        spelled = key if key in accepted else same_argument(key, accepted)
        out[spelled or key] = value
    return out
