"""What `capture report` shows, computed from the store: timelines, distributions, coverage.

Everything here reads the ``stats`` rows (in a writer's rollup one per distinct signature and
minute, with a call count and the first and last call time) and the call groups of
`capture.analysis.groups`, never the raw ``calls``, so a store of millions of calls costs the same
as its thousands of stats rows. No plotting and no torch here (`capture.engines.report_html` draws).

**Calls over time.** A stats row says that `calls` calls of one signature happened between
`first_ts` and `last_ts` (in a rollup, within one minute, `capture.schema.ROLLUP_BUCKET_S`; a
segment of up to ``flush_seconds`` in stores written before rollups). The first and the last of
them are placed at those exact times and the others evenly in between, as whole calls: a
signature seen once or twice a minute is exact, and a bin never holds a fraction of a call
("0.2 calls" bars). The report says so under the plot. `capture compact` merges the
rows of one signature into one, spanning all of them: the calls over time of a compacted store
are coarser. (Every exact time is in the ``calls`` view; reading it costs a pass over every
calls file, which the report avoids.)

**What capture export does with a group** (`ExportPlan`) comes from `replay`, which `capture`
may not import: the CLI hands `build_report` a function making one per group.

**Served by an artifact.** `served_calls` aggregates, per recorded call group, the rows of
`replay.check.drift.check_rows` (one per distinct recorded signature: its input structure, calls,
and whether a program of the artifact serves it, with the runner's own guards), so the report and
`capture check` give one answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from capture.analysis.symbol_sizes import SymbolSizes, model_symbols, percentile, symbol_sizes
from capture.engines.buckets import optimal_buckets

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.store.reader import StoreReader

__all__ = [
    "Timeline",
    "ServedGroup",
    "ExportPlan",
    "SymbolView",
    "BUCKET_BUDGET",
    "timeline",
    "served_calls",
    "symbol_views",
    "input_shapes",
]

BUCKET_BUDGET = 4
"""Buckets drawn on each symbol's distribution (`capture buckets --budget 4`), fewer when the
symbol took fewer sizes."""

_STATS_SQL = """
SELECT coalesce(state, '') AS state, in_structure, calls, epoch_us(first_ts) AS t0,
       epoch_us(last_ts) AS t1
FROM stats WHERE model = $model
"""


@dataclass
class Timeline:
    """Calls per time bin, per call group of one model.

    Attributes:
        start_us: Start of the first bin (epoch microseconds, UTC).
        bin_us: Width of one bin in microseconds.
        groups: Group names, in the order of the rows of `calls`.
        calls: ``(groups, bins)`` whole calls per bin.
    """

    start_us: int
    bin_us: int
    groups: list[str]
    calls: np.ndarray[Any, np.dtype[np.int64]]


def timeline(
    store: StoreReader, model_name: str, groups: Sequence[Group], bins: int = 60
) -> Timeline:
    """Calls over time per group of `model_name`, from the stats rows (module docstring).

    Args:
        store: An open store.
        model_name: The model.
        groups: Its call groups (`capture.analysis.groups.analyze`), to name the structures.
        bins: Number of time bins.

    Returns:
        A `Timeline`; structures that no group describes are left out.

    Example:
        >>> tl = timeline(store, "M", analyze(store, "M"))  # doctest: +SKIP
        >>> tl.calls.sum(axis=1)  # doctest: +SKIP
    """
    table = store.query(_STATS_SQL, {"model": model_name})
    names = [g.name for g in groups]
    # A group is one structure under one state (`capture.state`).
    row_of = {(g.state, s): i for i, g in enumerate(groups) for s in g.structure_ids}
    states = table.column("state").to_pylist()
    structures = list(zip(states, table.column("in_structure").to_pylist(), strict=True))
    keep = np.array([s in row_of for s in structures], dtype=bool)
    rows = np.array([row_of.get(s, -1) for s in structures], dtype=np.int64)[keep]
    calls = table.column("calls").to_numpy().astype(np.int64)[keep]
    t0 = table.column("t0").to_numpy().astype(np.int64)[keep]
    t1 = np.maximum(table.column("t1").to_numpy().astype(np.int64)[keep], t0)
    matrix = np.zeros((len(groups), bins), dtype=np.int64)
    if t0.size == 0:
        return Timeline(0, 1, names, matrix)
    start, stop = int(t0.min()), int(t1.max())
    width = max(1, -(-(stop - start + 1) // bins))
    edges = start + width * np.arange(bins + 1, dtype=np.int64)  # the last one is past `stop`
    below = _calls_before(edges, t0, t1, calls)
    np.add.at(matrix, rows, np.diff(below, axis=1))
    return Timeline(start, width, names, matrix)


def _calls_before(
    edges: np.ndarray[Any, Any], t0: np.ndarray[Any, Any], t1: np.ndarray[Any, Any], n: Any
) -> np.ndarray[Any, Any]:
    """``(rows, edges)``: how many of each row's calls come before each edge.

    A row's ``n`` calls are at ``t0 + k (t1 - t0) / (n - 1)`` for ``k = 0 .. n-1`` (all at
    ``t0`` when ``n`` is 1 or ``t1 == t0``): the count before ``e`` is ``ceil((e - t0) (n - 1)
    / (t1 - t0))``, clipped to ``[0, n]``.
    """
    span = (t1 - t0).astype(np.float64)
    offset = (edges[None, :] - t0[:, None]).astype(np.float64)
    spread = (span > 0) & (n > 1)
    steps = np.where(spread, (n - 1) / np.where(span > 0, span, 1.0), 0.0)
    # A tiny slack keeps a call that sits exactly on an edge in the bin that starts there.
    counted = np.ceil(offset * steps[:, None] - 1e-9)
    counted = np.where(spread[:, None], counted, np.where(offset > 0, n[:, None], 0))
    return np.clip(counted, 0, n[:, None]).astype(np.int64)


@dataclass(frozen=True)
class ExportPlan:
    """What `capture export` does with one call group (made by `replay.inputs.source.export_plan`).

    Attributes:
        source: The group's ``dynamic_shapes`` as Python to paste (bounded named hints).
        ranges: Symbol -> the range the export takes for it (``max`` None: unbounded).
        probes: Free symbol -> its values in the probes: unseen size vectors inside the recorded
            ranges that the export is checked on besides every recorded signature.
    """

    source: str
    ranges: dict[str, tuple[int, int | None]]
    probes: dict[str, list[int]]


class ServedRow(Protocol):
    """One recorded signature and whether an artifact serves it (what
    ``replay.check.drift.DriftRow`` holds; the report reads it without importing replay)."""

    @property
    def model_name(self) -> str: ...
    @property
    def structure(self) -> str: ...
    @property
    def group(self) -> str | None: ...
    @property
    def calls(self) -> int: ...
    @property
    def served(self) -> bool: ...
    @property
    def state(self) -> str: ...


@dataclass(frozen=True)
class ServedGroup:
    """How much of one recorded call group an artifact serves."""

    group: str
    calls: int
    served_calls: int
    signatures: int
    served_signatures: int
    programs: list[str]


def served_calls(groups: Sequence[Group], rows: Sequence[ServedRow]) -> list[ServedGroup]:
    """How much of each recorded call group an artifact serves (module docstring).

    Args:
        groups: The recorded call groups of one model.
        rows: `replay.check.drift.check_rows` for the artifact (every model of the store).

    Returns:
        One `ServedGroup` per recorded group, in the order of `groups`.

    Example:
        >>> served_calls(groups, rows)[0].served_calls  # doctest: +SKIP
        7
    """
    from capture.state import state_label

    out = []
    for g in groups:
        label = state_label(g.state or None)
        mine = [
            r
            for r in rows
            if r.model_name == g.model_name and r.structure in g.structure_ids and r.state == label
        ]
        served = [r for r in mine if r.served]
        out.append(
            ServedGroup(
                group=g.name,
                calls=sum(r.calls for r in mine),
                served_calls=sum(r.calls for r in served),
                signatures=len(mine),
                served_signatures=len(served),
                programs=sorted({str(r.group) for r in served}),
            )
        )
    return out


@dataclass(frozen=True)
class SymbolView:
    """One symbol as the report draws it: its sizes and what decides an export of it.

    Attributes:
        symbol: The symbol.
        sizes: Its sizes over every group having one of its dims (batch 1 included).
        colors: Group -> colour (the page's colours).
        percentiles: 50, 90, 99 -> the size at or below which that share of the calls ran.
        exported: Group where the symbol varies -> the range its export takes (known when the
            report was given a plan, `ExportPlan.ranges`).
        probes: The symbol's values in the probes of those groups.
        buckets: The `BUCKET_BUDGET` sizes that pad the recorded calls least.
    """

    symbol: str
    sizes: SymbolSizes
    colors: Mapping[str, str]
    percentiles: dict[int, int]
    exported: dict[str, tuple[int, int | None]]
    probes: list[int]
    buckets: list[int]


def symbol_views(
    groups: Sequence[Group], plans: Mapping[str, ExportPlan], colors: Mapping[str, str]
) -> list[SymbolView]:
    """One `SymbolView` per free symbol of a model's groups (`model_symbols`).

    Args:
        groups: The model's call groups.
        plans: Group name -> its `ExportPlan`; groups left out have no exported range or probes.
        colors: Group name -> colour.

    Returns:
        The views, by symbol name.

    Example:
        >>> [v.symbol for v in symbol_views(groups, {}, {})]  # doctest: +SKIP
        ['batch', 'input_ids_1', 'past_key_values_2']
    """
    views = []
    for symbol in model_symbols(groups):
        dist = symbol_sizes(groups, symbol)
        mine = [plans[g] for g in dist.named_in if g in plans]
        views.append(
            SymbolView(
                symbol=symbol,
                sizes=dist,
                colors=colors,
                percentiles={q: percentile(dist.sizes, dist.calls, q) for q in (50, 90, 99)},
                exported={
                    g: plans[g].ranges[symbol]
                    for g in dist.named_in
                    if g in plans and symbol in plans[g].ranges
                },
                probes=sorted({v for plan in mine for v in plan.probes.get(symbol, ())}),
                buckets=optimal_buckets(
                    dist.sizes, dist.calls, min(BUCKET_BUDGET, len(dist.sizes))
                ),
            )
        )
    return views


def input_shapes(group: Group) -> list[str]:
    """The shape of every tensor input of a group, with its symbols: what the group is.

    A dynamic axis shows its symbol, a static one its size; the leaves of one argument that
    share a shape (a cache's layers) are shown once, with their count.

    Returns:
        E.g. ``['input_ids [batch, 1]', 'past_key_values 4 × [batch, 2, past_key_values_2,
        16]']``.

    Example:
        >>> input_shapes(group)[0]  # doctest: +SKIP
        'input_ids [batch, 1]'
    """
    leaves: dict[int, list[Any]] = {}
    for d in group.dims:
        leaves.setdefault(d.leaf, []).append(d)
    by_argument: dict[str, list[tuple[str, str]]] = {}
    for dims in leaves.values():
        axes = sorted(dims, key=lambda d: d.axis)
        shape = ", ".join(d.symbol if d.dynamic and d.symbol else str(d.min) for d in axes)
        argument = axes[0].argument or axes[0].path
        by_argument.setdefault(argument, []).append((axes[0].path, f"[{shape}]"))
    out = []
    for argument, shapes in by_argument.items():
        distinct = {shape for _, shape in shapes}
        if len(distinct) == 1:
            count = f"{len(shapes)} × " if len(shapes) > 1 else ""
            out.append(f"{argument} {count}{shapes[0][1]}")
        else:
            out.extend(f"{path} {shape}" for path, shape in shapes)
    return out
