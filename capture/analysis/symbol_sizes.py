"""A shared symbol across a model's call groups: what it measures, and every size it took.

A symbol is named per call group, where its dims vary (`capture.analysis.symbols`). The same
quantity is often static in another group: the demo's batch is 1 in every call of
``decode_no_attention_mask`` (24 of its 64 calls), so that group has no ``batch`` symbol. Those
calls still run at a batch size an engine must hold: `symbol_sizes` counts every group that has
one of the symbol's dims (its key path and axis), dynamic or not, so batch 1 is in the
distribution. `capture buckets` and `capture report` read it from here; the sizes come
from the groups' signature matrices (the ``stats`` rows), never the raw calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from capture.errors import NoSuchSymbol

if TYPE_CHECKING:
    from capture.analysis.groups import Group

__all__ = [
    "SymbolSizes",
    "symbol_kind",
    "symbol_sizes",
    "model_symbols",
    "percentile",
    "BATCH",
]

BATCH = "batch size"
"""What `symbol_kind` says of a batch symbol (the only kind CUDA-graph batch sizes apply to)."""


def symbol_kind(group: Group, symbol: str) -> str:
    """A reader's guess at what a shared symbol measures, from the dims it covers.

    Returns:
        ``batch size``, ``cache length``, ``sequence length``, ``image size`` or ``size``.

    Example:
        >>> symbol_kind(group, "batch")  # doctest: +SKIP
        'batch size'
    """
    if symbol == "batch" or symbol.startswith("batch_"):
        return BATCH
    dims = [d for d in group.dims if d.symbol == symbol]
    arguments = {(d.argument or d.path).lower() for d in dims}
    axes = {d.axis for d in dims}
    if any("past" in a or "cache" in a for a in arguments):
        return "cache length"
    if any("pixel" in a or "image" in a for a in arguments) and axes & {2, 3}:
        return "image size"
    if axes == {0}:
        return BATCH
    if axes & {1} and any(
        k in a for a in arguments for k in ("input_ids", "mask", "position", "embeds", "token")
    ):
        return "sequence length"
    return "size"


@dataclass(frozen=True)
class SymbolSizes:
    """Every recorded size of one symbol, over the groups that have one of its dims.

    Attributes:
        symbol: The symbol's name, as `capture dims` shows it.
        kind: What it measures (`symbol_kind`).
        groups: Per group having it (in the order given): its name, the sizes (ascending) and
            the calls at each size. A group where the dims are static has one size.
        named_in: The groups where the symbol varies (and so has its name).
    """

    symbol: str
    kind: str
    groups: list[tuple[str, list[int], list[int]]]
    named_in: list[str]

    @property
    def sizes(self) -> list[int]:
        """Distinct sizes over every group, ascending."""
        return sorted({s for _, sizes, _ in self.groups for s in sizes})

    @property
    def calls(self) -> list[int]:
        """Calls per size of `sizes`, summed over the groups."""
        counts: dict[int, int] = {}
        for _, sizes, calls in self.groups:
            for size, n in zip(sizes, calls, strict=True):
                counts[size] = counts.get(size, 0) + n
        return [counts[s] for s in sorted(counts)]


def _column(group: Group, symbol: str, anchors: set[tuple[str, int]]) -> int | None:
    """The group's column of `symbol`: by name, else at one of its dims' path and axis."""
    named = next((j for j, d in enumerate(group.dims) if d.symbol == symbol), None)
    if named is not None:
        return named
    return next((j for j, d in enumerate(group.dims) if (d.path, d.axis) in anchors), None)


def symbol_sizes(groups: Sequence[Group], symbol: str) -> SymbolSizes:
    """The recorded distribution of `symbol` over every group that has one of its dims.

    Args:
        groups: The call groups of one model (`capture.analysis.groups.analyze`).
        symbol: A shared symbol, as `capture dims` names it.

    Returns:
        A `SymbolSizes`.

    Raises:
        NoSuchSymbol: No group names the symbol; the message lists the symbols there are.

    Example:
        >>> symbol_sizes(analyze(store, "tiny-llama"), "batch").sizes  # doctest: +SKIP
        [1, 2, 3, 4]
    """
    anchors = {(d.path, d.axis) for g in groups for d in g.dims if d.symbol == symbol}
    named = [g for g in groups if any(d.symbol == symbol for d in g.dims)]
    if not named:
        known = model_symbols(groups)
        raise NoSuchSymbol(
            f"no call group has a symbol {symbol!r}; pass --symbol with one of "
            f"{', '.join(known) or 'none (no dim varies)'} (see `capture dims`)"
        )
    found = []
    for g in groups:
        column = _column(g, symbol, anchors)
        if column is None or g.matrix is None or g.weights is None:
            continue
        counts: dict[int, int] = {}
        for size, n in zip(g.matrix[:, column].tolist(), g.weights.tolist(), strict=True):
            counts[int(size)] = counts.get(int(size), 0) + int(n)
        sizes = sorted(counts)
        found.append((g.name, sizes, [counts[s] for s in sizes]))
    return SymbolSizes(symbol, symbol_kind(named[0], symbol), found, [g.name for g in named])


def model_symbols(groups: Sequence[Group]) -> list[str]:
    """The free symbols (not derived from others) of a model's groups, sorted.

    Example:
        >>> model_symbols(analyze(store, "tiny-llama"))  # doctest: +SKIP
        ['batch', 'input_ids_1', 'past_key_values_2']
    """
    return sorted({d.symbol for g in groups for d in g.dims if d.symbol and d.expr is None})


def percentile(sizes: Sequence[int], calls: Sequence[int], q: float) -> int:
    """The size at or below which `q` percent of the calls ran (the nearest-rank method).

    Args:
        sizes: Distinct sizes, ascending.
        calls: Calls per size.
        q: 0 to 100.

    Returns:
        A recorded size.

    Example:
        >>> [percentile([1, 2, 4], [24, 20, 20], q) for q in (50, 90, 99)]
        [2, 4, 4]
    """
    total = sum(calls)
    rank = max(1, -(-q * total // 100))  # ceil(q% of the calls), at least the first
    seen = 0
    for size, n in zip(sizes, calls, strict=True):
        seen += n
        if seen >= rank:
            return int(size)
    return int(sizes[-1])
