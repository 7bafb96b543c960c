"""What `capture report` shows, computed from the store: timelines, distributions, coverage.

Everything here reads the ``stats`` rows (in a writer's rollup one per distinct signature and
minute, with a call count and the first and last call time) and the call groups of
`capture.analysis.groups`, never the raw ``calls``, so a store of millions of calls costs the same
as its thousands of stats rows. No plotting and no torch here (`capture.engines.report_html` draws).

**Calls over time.** A stats row says that `calls` calls of one signature happened between
`first_ts` and `last_ts`; they are spread evenly over that span, so the time resolution is a
minute (a rollup's row, `capture.schema.ROLLUP_BUCKET_S`; a segment of up to ``flush_seconds``
in stores written before rollups). `capture compact` merges the rows of one signature into one,
spanning all of them: the calls over time of a compacted store are coarser.

**Served by an artifact.** `served_calls` aggregates, per recorded call group, the rows of
`replay.ship.drift.check_rows` (one per distinct recorded signature: its input structure, calls, and
whether a program of the artifact serves it, with the runner's own guards), so the report and
`capture check` give one answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.store.reader import StoreReader

__all__ = ["Timeline", "ServedGroup", "timeline", "served_calls", "symbol_kind"]

_STATS_SQL = """
SELECT in_structure, calls, epoch_us(first_ts) AS t0, epoch_us(last_ts) AS t1
FROM stats WHERE model = $model
"""


@dataclass
class Timeline:
    """Calls per time bin, per call group of one model.

    Attributes:
        start_us: Start of the first bin (epoch microseconds, UTC).
        bin_us: Width of one bin in microseconds.
        groups: Group names, in the order of the rows of `calls`.
        calls: ``(groups, bins)`` calls per bin (fractional: segments are spread evenly).
    """

    start_us: int
    bin_us: int
    groups: list[str]
    calls: np.ndarray[Any, np.dtype[np.float64]]


def timeline(store: StoreReader, model: str, groups: Sequence[Group], bins: int = 60) -> Timeline:
    """Calls over time per group of `model`, from the stats rows (module docstring).

    Args:
        store: An open store.
        model: The model.
        groups: Its call groups (`capture.analysis.groups.analyze`), to name the structures.
        bins: Number of time bins.

    Returns:
        A `Timeline`; structures that no group describes are left out.

    Example:
        >>> tl = timeline(store, "M", analyze(store, "M"))  # doctest: +SKIP
        >>> tl.calls.sum(axis=1)  # doctest: +SKIP
    """
    table = store.query(_STATS_SQL, {"model": model})
    names = [g.name for g in groups]
    row_of = {g.structure_id: i for i, g in enumerate(groups)}
    structures = table.column("in_structure").to_pylist()
    keep = np.array([s in row_of for s in structures], dtype=bool)
    rows = np.array([row_of.get(s, -1) for s in structures], dtype=np.int64)[keep]
    calls = table.column("calls").to_numpy().astype(np.float64)[keep]
    t0 = table.column("t0").to_numpy().astype(np.int64)[keep]
    t1 = np.maximum(table.column("t1").to_numpy().astype(np.int64)[keep], t0)
    matrix = np.zeros((len(groups), bins))
    if t0.size == 0:
        return Timeline(0, 1, names, matrix)
    start, stop = int(t0.min()), int(t1.max())
    width = max(1, -(-(stop - start + 1) // bins))
    edges = start + width * np.arange(bins + 1, dtype=np.int64)
    span = (t1 - t0).astype(np.float64)
    instant = span == 0
    # Overlap of each row's [t0, t1] with each bin, as a share of the row's span.
    lo = np.maximum(t0[:, None], edges[None, :-1])
    hi = np.minimum(t1[:, None], edges[None, 1:])
    share = np.clip(hi - lo, 0, None) / np.where(instant, 1.0, span)[:, None]
    share[instant] = 0.0
    share[instant, np.minimum((t0[instant] - start) // width, bins - 1)] = 1.0
    # Rounding: make every row's shares sum to exactly 1 so no call is lost.
    share /= share.sum(axis=1, keepdims=True)
    np.add.at(matrix, rows, share * calls[:, None])
    return Timeline(start, width, names, matrix)


def symbol_kind(group: Group, symbol: str) -> str:
    """A reader's guess at what a shared symbol measures, from the dims it covers.

    Returns:
        ``batch size``, ``cache length``, ``sequence length``, ``image size`` or ``size``.

    Example:
        >>> symbol_kind(group, "batch")  # doctest: +SKIP
        'batch size'
    """
    if symbol == "batch" or symbol.startswith("batch_"):
        return "batch size"
    dims = [d for d in group.dims if d.symbol == symbol]
    arguments = {(d.argument or d.path).lower() for d in dims}
    axes = {d.axis for d in dims}
    if any("past" in a or "cache" in a for a in arguments):
        return "cache length"
    if any("pixel" in a or "image" in a for a in arguments) and axes & {2, 3}:
        return "image size"
    if axes == {0}:
        return "batch size"
    if axes & {1} and any(
        k in a for a in arguments for k in ("input_ids", "mask", "position", "embeds", "token")
    ):
        return "sequence length"
    return "size"


@dataclass(frozen=True)
class ServedGroup:
    """How much of one recorded call group an artifact serves."""

    group: str
    calls: int
    served_calls: int
    signatures: int
    served_signatures: int
    programs: list[str]


def served_calls(groups: Sequence[Group], rows: Sequence[Mapping[str, Any]]) -> list[ServedGroup]:
    """How much of each recorded call group an artifact serves (module docstring).

    Args:
        groups: The recorded call groups of one model.
        rows: `replay.ship.drift.check_rows` for the artifact (every model of the store).

    Returns:
        One `ServedGroup` per recorded group, in the order of `groups`.

    Example:
        >>> served_calls(groups, rows)[0].served_calls  # doctest: +SKIP
        7
    """
    out = []
    for g in groups:
        mine = [r for r in rows if r["model"] == g.model and r["structure"] == g.structure_id]
        served = [r for r in mine if r["served"]]
        out.append(
            ServedGroup(
                group=g.name,
                calls=sum(int(r["calls"]) for r in mine),
                served_calls=sum(int(r["calls"]) for r in served),
                signatures=len(mine),
                served_signatures=len(served),
                programs=sorted({str(r["group"]) for r in served}),
            )
        )
    return out
