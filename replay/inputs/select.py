"""Choose or synthesize the representative sizes of a call group (every dynamic dim >= 2).

torch.export specializes a dim whose example size is 0 or 1, so the example a group is exported
from must give every dynamic dim a size of at least 2, while the dims that share a symbol stay
equal and the recorded relations (``attention_mask_1 = past_key_values_2 + 1``) still hold.

The rule, in order:

1. **A recorded signature** whose dynamic dims are all >= 2, the one with the most calls (ties:
   the smallest size vector). It satisfies every relation of the real traffic, including
   the ones too weakly supported for the analysis to report.
2. **Otherwise, synthesized** from the group's most frequent signature: each free symbol below 2
   takes the smallest recorded size >= 2 of that symbol, or 2 when it never had one (a batch
   dim forced dynamic with ``set_batch_dimension_for`` but always 1); derived symbols are
   recomputed from their relation, and their roots raised when the result is still below 2.
   Static dims (always 1, or always 224) keep their recorded size.

The matrix-level core of this rule (`choose_row`, `synthesize`) lives in
`capture.analysis.representative`, which `InputObserver.infer_arguments` uses too. This module reads
the store (integer value ranges, per signature) but imports neither torch nor duckdb itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from capture.analysis.representative import MIN_DYNAMIC, Representative, choose_row, synthesize
from capture.errors import ReplayError
from capture.store import stats_merge

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.store.reader import StoreReader

__all__ = [
    "Representative",
    "Ranges",
    "representative",
    "signatures",
    "value_ranges",
    "probes",
    "nearest_ranges",
]

Ranges = tuple[list[int | None], list[int | None]]
"""Per tracked integer tensor (``structures.range_index``): (minimums, maximums)."""


def _matrix(group: Group) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    if group.matrix is None or group.weights is None:
        raise ReplayError(
            f"group {group.name} carries no signature matrix; build it with capture.analysis.groups"
        )
    return np.asarray(group.matrix, dtype=np.int64), np.asarray(group.weights, dtype=np.int64)


def signatures(group: Group) -> list[tuple[tuple[int, ...], int]]:
    """The group's distinct recorded size vectors with their call counts, most calls first."""
    matrix, weights = _matrix(group)
    rows = [(tuple(int(v) for v in matrix[i]), int(weights[i])) for i in range(len(weights))]
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def representative(group: Group) -> Representative:
    """The example sizes of a group: a recorded signature, or one synthesized (module docstring).

    Args:
        group: A call group from `capture.analysis.groups.analyze`.

    Returns:
        A `Representative`.

    Raises:
        ReplayError: The group has no signature matrix.

    Example:
        >>> rep = representative(group)  # doctest: +SKIP
        >>> rep.symbols, rep.synthesized  # doctest: +SKIP
        ({'batch': 2, 'past_key_values_2': 5, 'attention_mask_1': 6}, False)
    """
    matrix, weights = _matrix(group)
    if matrix.shape[1] != len(group.dims):
        raise ReplayError(f"group {group.name}: the signature matrix does not match its dims")
    symbol_of = [d.symbol for d in group.dims]
    row, found = choose_row(matrix, weights, [d.dynamic for d in group.dims])
    if found:
        sizes = [int(v) for v in matrix[row]]
        values = {s: sizes[j] for j, s in enumerate(symbol_of) if s is not None}
        return Representative(sizes, values, row, False)
    return synthesize(matrix, row, symbol_of, group.relations, group.name)


def value_ranges(store: StoreReader, group: Group) -> dict[tuple[int, ...], Ranges]:
    """Integer value ranges per recorded signature of a group, merged over store segments.

    Args:
        store: The open store the group was analysed from.
        group: The call group.

    Returns:
        Size vector -> (minimums, maximums), one entry per tracked integer tensor
        (``structures.range_index``); signatures recorded without ranges are absent.

    Example:
        >>> value_ranges(store, group)[(2, 1, 2, 2, 5, 16)]  # doctest: +SKIP
        ([3, 4, 0], [99, 5, 1])
    """
    # The signatures view merged the ranges over segments; signatures that differ only in
    # their outputs merge here, by the same rule (`capture.store.stats_merge`).
    ranges = stats_merge.select(("dims",), ("int_min", "int_max"))
    table = store.query(
        f"SELECT {ranges} FROM signatures WHERE model = $model "
        "AND in_structure IN (SELECT unnest($structures)) AND coalesce(state, '') = $state "
        "AND int_min IS NOT NULL GROUP BY dims",
        {"model": group.model_name, "structures": list(group.structure_ids), "state": group.state},
    )
    return {
        tuple(int(v) for v in row["dims"]): (list(row["int_min"]), list(row["int_max"]))
        for row in table.to_pylist()
    }


def probes(group: Group, limit: int) -> list[tuple[int, ...]]:
    """Unseen size vectors inside the recorded ranges of a group, to check a program between
    the recorded points.

    Each free symbol (a dynamic dim's shared symbol that no relation derives) takes values in
    its recorded range ``[min, max]``, never below 2 (the example's floor: torch.export
    specializes 0 and 1); derived symbols are recomputed from their relation and must stay in
    their own recorded range; the other dims keep the sizes of the recorded signature the
    example comes from (`representative`). In order, until `limit`:
    every free symbol at its recorded max together, then per symbol an unseen value in the
    middle of its widest gap between recorded values, then every symbol at its floor together,
    then per symbol the unseen size vector closest to the middle of its range, then per symbol
    its two ends. Recorded signatures and duplicates are skipped.

    Args:
        group: A call group from `capture.analysis.groups.analyze`.
        limit: The most probes returned (0: none).

    Returns:
        Size vectors in the order of ``group.dims``, none of them recorded.

    Example:
        >>> probes(group, 2)  # doctest: +SKIP
        [(4, 1, 4, 2, 22, 16, ...), (3, 1, 3, 2, 14, 16, ...)]
    """
    if limit <= 0:
        return []
    matrix, _ = _matrix(group)
    # The recorded signature the example comes from (a synthesized example may hold sizes
    # never recorded, such as batch 2 for a batch dim forced dynamic but always 1).
    base = [int(v) for v in matrix[representative(group).row]]
    columns: dict[str, list[int]] = {}
    for j, d in enumerate(group.dims):
        if d.dynamic and d.symbol is not None:
            columns.setdefault(d.symbol, []).append(j)
    relations = {r.symbol: r for r in group.relations if r.symbol in columns}
    bounds = {
        s: (int(matrix[:, cols[0]].min()), int(matrix[:, cols[0]].max()))
        for s, cols in columns.items()
    }
    free = [s for s in columns if s not in relations and bounds[s][1] >= MIN_DYNAMIC]
    floor = {s: max(bounds[s][0], MIN_DYNAMIC) for s in free}
    candidates: list[dict[str, int]] = [{s: bounds[s][1] for s in free}]
    for s in free:
        seen = sorted({int(v) for v in matrix[:, columns[s][0]] if v >= floor[s]})
        gaps = [(b - a, a, b) for a, b in zip(seen, seen[1:], strict=False) if b - a > 1]
        if gaps:
            _, a, b = max(gaps, key=lambda g: (g[0], -g[1]))
            candidates.append({s: (a + b) // 2})
    candidates.append(dict(floor))
    recorded = {tuple(int(v) for v in row) for row in matrix}
    for s in free:
        # The unseen vector closest to the middle of the range, the others at the example's.
        middle = (floor[s] + bounds[s][1]) // 2
        near = [middle + k * sign for k in range(32) for sign in (-1, 1)][1:]
        for v in (v for v in near if floor[s] <= v <= bounds[s][1]):
            sizes = _probe_sizes(base, columns, relations, bounds, {s: v})
            if sizes is not None and sizes not in recorded and {s: v} not in candidates:
                candidates.append({s: v})
                break
    for s in free:
        candidates.extend([{s: floor[s]}, {s: bounds[s][1]}])
    out: list[tuple[int, ...]] = []
    for change in candidates:
        sizes = _probe_sizes(base, columns, relations, bounds, change)
        if sizes is not None and sizes not in recorded and sizes not in out:
            out.append(sizes)
            if len(out) >= limit:
                break
    return out


def _probe_sizes(
    base: list[int],
    columns: dict[str, list[int]],
    relations: dict[str, Any],
    bounds: dict[str, tuple[int, int]],
    change: dict[str, int],
) -> tuple[int, ...] | None:
    """`base` with `change` applied and derived symbols recomputed; None when a derived symbol
    leaves its recorded range."""
    values = {s: base[cols[0]] for s, cols in columns.items()}
    values.update(change)
    for _ in range(len(relations)):  # a derived symbol may depend on another derived one
        for symbol, rel in relations.items():
            values[symbol] = sum(values.get(t, 0) for t in rel.terms) + rel.offset
    for symbol in relations:
        low, high = bounds[symbol]
        if not low <= values[symbol] <= high:
            return None
    sizes = list(base)
    for symbol, cols in columns.items():
        for j in cols:
            sizes[j] = values[symbol]
    return tuple(sizes)


def nearest_ranges(ranges: Mapping[tuple[int, ...], Ranges], sizes: Sequence[int]) -> Ranges | None:
    """The value ranges of `sizes`, or of the recorded signature closest to it (a probe).

    Closest: the smallest sum of absolute size differences; ties go to the smallest vector.
    """
    key = tuple(int(s) for s in sizes)
    if key in ranges or not ranges:
        return ranges.get(key)
    best = min(ranges, key=lambda k: (sum(abs(a - b) for a, b in zip(k, key, strict=False)), k))
    return ranges[best]
