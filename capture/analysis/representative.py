"""Which signature of a size matrix a program is exported from: choose one, or synthesize one.

The matrix-level core of representative selection, shared by the store (`replay.inputs.select`, one
call group's distinct signatures with their call counts) and the seed API (`InputObserver`, its
stored calls). It imports numpy only.

The rule, in order (`choose_row`, then `synthesize`):

1. **A recorded row** that is `eligible` and whose dynamic columns are all >= `min_dynamic`, the
   one with the most calls; ties go to the smallest size vector (``ties="smallest"``) or to the
   earliest row (``ties="first"``).
2. **Otherwise** the most called row of all (same ties), and, when the caller wants it, an example
   synthesized from it: each free symbol below `min_dynamic` takes the smallest recorded size >=
   `min_dynamic` of that symbol, or `min_dynamic` when it never had one; derived symbols are
   recomputed from their relation and their roots raised when the result is still too small.

The store uses the defaults: torch.export specializes a dim whose example size is 0 or 1, so
every dynamic dim must be >= 2 (`MIN_DYNAMIC`), and an unrecorded example is synthesized. The seed
API (`InputObserver.infer_arguments`) keeps what the seeds printed: ``min_dynamic=None`` (any
stored call will do), one weight per stored call, ``ties="first"``, eligible = the calls passing
the same arguments as the reference call, and no synthesis (the first stored call otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from capture.errors import ReplayError

__all__ = ["MIN_DYNAMIC", "Representative", "choose_row", "synthesize"]

MIN_DYNAMIC = 2
"""The smallest example size torch.export keeps dynamic."""


class _Relation(Protocol):
    """``symbol == sum(terms) + offset`` (`capture.analysis.symbols.Relation`)."""

    @property
    def symbol(self) -> str: ...
    @property
    def terms(self) -> tuple[str, ...]: ...
    @property
    def offset(self) -> int: ...


@dataclass(frozen=True)
class Representative:
    """The sizes a group is exported from.

    Attributes:
        sizes: The full size vector of the group's structure (every tensor leaf's shape,
            concatenated in leaf order, as ``calls.dims``).
        symbols: The size given to each symbol.
        row: Index of the recorded signature used (rows of the matrix), or of the one a
            synthesized example starts from.
        synthesized: True when no recorded signature had every dynamic dim >= 2.
        raised: Human-readable ``symbol: recorded -> example`` changes of a synthesized example.
    """

    sizes: list[int]
    symbols: dict[str, int]
    row: int
    synthesized: bool
    raised: list[str] = field(default_factory=list)


def choose_row(
    matrix: npt.ArrayLike,
    weights: npt.ArrayLike,
    dynamic: Sequence[bool],
    eligible: Sequence[bool] | None = None,
    min_dynamic: int | None = MIN_DYNAMIC,
    ties: Literal["smallest", "first"] = "smallest",
) -> tuple[int, bool]:
    """The representative row of a size matrix (rule 1 of the module docstring, else rule 2's row).

    Args:
        matrix: Sizes, shape ``(rows, columns)``.
        weights: Calls per row.
        dynamic: Per column, whether it is dynamic (`capture.analysis.symbols.find_symbols`).
        eligible: Per row, whether it may be chosen by rule 1 (default: every row).
        min_dynamic: The smallest size a dynamic column may have in a chosen row (None: any).
        ties: Among rows with the most calls, the smallest size vector or the earliest row.

    Returns:
        ``(row, found)``: `found` is False when no eligible row had every dynamic column >=
        `min_dynamic`, and `row` is then the most called row of all.

    Example:
        >>> choose_row([[1, 3], [2, 3], [4, 3]], [5, 1, 1], [True, False])
        (1, True)
    """
    m = np.asarray(matrix, dtype=np.int64)
    w = np.asarray(weights, dtype=np.int64)
    dyn = np.asarray(dynamic, dtype=bool)
    ok = np.ones(len(w), dtype=bool)
    if dyn.any() and min_dynamic is not None:
        ok &= np.all(m[:, dyn] >= min_dynamic, axis=1)
    if eligible is not None:
        ok &= np.asarray(eligible, dtype=bool)
    if ok.any():
        return _most_called(m, w, np.flatnonzero(ok), ties), True
    return _most_called(m, w, np.arange(len(w)), ties), False


def _most_called(
    matrix: npt.NDArray[np.int64], weights: npt.NDArray[np.int64], rows: Any, ties: str
) -> int:
    """The row with the most calls; ties go to the smallest size vector or the earliest row."""
    if ties == "first":
        return int(min(rows, key=lambda r: (-int(weights[r]), int(r))))
    return int(min(rows, key=lambda r: (-int(weights[r]), tuple(int(v) for v in matrix[r]))))


def synthesize(
    matrix: npt.ArrayLike,
    row: int,
    symbols: Sequence[str | None],
    relations: Sequence[_Relation],
    name: str = "",
    min_dynamic: int = MIN_DYNAMIC,
) -> Representative:
    """An example from `row` whose every symbol is >= `min_dynamic` (rule 2, module docstring).

    Args:
        matrix: Sizes, shape ``(rows, columns)``.
        row: The row the example starts from (static columns keep its sizes).
        symbols: Per column, its shared symbol (None: static).
        relations: The derived symbols, ``symbol = sum(terms) + offset``.
        name: The group's name, for the error message.
        min_dynamic: The smallest size a symbol may have.

    Returns:
        A `Representative` with ``synthesized=True``.

    Raises:
        ReplayError: A derived symbol is a constant below `min_dynamic`.

    Example:
        >>> synthesize([[1, 7], [1, 8]], 0, ["batch", None], []).sizes
        [2, 7]
    """
    m = np.asarray(matrix, dtype=np.int64)
    base = [int(v) for v in m[row]]
    columns: dict[str, list[int]] = {}
    for j, symbol in enumerate(symbols):
        if symbol is not None:
            columns.setdefault(symbol, []).append(j)
    derived = {r.symbol: r for r in relations}
    values = {s: base[cols[0]] for s, cols in columns.items()}
    raised = []
    for symbol, cols in columns.items():
        if symbol in derived or values[symbol] >= min_dynamic:
            continue
        seen = m[:, cols[0]]
        bigger = seen[seen >= min_dynamic]
        new = int(bigger.min()) if bigger.size else min_dynamic
        raised.append(f"{symbol}: {values[symbol]} -> {new}")
        values[symbol] = new
    for _ in range(64):
        low = None
        for symbol, rel in derived.items():
            values[symbol] = sum(values.get(t, min_dynamic) for t in rel.terms) + rel.offset
            if values[symbol] < min_dynamic and low is None:
                low = (symbol, rel.terms[0] if rel.terms else None)
        if low is None:
            break
        symbol, term = low
        if term is None:
            raise ReplayError(f"group {name}: {symbol} is a constant below {min_dynamic}")
        raised.append(f"{term}: {values[term]} -> {values[term] + 1} (for {symbol})")
        values[term] += 1
    sizes = list(base)
    for symbol, cols in columns.items():
        for j in cols:
            sizes[j] = values[symbol]
    return Representative(sizes, values, row, True, raised)
