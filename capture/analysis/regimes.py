"""A regime of a call group: the group's calls within part of its recorded range, as a group.

torch.export may cut a group's recorded range with a guard (a sliding window: ``seq <= 6``; a
branch on a size): one program cannot serve both sides, so `replay.pipeline.splitting` exports each
side, a **regime**, on its own. `regime` makes the `Group` of a subset of the group's distinct
signatures, with what the analysis knows carried over rather than guessed again from fewer
points:

- **Ranges** (min, max, distinct) are the regime's own: they become its program's guards in an
  artifact, so regimes of one group never accept the same call.
- **Symbols and relations** are the group's: a relation true in every call of the group is true
  in every call of the regime, even when the regime has too few signatures to support it on its
  own (`capture.analysis.symbols`' ``min_support``). A symbol that takes one value in the regime
  becomes static there (a forced batch dim stays dynamic), and relations are rewritten over the
  symbols left: a static term joins the offset (``mask = past + seq`` with ``seq`` always 1 is
  ``mask = past + 1``), a relation reduced to one term without offset makes the two symbols one,
  and a derived symbol whose terms are all static is static itself.

It imports numpy only (no duckdb, no torch): the group already holds its signature matrix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from capture.analysis.groups import DimInfo, Group
from capture.analysis.symbols import Relation, format_expr
from capture.errors import ReplayError

__all__ = ["regime"]


def regime(group: Group, rows: Sequence[int], name: str) -> Group:
    """The group of the calls whose signatures are `rows` of ``group.matrix``.

    Args:
        group: A call group with its signature matrix (`capture.analysis.groups.analyze`).
        rows: Indices of the regime's signatures in ``group.matrix`` (at least one).
        name: The regime's name (``prefill[input_ids_1<=4]``).

    Returns:
        A `Group` with the same structure, the regime's calls, ranges, symbols and relations
        (module docstring).

    Raises:
        ReplayError: The group has no signature matrix, or `rows` is empty or out of range.

    Example:
        >>> from capture.analysis.symbols import Axis, find_symbols
        >>> sizes = np.array([[1, s, s] for s in (3, 4, 9, 10)])
        >>> found = find_symbols(sizes, [Axis("x", 0), Axis("x", 1), Axis("y", 1)])
        >>> dims = [DimInfo(0, "args[0]", "x", a, found.dynamic[i], found.minimum[i],
        ...                 found.maximum[i], found.distinct[i], 4, found.symbol[i], None)
        ...         for i, a in enumerate((0, 1, 1))]
        >>> from capture.pytree.recorded_structure import RecordedStructure
        >>> g = Group("m", "g0", "sid", 4, 4, RecordedStructure("sid", "m", ()), dims, [],
        ...           matrix=sizes, weights=np.ones(4, dtype=np.int64))
        >>> low = regime(g, [0, 1], "g0[x_1<=4]")
        >>> [(d.min, d.max, d.symbol) for d in low.dims]
        [(1, 1, None), (3, 4, 'x_1'), (3, 4, 'x_1')]
    """
    if group.matrix is None or group.weights is None:
        raise ReplayError(f"group {group.name} carries no signature matrix")
    picked = sorted({int(r) for r in rows})
    if not picked or picked[0] < 0 or picked[-1] >= len(group.weights):
        raise ReplayError(f"group {group.name}: no signature rows {list(rows)} to make a regime")
    matrix = np.asarray(group.matrix, dtype=np.int64)[picked]
    weights = np.asarray(group.weights, dtype=np.int64)[picked]
    calls = int(weights.sum())
    # Per column of the regime: its own range.
    lows = matrix.min(axis=0) if matrix.size else np.zeros(0, np.int64)
    highs = matrix.max(axis=0) if matrix.size else np.zeros(0, np.int64)
    distinct = [len(set(matrix[:, j].tolist())) for j in range(matrix.shape[1])]
    symbols = _regime_symbols(group, distinct, lows)
    dims = []
    for j, d in enumerate(group.dims):
        symbol = symbols.names.get(d.symbol) if d.symbol is not None else None
        dims.append(
            DimInfo(
                leaf=d.leaf,
                path=d.path,
                argument=d.argument,
                axis=d.axis,
                dynamic=symbol is not None,
                min=int(lows[j]),
                max=int(highs[j]),
                distinct=distinct[j],
                calls=calls,
                symbol=symbol,
                expr=symbols.exprs.get(symbol) if symbol is not None else None,
            )
        )
    return dataclasses.replace(
        group,
        name=name,
        calls=calls,
        signatures=len(picked),
        dims=dims,
        relations=symbols.relations,
        errors=0,
        matrix=matrix,
        weights=weights,
        structure=group.structure,
    )


@dataclasses.dataclass
class _Symbols:
    names: dict[str, str]
    """Group symbol -> its symbol in the regime (absent: static in the regime)."""
    exprs: dict[str, str]
    relations: list[Relation]


def _regime_symbols(group: Group, distinct: list[int], lows: Any) -> _Symbols:
    """Which of the group's symbols stay dynamic in the regime, and its relations."""
    varies: dict[str, bool] = {}
    value: dict[str, int] = {}
    for j, d in enumerate(group.dims):
        if d.symbol is None or not d.dynamic:
            continue
        # A dim the group forced dynamic (a batch dim that never varied) stays dynamic.
        forced = d.distinct == 1
        varies[d.symbol] = varies.get(d.symbol, False) or distinct[j] > 1 or forced
        value.setdefault(d.symbol, int(lows[j]))
    names = {s: s for s, v in varies.items() if v}
    exprs: dict[str, str] = {}
    relations: list[Relation] = []
    for rel in group.relations:
        if rel.symbol not in names:
            continue  # constant in the regime: static
        terms = tuple(t for t in rel.terms if t in names)
        offset = rel.offset + sum(value.get(t, 0) for t in rel.terms if t not in names)
        if not terms:
            del names[rel.symbol]  # every term static: so is the derived symbol
        elif len(terms) == 1 and offset == 0:
            names[rel.symbol] = terms[0]  # the same size as its one term: one symbol
        else:
            relations.append(Relation(rel.symbol, terms, offset))
            exprs[rel.symbol] = format_expr(terms, offset)
    return _Symbols(names, exprs, relations)
