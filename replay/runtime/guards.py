"""What a saved program accepts: its call structure and the recorded ranges of its dims.

An artifact (`replay.runtime.pt2.loading`) stores one `ProgramGuard` per program in its JSON
manifest. The runner (`replay.load`) and the drift check (``capture check``) both ask the same two
questions of a call, through one function (`route`), so that what ``capture check`` reports as
served is
exactly what the runner serves:

1. **Structure**: does the call have the program's recorded structure? The treespec of
   ``(args, kwargs)`` and, per leaf, its path, kind, dtype, rank and scalar value must be the
   recorded ones (devices and value-range bookkeeping are left out: they do not change what the
   program computes).
2. **Dims**: is every input size within what the export was checked on? A static dim must have
   its recorded size; a dynamic dim must lie within its recorded ``[min, max]``; dims that were
   equal in every recorded call (one symbol) must be equal; a recorded relation
   (``mask = past + 1``) must hold; for a program that does not check its own size guards
   (an ONNX file, `replay.onnx`), those guards must hold too (`conditions`, parsed by
   `replay.runtime.conditions`, never evaluated as code).

A served call needs only the yes; the sentence is wanted once a check fails. So each guard is
also laid out as a `Plan`, flat tuples a few C-level loops read (every axis's accepted range,
the pairs of axes that must be equal, the relations over dim indices, the size conditions left
to evaluate), and `ProgramGuard.check` describes a failure only when the plan refuses. A size
condition is left out of the plan only when the other checks imply it: evaluated on every
assignment of the dims it reads that the range, equality and relation checks let through (at
most `MAX_CASES`), it holds on each. That is an exhaustive evaluation of the condition's own
closures, never a symbolic argument; torch.export's guards on a cache or a mask (``(d0) ==
(d18)`` for two axes of one symbol, ``1 + d4 - d21 <= 0`` for a recorded ``mask = past + 1``)
are implied this way, the ones that carve a hole in a range (``16*d1 != 80``) are kept.

A program refused for its structure is refused with what differs, by key path
(`structure_difference`: an input the call does not pass, one the program does not take, a
dtype, a rank, a constant); the number of differing inputs says which program came closest.

The ``.pt2`` runner, the ONNX runner and ``capture check`` (of either) all route with `route`.

Reading a manifest and checking guards needs neither torch nor the model's code.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import le
from typing import Any, Protocol

from capture import schema
from capture.errors import ReplayError
from replay.runtime.conditions import Condition

__all__ = [
    "ProgramGuard",
    "Axis",
    "Relation",
    "route",
    "CallFacts",
    "STRUCTURE_DIFFERS",
    "ArtifactError",
    "CallNotServed",
    "LeafFacts",
    "leaf_key",
    "LEAF_FIELDS",
    "structure_difference",
    "Plan",
    "plan",
    "implied",
    "MAX_CASES",
]


class ArtifactError(ReplayError):
    """An artifact cannot be written or read (not a capture artifact, unknown format, ...)."""


class CallNotServed(ArtifactError):
    """No program of the artifact accepts a call; the message names each group tried and why.

    Attributes:
        reasons: Group label -> the guard that failed, or "different call structure: " and
            the inputs that differ, by key path (`structure_difference`).
    """

    def __init__(self, message: str, reasons: Mapping[str, str]) -> None:
        super().__init__(message)
        self.reasons = dict(reasons)


LEAF_FIELDS = ("path", "kind", "dtype", "rank", "value")

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
"""A Python identifier (ASCII): argument names, symbols."""

MAX_RANK = 64
"""Most axes a recorded tensor may have in a manifest."""
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


@dataclass(frozen=True)
class Axis:
    """One tensor axis of a program's inputs, as the export was checked on it.

    Attributes:
        path: The input's key path (``kwargs['input_ids']``).
        axis: The axis index.
        min: Smallest recorded size.
        max: Largest recorded size.
        dynamic: Whether the program takes more than one size here (else only `min`).
        symbol: The shared symbol of axes equal in every recorded call (None: none).
        narrowed: `min` and `max` are the program's own bounds, tighter than the recorded
            range (an ONNX file, which does not check them itself: `replay.onnx`).
    """

    path: str
    axis: int = field(metadata={"low": 0, "high": MAX_RANK})
    min: int = field(metadata={"low": 0})
    max: int = field(metadata={"low": 0})
    dynamic: bool
    symbol: str | None = field(default=None, metadata={"pattern": NAME, "max_len": 256})
    narrowed: bool = field(default=False, metadata={"omit_default": True})

    def invalid(self) -> str | None:
        """What is wrong beyond the fields' types (`replay.runtime.checked_json.read`)."""
        return f"has min {self.min} > max {self.max}" if self.min > self.max else None


@dataclass(frozen=True)
class Relation:
    """A recorded relation between symbols: ``symbol == sum(terms) + offset``."""

    symbol: str = field(metadata={"pattern": NAME, "max_len": 256})
    terms: tuple[str, ...] = field(metadata={"pattern": NAME, "max_len": 256})
    offset: int


STRUCTURE_DIFFERS = "different call structure"
"""How `route`'s reason for a program whose recorded structure is not the call's begins; what
differs follows, by key path (`structure_difference`)."""


@dataclass(frozen=True)
class ProgramGuard:
    """The guards of one program of an artifact (`replay.runtime.manifest.ProgramEntry.guard`).

    Attributes:
        module: The sub-module name (``""`` for the model itself, ``encoder``, ...).
        group: The call group name (``decode``, ``prefill``, ``g0``).
        program: The program's name inside the archive.
        treespec: The recorded treespec of ``(args, kwargs)`` (torch's JSON).
        leaves: The recorded leaves (their `LEAF_FIELDS` are compared).
        axes: One per tensor axis, in the order of a call's ``dims``.
        relations: Recorded relations between the axes' symbols.
        rejected: Recorded size vectors the program failed in the export's check -> why:
            within the ranges, yet not served.
        conditions: The program's own size guards over the call's dims, for a program that
            does not check them itself (an ONNX file; empty for a ``.pt2`` program, whose
            module checks them on every call).
    """

    module: str
    group: str
    program: str
    treespec: str | None
    leaves: tuple[LeafFacts, ...]
    axes: tuple[Axis, ...]
    relations: tuple[Relation, ...] = ()
    rejected: Mapping[tuple[int, ...], str] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()

    @property
    def label(self) -> str:
        """``decode`` or ``encoder.g0``: how messages name the program's group."""
        return f"{self.module}.{self.group}" if self.module else self.group

    def matches(self, treespec: str | None, leaves: Iterable[LeafFacts]) -> bool:
        """Tells whether a call structure is the program's recorded structure: the same
        treespec and the same leaves (`LEAF_FIELDS`). Nothing else stands in for them (a
        structure id names a store's structure, not what the program takes)."""
        if treespec != self.treespec:
            return False
        return leaf_key(leaves) == self._leaf_key

    @functools.cached_property
    def _leaf_key(self) -> tuple[tuple[Any, ...], ...]:
        return leaf_key(self.leaves)

    def check(self, dims: Sequence[int]) -> str | None:
        """None when the sizes are within the guards, else the first guard that fails.

        Args:
            dims: Every input tensor size of the call, in leaf order then axis order (the
                store's ``calls.dims``).

        Returns:
            None, or a sentence naming the input, the axis, the size and the accepted range.

        Example:
            >>> guard = ProgramGuard("", "g0", "g0", None, (), (Axis("args[0]", 0, 4, 64, True),))
            >>> guard.check([300])
            'args[0] axis 0 = 300 is outside the recorded range [4, 64]'
        """
        if self.rejected:
            failed = self.rejected.get(tuple(int(v) for v in dims))
            if failed is not None:
                return f"this recorded signature failed the export's check ({failed})"
        if self._plan.accepts(dims):  # a served call: the flat checks only, no sentence
            return None
        return self._failure(dims)

    @functools.cached_property
    def _plan(self) -> Plan:
        return plan(self.axes, self.relations, self.conditions)

    def _failure(self, dims: Sequence[int]) -> str | None:
        """The first guard that refuses `dims`, in a sentence (None: all pass)."""
        if len(dims) != len(self.axes):
            return f"the call has {len(dims)} tensor dims, the program {len(self.axes)}"
        symbols: dict[str, tuple[int, Axis]] = {}
        for size, ax in zip(dims, self.axes, strict=True):
            if not ax.dynamic and size != ax.min:
                where = f"{ax.path} axis {ax.axis}"
                return f"{where} = {size}, the program takes {ax.min} only (static)"
            if not ax.min <= size <= ax.max:
                where = f"{ax.path} axis {ax.axis}"
                what = "its program's range" if ax.narrowed else "the recorded range"
                return f"{where} = {size} is outside {what} [{ax.min}, {ax.max}]"
            if ax.symbol:
                seen = symbols.setdefault(ax.symbol, (int(size), ax))
                if seen[0] != size:
                    first = seen[1]
                    return (
                        f"{ax.path} axis {ax.axis} = {size} but {first.path} axis {first.axis} = "
                        f"{seen[0]}: they were equal in every recorded call"
                    )
        for rel in self.relations:
            names = [rel.symbol, *rel.terms]
            if any(n not in symbols for n in names):
                continue
            left, at = symbols[rel.symbol]
            right = sum(symbols[n][0] for n in rel.terms) + rel.offset
            if left != right:
                where = f"{at.path} axis {at.axis}"
                expr = " + ".join([*rel.terms, str(rel.offset)])
                return (
                    f"{where} = {left}, but {rel.symbol} = {expr} held in every recorded call "
                    f"(= {right} here)"
                )
        for condition in self.conditions:
            if not condition.holds(dims):
                return f"its program's guard {condition.text} does not hold"
        return None


MAX_CASES = 4096
"""Most assignments a condition is evaluated on to find it implied (else it is kept)."""


@dataclass(frozen=True)
class Plan:
    """A guard's checks as flat tuples, what `ProgramGuard.check` runs first (module docstring).

    Attributes:
        size: How many dims a call must have.
        lo: Per dim, the smallest size accepted.
        hi: Per dim, the largest size accepted.
        equal: ``(i, j)``: dims ``i`` and ``j`` must be equal (one symbol).
        relations: ``(i, terms, offset)``: ``dims[i] == sum(dims[t] for t in terms) + offset``.
        conditions: The size conditions to evaluate (the others are implied).
    """

    size: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    equal: tuple[tuple[int, int], ...]
    relations: tuple[tuple[int, tuple[int, ...], int], ...]
    conditions: tuple[Condition, ...]

    def accepts(self, dims: Sequence[int]) -> bool:
        """Whether a call with these sizes passes every check of the guard (its rejected
        signatures aside: `ProgramGuard.check` looks them up first)."""
        if len(dims) != self.size:
            return False
        if not (all(map(le, self.lo, dims)) and all(map(le, dims, self.hi))):
            return False
        for i, j in self.equal:
            if dims[i] != dims[j]:
                return False
        for i, terms, offset in self.relations:
            if dims[i] != sum([dims[t] for t in terms]) + offset:
                return False
        for condition in self.conditions:
            if not condition.holds(dims):
                return False
        return True


def plan(
    axes: Sequence[Axis], relations: Sequence[Relation], conditions: Sequence[Condition]
) -> Plan:
    """The `Plan` of a guard's checks: its axes, symbols and relations over dim indices, and the
    size conditions they do not imply."""
    lo = tuple(ax.min for ax in axes)
    hi = tuple(ax.max if ax.dynamic else ax.min for ax in axes)
    first: dict[str, int] = {}
    equal: list[tuple[int, int]] = []
    for i, ax in enumerate(axes):
        if ax.symbol:
            at = first.setdefault(ax.symbol, i)
            if at != i:
                equal.append((at, i))
    over_dims = tuple(
        (first[r.symbol], tuple(first[t] for t in r.terms), r.offset)
        for r in relations
        if r.symbol in first and all(t in first for t in r.terms)
    )
    kept = tuple(c for c in conditions if not implied(c, lo, hi, equal, over_dims, len(lo)))
    return Plan(len(lo), lo, hi, tuple(equal), over_dims, kept)


def implied(
    condition: Condition,
    lo: Sequence[int],
    hi: Sequence[int],
    equal: Sequence[tuple[int, int]],
    relations: Sequence[tuple[int, tuple[int, ...], int]],
    size: int,
) -> bool:
    """Whether `condition` holds on every assignment of its dims that the other checks accept.

    The dims the condition reads are grouped by the equalities (one variable per group, its
    range the intersection of its members'); a group a relation defines from other groups takes
    their sum, and an assignment where that sum leaves the group's range is not one the checks
    let through. Each remaining combination is evaluated, up to `MAX_CASES` of them.

    Example:
        >>> c = Condition("(d0) == (d1)", "x == y")
        >>> implied(c, (1, 1), (8, 8), [(0, 1)], [], 2), implied(c, (1, 1), (8, 8), [], [], 2)
        (True, False)
    """
    reads = condition.reads
    if not reads or max(reads) >= size:
        return False
    root = list(range(size))
    for i, j in equal:
        root[j] = root[i]
    low: dict[int, int] = {}
    high: dict[int, int] = {}
    for i in range(size):  # a group's range: what every member accepts
        r = root[i]
        low[r] = max(low.get(r, lo[i]), lo[i])
        high[r] = min(high.get(r, hi[i]), hi[i])
    defined: dict[int, tuple[tuple[int, ...], int]] = {}
    for i, terms, offset in relations:
        defined.setdefault(root[i], (tuple(root[t] for t in terms), offset))
    needed = {root[i] for i in reads}
    free: set[int] = set()
    for r in needed:
        if r in defined:
            terms, _ = defined[r]
            if any(t in defined for t in terms):
                return False  # a relation over another relation's symbol: not evaluated
            free.update(terms)
        else:
            free.add(r)
    order = sorted(free)
    cases = 1
    for r in order:
        if high[r] < low[r]:
            return True  # no call passes the range checks: nothing to hold
        cases *= high[r] - low[r] + 1
        if cases > MAX_CASES:
            return False
    dims = [0] * size
    for values in itertools.product(*(range(low[r], high[r] + 1) for r in order)):
        value = dict(zip(order, values, strict=True))
        for r in needed:
            if r in defined:
                terms, offset = defined[r]
                v = sum(value[t] for t in terms) + offset
                if not low[r] <= v <= high[r]:
                    break
                value[r] = v
        else:
            for i in reads:
                dims[i] = value[root[i]]
            if not condition.holds(dims):
                return False
    return True


CallFacts = tuple[str | None, Sequence[LeafFacts], Sequence[int]]
"""What routing compares of a call: its treespec, its leaves, its input sizes."""


def route(
    guards: Iterable[ProgramGuard],
    facts: Callable[[ProgramGuard], CallFacts],
    distances: dict[str, int] | None = None,
) -> tuple[ProgramGuard | None, dict[str, str]]:
    """The program that serves a call, tried in order, and why each one before it did not.

    The one matching rule of an artifact: the runner (`replay.runtime.runner.Runner`) routes live
    calls with it, ``capture check`` (`replay.check.drift`) recorded signatures, so a signature
    reported served is one the runner serves.

    Args:
        guards: The programs' guards, in the order they are tried.
        facts: A program's guard -> the call's treespec, leaves and sizes as that program
            sees them (the runner describes a live call with the program's recorded
            signature; a recorded call has one description for every program).
        distances: Filled, when given, with group label -> how many inputs of the call differ
            from the program's recorded structure (0: the structure matched, a guard failed),
            for naming the group that came closest.

    Returns:
        ``(guard, {})``: the first guard whose structure matches and whose checks pass; or
        ``(None, reasons)`` when none does: group label -> why each program refused.

    Example:
        >>> guard = ProgramGuard("", "g0", "g0", None, (), (Axis("args[0]", 0, 2, 4, True),))
        >>> route([guard], lambda g: (None, (), [9]))[1]
        {'g0': 'args[0] axis 0 = 9 is outside the recorded range [2, 4]'}
    """
    # A served call pays for no explanation: what differs between structures (the costly part,
    # a walk over both leaf lists) is described only once no program accepts the call.
    refused: list[tuple[ProgramGuard, CallFacts, str | None]] = []
    for guard in guards:
        call = facts(guard)
        treespec, leaves, dims = call
        if not guard.matches(treespec, leaves):
            refused.append((guard, call, None))
            continue
        failed = guard.check(dims)
        if failed is None:
            return guard, {}
        refused.append((guard, call, failed))
    reasons: dict[str, str] = {}
    for guard, (treespec, leaves, _dims), failed in refused:
        differing = 0  # inputs that differ from the recorded structure; 0: a guard failed
        if failed is None:
            count, what = structure_difference(guard.treespec, guard.leaves, treespec, leaves)
            failed = f"{STRUCTURE_DIFFERS}: {what}" if what else STRUCTURE_DIFFERS
            differing = max(count, 1)
        reasons[guard.label] = failed
        if distances is not None:
            distances[guard.label] = differing
    return None, reasons
