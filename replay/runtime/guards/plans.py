"""A guard's checks laid out as flat tuples (`Plan`), and which size conditions the range,
equality and relation checks already imply (`implied`, by exhaustive evaluation).

Needs neither torch nor the model's code.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from operator import le

from replay.runtime.conditions import Condition
from replay.runtime.guards.axes import Axis, Relation

__all__ = ["MAX_CASES", "Plan", "plan", "implied"]


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
