"""Whether a call has a program's recorded structure, and what differs when it does not: the
leaf facts compared (`LEAF_FIELDS`), their comparable key, and the difference by key path.

Needs neither torch nor the model's code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from capture import schema

__all__ = [
    "LEAF_FIELDS",
    "LeafFacts",
    "leaf_key",
    "SHOWN",
    "STRUCTURE_DIFFERS",
    "structure_difference",
]

LEAF_FIELDS = ("path", "kind", "dtype", "rank", "value")
"""The leaf columns that make a structure, for matching (device and bookkeeping left out)."""

_TENSOR = schema.KIND_TENSOR


class LeafFacts(Protocol):
    """The facts of a leaf that matching compares (`LEAF_FIELDS`): a
    recorded leaf or a live call's, both a `capture.pytree.recorded_structure.RecordedLeaf`
    (a live call's described by `capture.record.call_structure.describe`)."""

    @property
    def path(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def value(self) -> str | None: ...


def leaf_key(leaves: Iterable[LeafFacts]) -> tuple[tuple[Any, ...], ...]:
    """The comparable form of a structure's leaves.

    Example:
        >>> from capture.pytree.recorded_structure import RecordedLeaf
        >>> leaf_key([RecordedLeaf(0, "args[0]", None, 0, "tensor", dtype="float32", rank=2)])
        (('args[0]', 'tensor', 'float32', 2, None),)
    """
    # A tensor leaf's value is bookkeeping (where its special token counts are),
    # written only where value ranges were recorded: not part of the structure.
    return tuple(
        (leaf.path, leaf.kind, leaf.dtype, leaf.rank, None if leaf.kind == _TENSOR else leaf.value)
        for leaf in leaves
    )


SHOWN = 3
"""Differences named in one reason; the rest are counted (``+2 more``)."""


_ARGUMENT = re.compile(r"^(args\[\d+\]|kwargs\[[^\]]*\])")


def _what(kind: str, dtype: str | None, rank: int | None, value: str | None) -> str:
    if kind == schema.KIND_TENSOR:
        return f"a {dtype} tensor of rank {rank}"
    if kind == schema.KIND_NONE:
        return "None"
    if kind == schema.KIND_MISSING:
        return "nothing"
    if kind == schema.KIND_OPAQUE:
        return f"an object ({value})" if value else "an object"
    return f"{value}"


_Facts = tuple[str, str | None, int | None, str | None]


def _facts(leaf: LeafFacts) -> _Facts:
    tensor = leaf.kind == schema.KIND_TENSOR
    return (leaf.kind, leaf.dtype, leaf.rank, None if tensor else leaf.value)


def _argument(path: str) -> str:
    match = _ARGUMENT.match(path)
    return match.group(1) if match else path


def _under(path: str, parent: str) -> bool:
    """Whether `path` lies inside the input at `parent` (``kwargs['c'].key_cache[0]`` in
    ``kwargs['c']``)."""
    return path.startswith(parent) and path[len(parent) : len(parent) + 1] in (".", "[")


def _absent(paths: Sequence[str], other: Iterable[str]) -> list[str]:
    """`paths`, with every path of an argument that `other` lacks whole said once, as that
    argument (``kwargs['past_key_values']`` for its 8 cache tensors)."""
    present = {_argument(p) for p in other}
    out: list[str] = []
    for path in paths:
        argument = _argument(path)
        name = argument if argument not in present else path
        if name not in out:
            out.append(name)
    return out


def structure_difference(
    recorded_treespec: str | None,
    recorded: Sequence[LeafFacts],
    treespec: str | None,
    leaves: Sequence[LeafFacts],
) -> tuple[int, str]:
    """How far a call's structure is from a program's recorded one, and what differs.

    Args:
        recorded_treespec: The program's recorded treespec.
        recorded: The program's recorded leaves.
        treespec: The call's treespec.
        leaves: The call's leaves.

    Returns:
        ``(count, text)``: how many inputs differ (0: none, the structures match) and one
        sentence naming them by key path, at most `SHOWN` of them.

    Example:
        >>> from capture.pytree.recorded_structure import RecordedLeaf
        >>> x = RecordedLeaf(0, "args[0]", None, 0, "tensor", dtype="float32", rank=2)
        >>> mask = RecordedLeaf(1, "kwargs['m']", "m", None, "tensor", dtype="float32", rank=2)
        >>> structure_difference("t1", [x, mask], "t0", [x])
        (1, "the call does not pass kwargs['m'] (the program takes a float32 tensor of rank 2)")
    """
    mine = {leaf.path: _facts(leaf) for leaf in recorded}
    theirs = {leaf.path: _facts(leaf) for leaf in leaves}
    parts: list[str] = []
    done: set[str] = set()
    # One input replaced by a structure, or the reverse (a cache where the program takes None).
    for one, many, program_side in ((mine, theirs, True), (theirs, mine, False)):
        for path, facts in one.items():
            inner = [q for q in many if q not in one and _under(q, path)]
            if path in many or not inner:
                continue
            done.update([path, *inner])
            held = f"{len(inner)} inputs ({inner[0]}, ...)" if len(inner) > 1 else inner[0]
            if program_side:
                parts.append(f"{path} holds {held} in the call, the program takes {_what(*facts)}")
            else:
                parts.append(f"{path} is {_what(*facts)} in the call, the program takes {held}")
    mine = {p: f for p, f in mine.items() if p not in done}
    theirs = {p: f for p, f in theirs.items() if p not in done}
    missing = schema.KIND_MISSING

    def absent_from(side: dict[str, _Facts], path: str) -> bool:
        return path not in side or side[path][0] == missing

    lacking = [p for p, f in mine.items() if f[0] != missing and absent_from(theirs, p)]
    for name in _absent(lacking, [p for p in theirs if p not in lacking]):
        takes = mine.get(name)
        parts.append(
            f"the call does not pass {name}"
            + (f" (the program takes {_what(*takes)})" if takes is not None else "")
        )
    extra = [p for p, f in theirs.items() if f[0] != missing and absent_from(mine, p)]
    for name in _absent(extra, [p for p in mine if p not in extra]):
        parts.append(f"the call passes {name}, which the program does not take")
    changed: dict[tuple[str, _Facts, _Facts], list[str]] = {}
    for path, facts in mine.items():
        other = theirs.get(path)
        if other is None or other == facts or missing in (other[0], facts[0]):
            continue
        changed.setdefault((_argument(path), other, facts), []).append(path)
    for (argument, other, facts), paths in changed.items():
        more = f" and {len(paths) - 1} more of {argument}" if len(paths) > 1 else ""
        verb = "are" if more else "is"
        parts.append(f"{paths[0]}{more} {verb} {_what(*other)}, the program takes {_what(*facts)}")
    if not parts and recorded_treespec != treespec:
        parts.append("the call nests its inputs differently from the recorded calls")
    if not parts:
        return 0, ""
    text = "; ".join(parts[:SHOWN])
    if len(parts) > SHOWN:
        text += f"; +{len(parts) - SHOWN} more"
    return len(parts), text


STRUCTURE_DIFFERS = "different call structure"
"""How `route`'s reason for a program whose recorded structure is not the call's begins; what
differs follows, by key path (`structure_difference`)."""
