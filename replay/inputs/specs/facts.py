"""Per-symbol facts of a call group's recorded sizes: range, optimization hint, divisor, 0/1.

Read from the group's signature matrix (one row per distinct recorded size vector, with its
call count: `replay.inputs.select.signatures`); this module imports no torch.

- **Range**: the recorded min and max of the symbol over every axis that carries it, widened to
  hold the representative example (`replay.inputs.select.representative`), as
  `replay.inputs.shapes.axis_specs` does for ``Dim`` ranges; no max for a forced batch dim that
  never varied.
- **Optimization hint**: the size most calls had (the call-weighted mode; a tie goes to the
  larger size). A compiler tunes kernels for the hint, and the time a server spends is spent
  on the sizes it is called with most, so the most frequent size is the one to be fast at; a
  median or mean may be a size no call ever had (a mean of prefill lengths 8 and 512).
- **Divisor**: the greatest common divisor ``k`` of the symbol's distinct recorded sizes, kept
  when ``k > 1``, the group has at least `MIN_DIVISOR_CALLS` calls, and the chance that ``d``
  distinct sizes share the factor ``k`` by accident, ``(1/k)**(d-1)``, is at most
  `MAX_DIVISOR_CHANCE` (1/64: a multiple of 8 needs 3 distinct sizes, a multiple of 2 needs 7).
  A workload padded with ``pad_to_multiple_of=8`` then carries ``seq % 8 == 0``. A divisor the
  example does not respect is dropped (with a note): the export traces the example.
- **Small sizes**: which of 0 and 1 the symbol was recorded at. torch's ``Dim`` ranges
  specialize a traced 0 or 1; a ``ShapesSpec`` size is unbacked, so the program keeps them.

A derived symbol (``attention_mask_1 = past_key_values_2 + 1``: `capture.analysis.groups`'
relations) is not a fact of its own: its axes carry the relation as an `Expr` over free symbols.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replay.inputs import select

if TYPE_CHECKING:
    from capture.analysis.groups import Group

__all__ = [
    "Expr",
    "SymbolFacts",
    "GroupFacts",
    "group_facts",
    "MIN_DIVISOR_CALLS",
    "MAX_DIVISOR_CHANCE",
]

MIN_DIVISOR_CALLS = 8
"""Fewest calls of a group before a shared divisor of its sizes is trusted."""

MAX_DIVISOR_CHANCE = 1 / 64
"""Largest chance ``(1/k)**(distinct sizes - 1)`` that the sizes share ``k`` by accident."""


@dataclass(frozen=True)
class Expr:
    """An axis size as ``sum(terms) + offset`` over free symbols (a term repeated is a factor).

    Attributes:
        terms: Free symbol names, each once per unit of coefficient.
        offset: The constant.
        rank: The rank of the tensor the axis belongs to.
        path: The pytree key path of that tensor (``kwargs['past_key_values'].key_cache[0]``).
    """

    terms: tuple[str, ...]
    offset: int = 0
    rank: int = 0
    path: str = ""

    def text(self, names: dict[str, str] | None = None) -> str:
        """``2 * a + b + 1`` with each symbol renamed through `names`."""
        names = names or {}
        counts = Counter(self.terms)
        parts = [
            names.get(t, t) if n == 1 else f"{n} * {names.get(t, t)}" for t, n in counts.items()
        ]
        text = " + ".join(parts) or "0"
        if self.offset:
            text += f" {'+' if self.offset > 0 else '-'} {abs(self.offset)}"
        return text


@dataclass(frozen=True)
class SymbolFacts:
    """What the recorded calls say about one free symbol (module docstring).

    Attributes:
        name: The symbol (``batch``, ``input_ids_1``).
        min: Smallest size (widened to the example).
        max: Largest size (widened to the example); None: unbounded.
        hint: The size most calls had; None when no axis carries the symbol.
        divisor: ``k > 1`` dividing every recorded size, when trusted; else None.
        sizes: Distinct recorded sizes.
        calls: Calls of the group.
        small: The recorded sizes among 0 and 1.
    """

    name: str
    min: int
    max: int | None
    hint: int | None
    divisor: int | None
    sizes: int
    calls: int
    small: tuple[int, ...] = ()


@dataclass
class GroupFacts:
    """The facts of one call group.

    Attributes:
        group: The group's name.
        symbols: Free symbol -> its facts.
        axes: Structure leaf -> axis -> the axis size as an `Expr`.
        notes: What was decided and why (a divisor dropped, a relation kept).
    """

    group: str
    symbols: dict[str, SymbolFacts]
    axes: dict[int, dict[int, Expr]]
    notes: list[str] = field(default_factory=list)

    @property
    def assumptions(self) -> dict[str, int]:
        """Free symbol -> the divisor every recorded size of it shares."""
        return {s.name: s.divisor for s in self.symbols.values() if s.divisor is not None}

    @property
    def small(self) -> dict[str, tuple[int, ...]]:
        """Free symbol -> its recorded sizes among 0 and 1 (only symbols that have some)."""
        return {s.name: s.small for s in self.symbols.values() if s.small}


def _divisor(values: list[int], calls: int) -> int | None:
    distinct = sorted(set(values))
    k = math.gcd(*distinct) if distinct else 0
    if k <= 1 or calls < MIN_DIVISOR_CALLS or len(distinct) < 2:
        return None
    return k if (1 / k) ** (len(distinct) - 1) <= MAX_DIVISOR_CHANCE else None


def _resolve(symbol: str, relations: dict[str, tuple[tuple[str, ...], int]]) -> Expr:
    """A symbol as an `Expr` over free symbols (relations resolved through each other)."""
    seen: set[str] = set()
    terms: list[str] = [symbol]
    offset = 0
    while any(t in relations for t in terms):
        nxt: list[str] = []
        for t in terms:
            if t in relations and t not in seen:
                seen.add(t)
                sub, off = relations[t]
                nxt.extend(sub)
                offset += off
            else:
                nxt.append(t)
        if nxt == terms:
            break
        terms = nxt
    return Expr(tuple(terms), offset)


def group_facts(group: Group) -> GroupFacts:
    """The facts of a call group's recorded sizes (module docstring).

    Args:
        group: A call group from `capture.analysis.groups.analyze` (with its signature matrix).

    Returns:
        A `GroupFacts`.

    Raises:
        ReplayError: The group carries no signature matrix.

    Example:
        >>> facts = group_facts(analyze(store, "tiny-llama")[0])  # doctest: +SKIP
        >>> facts.symbols["batch"]  # doctest: +SKIP
        SymbolFacts(name='batch', min=1, max=4, hint=2, divisor=None, sizes=4, calls=24, ...)
    """
    rows = select.signatures(group)
    calls = sum(n for _, n in rows)
    example = select.representative(group).symbols
    relations = {r.symbol: (tuple(r.terms), int(r.offset)) for r in group.relations}
    ranks = {leaf.leaf: leaf.ndim for leaf in group.structure.leaves if leaf.is_tensor}
    paths = {leaf.leaf: leaf.path for leaf in group.structure.leaves}
    axes: dict[int, dict[int, Expr]] = {}
    columns: dict[str, list[int]] = {}
    forced: dict[str, bool] = {}
    for j, d in enumerate(group.dims):
        if not d.dynamic or d.symbol is None:
            continue
        expr = _resolve(d.symbol, relations)
        axes.setdefault(d.leaf, {})[d.axis] = Expr(
            expr.terms, expr.offset, ranks.get(d.leaf, d.axis + 1), paths.get(d.leaf, "")
        )
        if d.symbol not in relations:
            columns.setdefault(d.symbol, []).append(j)
            forced[d.symbol] = forced.get(d.symbol, True) and d.distinct <= 1
    symbols: dict[str, SymbolFacts] = {}
    notes: list[str] = []
    for name, cols in columns.items():
        weights: Counter[int] = Counter()
        for sizes, n in rows:
            weights[int(sizes[cols[0]])] += n
        values = sorted(weights)
        low, high = values[0], values[-1]
        if name in example:
            low, high = min(low, example[name]), max(high, example[name])
        hint = max(values, key=lambda v: (weights[v], v))
        divisor = _divisor(values, calls)
        if divisor is not None and name in example and example[name] % divisor:
            notes.append(
                f"{name}: every recorded size is a multiple of {divisor}, but the example "
                f"({example[name]}) is not; no assumption"
            )
            divisor = None
        small = tuple(v for v in values if v <= 1)
        symbols[name] = SymbolFacts(
            name,
            low,
            None if forced[name] else high,
            hint,
            divisor,
            len(values),
            calls,
            small,
        )
    for axes_of in axes.values():  # a relation's free symbol that no axis carries itself
        for expr in axes_of.values():
            for t in expr.terms:
                symbols.setdefault(t, SymbolFacts(t, 0, None, None, None, 0, calls))
    return GroupFacts(group.name, symbols, axes, notes)


def divisibility_conditions(group: Group) -> list[tuple[str, str]]:
    """The group's trusted divisors as size conditions over a call's dims, for the router.

    A program exported with a ``ShapesSpec`` asserts its ``assumptions`` itself; the artifact's
    guard (`replay.runtime.guards.ProgramGuard.conditions`) carries them too, so that a call
    outside them is routed elsewhere (or refused with the reason) instead of failing inside
    the program. Each is ``(expr over d<i>, text)``: ``d<i>`` is the first dim of the call
    (leaf then axis order, as ``calls.dims``) that carries the symbol
    (`replay.runtime.conditions` parses it as data).

    Example:
        >>> divisibility_conditions(prefill)  # doctest: +SKIP
        [('d1 % 8 == 0', 'input_ids_1 % 8 == 0 (every recorded size is a multiple of 8)')]
    """
    facts = group_facts(group)
    first: dict[str, int] = {}
    for j, d in enumerate(group.dims):
        if d.dynamic and d.symbol is not None:
            first.setdefault(d.symbol, j)
    return [
        (
            f"d{first[name]} % {k} == 0",
            f"{name} % {k} == 0 (every recorded size is a multiple of {k})",
        )
        for name, k in facts.assumptions.items()
        if name in first
    ]


def divisible_probes(
    group: Group, vectors: list[tuple[int, ...]], limit: int
) -> list[tuple[int, ...]]:
    """Probe size vectors moved onto the group's trusted divisors, for a ``ShapesSpec`` program.

    A probe (`replay.inputs.select.probes`: sizes between the recorded ones) of a symbol whose
    every recorded size is a multiple of ``k`` is rounded down to a multiple of ``k`` inside
    the recorded range (the program's assumption refuses anything else); derived axes are
    recomputed from their relation. Recorded signatures and duplicates are left out; at most
    `limit` are returned.
    """
    facts = group_facts(group)
    recorded = {sizes for sizes, _ in select.signatures(group)}
    columns: dict[str, int] = {}
    for j, d in enumerate(group.dims):
        if d.dynamic and d.symbol is not None:
            columns.setdefault(d.symbol, j)
    out: list[tuple[int, ...]] = []
    for vector in vectors:
        values = {s: int(vector[j]) for s, j in columns.items() if s in facts.symbols}
        for name, k in facts.assumptions.items():
            low = -(-facts.symbols[name].min // k) * k
            values[name] = max(low, values[name] // k * k)
        moved = list(vector)
        for j, d in enumerate(group.dims):
            expr = facts.axes.get(d.leaf, {}).get(d.axis)
            if expr is not None and all(t in values for t in expr.terms):
                moved[j] = sum(values[t] for t in expr.terms) + expr.offset
        probe = tuple(moved)
        if probe not in recorded and probe not in out:
            out.append(probe)
    return out[:limit]
