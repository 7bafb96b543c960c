"""Dynamic dims, shared symbols and linear relations over a matrix of distinct signatures.

This is the numeric core of `capture.analysis.groups`: given the distinct size vectors of one call
group (one row per distinct signature, one column per tensor leaf x axis), it decides

- which columns are **dynamic**: they take more than one value, or are forced (a batch dim);
- which dynamic columns are **equal in every signature**: they share one symbol;
- which symbols are **derived** from others by a relation that holds in every signature:
  ``a = b + k`` (``k`` a non-zero constant) or ``c = a + b (+ k)``.

It works on distinct signatures only (a few thousand rows), never on the calls, and imports numpy
but neither duckdb nor torch.

**The anti-spurious rule.** Any two columns that move together satisfy *some* linear relation
when there are few enough points: with 2 signatures every pair of varying dims fits
``a = alpha * b + k``, and in a seed with calls (2, 6), (3, 7), (4, 8) the unrelated batch and
sequence lengths satisfy ``seq = batch + 4``. A relation is reported only when the signatures
would have refuted it, had it been false, at least `min_support` times (default 3):

- the *points* of a relation are the distinct value tuples of its right-hand side (the values of
  ``b`` for ``a = b + k``; the ``(a, b)`` pairs for ``c = a + b``);
- each fitted constant (``k``) uses one point; ``support = points - fitted constants``;
- ``c = a + b`` also needs its ``(a, b)`` points not to lie on one line: on a line, ``c = a + b``
  cannot be told apart from ``c = 2a + k`` or ``c = b + k``.

So ``a = b + k`` needs ``b`` to take at least 4 distinct values, ``c = a + b`` at least 3
non-collinear ``(a, b)`` pairs (4 with a constant). Equality (one shared symbol) has no fitted
constant and is kept whenever two dynamic dims are equal in every signature: a missed equality
makes `torch.export` reject named dims (it finds the equality itself), while a spurious one only
narrows the exported program to what was recorded.

Only dims that vary are considered in relations (a forced but constant batch dim is not).

**Absent entries.** The seed API (`capture.seeds.alignment`) aligns calls that do not all pass the
same optional tensors into one matrix; a leaf a call did not pass is `ABSENT` (any negative entry)
in that row. Absent entries count for no statistic (a column is dynamic when its *present* values
differ), two columns share a symbol only when they are absent in the same rows, and a column with an
absent entry enters no relation. Store groups have one structure each, so no absent entries.
Relations are expressed over *free* symbols only: a derived symbol never appears in the terms of
another relation.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = [
    "ABSENT",
    "Axis",
    "Relation",
    "Symbols",
    "MIN_SUPPORT",
    "find_symbols",
    "format_expr",
    "unique_names",
]

ABSENT = -1
"""A matrix entry for a leaf a signature does not have (any negative entry reads as this)."""

MIN_SUPPORT = 3
"""Default number of refuting chances a relation must survive (see the module docstring)."""

IntMatrix = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Axis:
    """What a column of the signature matrix is: one axis of one tensor leaf."""

    argument: str | None
    axis: int
    path: str = ""


@dataclass(frozen=True)
class Relation:
    """``symbol == sum(terms) + offset``, true in every call of the group.

    Example:
        >>> str(Relation("attention_mask_1", ("past_key_values_2",), 1))
        'attention_mask_1 = past_key_values_2 + 1'
    """

    symbol: str
    terms: tuple[str, ...]
    offset: int

    @property
    def expr(self) -> str:
        """The right-hand side as text, e.g. ``'past + seq'`` or ``'seq + 1'``."""
        return format_expr(self.terms, self.offset)

    def __str__(self) -> str:
        return f"{self.symbol} = {self.expr}"


def format_expr(terms: Sequence[str], offset: int) -> str:
    """``'a + b + 1'``, ``'a - 2'``: the text of ``sum(terms) + offset``.

    Example:
        >>> format_expr(("past", "seq"), 0), format_expr(("seq",), -1)
        ('past + seq', 'seq - 1')
    """
    text = " + ".join(terms)
    if offset:
        sign = "+" if offset > 0 else "-"
        text = f"{text} {sign} {abs(offset)}" if text else str(offset)
    return text or "0"


@dataclass
class Symbols:
    """What `find_symbols` found, one entry per column for the first four fields."""

    dynamic: list[bool]
    minimum: list[int]
    maximum: list[int]
    distinct: list[int]
    symbol: list[str | None]
    expr: list[str | None]
    relations: list[Relation] = field(default_factory=list)


def _identifier(text: str) -> str:
    # ASCII only: the symbols end up in generated Python source and torch.export.Dim names.
    name = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_")
    if not name or name[0].isdigit():
        name = f"d_{name}"
    if keyword.iskeyword(name):
        name = f"{name}_"
    return name


def _class_names(
    members: list[list[int]], axes: Sequence[Axis], forced: npt.NDArray[np.bool_]
) -> list[str]:
    """Readable, unique identifiers: 'batch' for axis 0 shared across arguments (or forced as
    a batch dim), else ``<argument>_<axis>`` of the class's first dim."""
    bases: list[str] = []
    for cols in members:
        first = axes[cols[0]]
        arguments = {axes[c].argument or axes[c].path for c in cols}
        is_batch = all(axes[c].axis == 0 for c in cols) and (
            len(arguments) > 1 or all(forced[c] for c in cols)
        )
        if is_batch and "batch" not in bases:  # an identifier never is: it ends in its axis
            bases.append("batch")
        else:
            bases.append(_identifier(f"{first.argument or first.path or 'dim'}_{first.axis}"))
    return unique_names(bases)


def unique_names(names: Iterable[str]) -> list[str]:
    """`names`, a later duplicate suffixed ``_2``, ``_3``, ...

    Example:
        >>> unique_names(["batch", "seq", "batch", "batch"])
        ['batch', 'seq', 'batch_2', 'batch_3']
    """
    used: set[str] = set()
    out = []
    for name in names:
        unique, n = name, 2
        while unique in used:
            unique, n = f"{name}_{n}", n + 1
        used.add(unique)
        out.append(unique)
    return out


def _distinct_rows(values: IntMatrix) -> IntMatrix:
    out: IntMatrix = np.unique(values, axis=0)
    return out


def _collinear(points: IntMatrix) -> bool:
    """True when every 2-D point lies on one line (integer arithmetic, exact)."""
    deltas = points[1:] - points[0]
    nonzero = np.flatnonzero(np.any(deltas != 0, axis=1))
    if nonzero.size == 0:
        return True
    dx, dy = deltas[nonzero[0]]
    cross = deltas[:, 0] * dy - deltas[:, 1] * dx
    return bool(np.all(cross == 0))


def find_symbols(
    matrix: npt.ArrayLike,
    axes: Sequence[Axis],
    forced: Sequence[bool] | None = None,
    min_support: int = MIN_SUPPORT,
) -> Symbols:
    """Dynamic dims, shared symbols and relations of one call group.

    Args:
        matrix: Distinct signatures, shape ``(signatures, columns)``, integer sizes (negative:
            `ABSENT`, see the module docstring).
        axes: What each column is (argument, axis, path), used to name the symbols.
        forced: Per column, dynamic even when constant (``set_batch_dimension_for``).
        min_support: Refuting chances a relation must survive (module docstring).

    Returns:
        A `Symbols` with per-column dynamic/min/max/distinct/symbol/expr and the relations.

    Raises:
        ValueError: `matrix` is not 2-D with one column per entry of `axes`.

    Example:
        >>> past = [4, 5, 6, 7, 8]
        >>> rows = [[1, p, p + 1] for p in past]
        >>> axes = [Axis("input_ids", 1), Axis("past_key_values", 2), Axis("attention_mask", 1)]
        >>> found = find_symbols(rows, axes)
        >>> found.symbol, found.expr
        ([None, 'past_key_values_2', 'attention_mask_1'], [None, None, 'past_key_values_2 + 1'])
    """
    m: IntMatrix = np.asarray(matrix, dtype=np.int64)
    if m.ndim != 2 or m.shape[1] != len(axes):
        raise ValueError(f"matrix of shape {m.shape} does not match {len(axes)} axes")
    n_rows, n_cols = m.shape
    if n_rows == 0:
        raise ValueError("find_symbols needs at least one signature")
    force = np.zeros(n_cols, dtype=bool) if forced is None else np.asarray(forced, dtype=bool)
    m = np.where(m < 0, ABSENT, m)
    distinct, minimum, maximum = _column_ranges(m)
    dynamic = (distinct > 1) | force
    columns = np.ascontiguousarray(m.T)
    members, class_of = _equality_classes(columns, dynamic)
    names = _class_names(members, axes, force)
    values = columns[[cols[0] for cols in members]] if members else np.empty((0, n_rows), np.int64)
    class_distinct = [int(distinct[cols[0]]) for cols in members]

    derived = _relations(values, class_distinct, min_support)

    exprs: list[str | None] = [None] * len(members)
    relations: list[Relation] = []
    for k in range(len(members)):
        if k in derived:
            terms, offset = derived[k]
            rel = Relation(names[k], tuple(names[t] for t in terms), offset)
            exprs[k] = rel.expr
            relations.append(rel)
    return Symbols(
        dynamic=[bool(d) for d in dynamic],
        minimum=[int(v) for v in minimum],
        maximum=[int(v) for v in maximum],
        distinct=[int(v) for v in distinct],
        symbol=[names[class_of[c]] if class_of[c] >= 0 else None for c in range(n_cols)],
        expr=[exprs[class_of[c]] if class_of[c] >= 0 else None for c in range(n_cols)],
        relations=relations,
    )


def _column_ranges(m: IntMatrix) -> tuple[IntMatrix, IntMatrix, IntMatrix]:
    """Per column: how many distinct sizes, the smallest and the largest, `ABSENT` entries
    left out (a column absent from every signature: 0 distinct, 0 and 0)."""
    n_rows, n_cols = m.shape
    ordered = np.sort(m, axis=0)
    distinct = 1 + np.count_nonzero(np.diff(ordered, axis=0), axis=0)
    minimum, maximum = ordered[0], ordered[-1]
    n_absent = np.count_nonzero(m == ABSENT, axis=0)
    if n_absent.any():  # absent entries sort first: skip them, and their value
        distinct = distinct - (n_absent > 0)
        minimum = ordered[np.minimum(n_absent, n_rows - 1), np.arange(n_cols)]
        minimum = np.where(n_absent == n_rows, 0, minimum)
        maximum = np.where(n_absent == n_rows, 0, maximum)
    return distinct, minimum, maximum


def _equality_classes(
    columns: IntMatrix, dynamic: npt.NDArray[np.bool_]
) -> tuple[list[list[int]], IntMatrix]:
    """Dynamic columns with identical values in every signature, grouped: each class's
    columns, and each column's class (-1: static)."""
    by_values: dict[bytes, int] = {}
    members: list[list[int]] = []
    class_of = np.full(len(columns), -1)
    for c in np.flatnonzero(dynamic):
        k = by_values.setdefault(columns[c].tobytes(), len(members))
        if k == len(members):
            members.append([])
        members[k].append(int(c))
        class_of[c] = k
    return members, class_of


def _relations(
    values: IntMatrix, distinct: list[int], min_support: int
) -> dict[int, tuple[tuple[int, ...], int]]:
    """Derived classes -> (free terms, offset), for classes whose values vary.

    `values` holds one row per class (its values over the signatures).
    """
    n_classes = values.shape[0]
    candidates = [k for k in range(n_classes) if distinct[k] > 1 and values[k].min() >= 0]
    if len(candidates) < 2:
        return {}
    centered = values - values[:, :1]

    # a = b + k: classes whose difference is constant share a centered column.
    offset_groups: dict[bytes, list[int]] = {}
    for k in candidates:
        offset_groups.setdefault(centered[k].tobytes(), []).append(k)
    base_of: dict[int, tuple[int, int]] = {}
    free: list[int] = []
    for group in offset_groups.values():
        # One fitted constant: support = distinct values - 1 (all members share the count).
        if len(group) > 1 and distinct[group[0]] - 1 >= min_support:
            base = min(group, key=lambda k: (int(values[k, 0]), k))
            free.append(base)
            for k in group:
                if k != base:
                    base_of[k] = (base, int(values[k, 0] - values[base, 0]))
        else:
            free.extend(group)
    free.sort()

    # c = a + b (+ k) among the free classes: centered(c) == centered(a) + centered(b).
    by_centered: dict[bytes, list[int]] = {}
    for k in free:
        by_centered.setdefault(centered[k].tobytes(), []).append(k)
    found: list[tuple[int, int, int, int]] = []
    for i, a in enumerate(free):
        for b in free[i + 1 :]:
            total = centered[a] + centered[b]
            for c in by_centered.get(total.tobytes(), ()):
                if c in (a, b):
                    continue
                offset = int(values[c, 0] - values[a, 0] - values[b, 0])
                points = _distinct_rows(np.stack([values[a], values[b]], axis=1))
                support = len(points) - (1 if offset else 0)
                if support >= min_support and not _collinear(points):
                    found.append((c, a, b, offset))
    # Smallest sums first: the terms of an accepted relation are then never derived later.
    found.sort(key=lambda t: (int(values[t[0]].sum()), t))
    sums: dict[int, tuple[tuple[int, ...], int]] = {}
    for c, a, b, offset in found:
        if c in sums or a in sums or b in sums:
            continue
        sums[c] = ((a, b), offset)

    out: dict[int, tuple[tuple[int, ...], int]] = dict(sums)
    for k, (base, offset) in base_of.items():
        if base in sums:
            terms, base_offset = sums[base]
            out[k] = (terms, base_offset + offset)
        else:
            out[k] = ((base,), offset)
    return out
