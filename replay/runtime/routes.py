"""Which programs of an artifact serve which recorded call group: regimes and merged groups.

A call group of the store may be served by several programs of an artifact (its **regimes**,
`replay.pipeline.splitting`: ``prefill[input_ids_1<=4]``, ``prefill[input_ids_1>=5]``), or by
another group's program with an input filled (`replay.pipeline.merging`). ``capture summary
--artifact PATH`` shows it per group, from the artifact's manifest
(`replay.runtime.pt2.loading.read_manifest`) and the store's summary. Needs neither torch nor the
model's code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capture.analysis.summary import ModelSummary
    from replay.runtime.guards import Axis
    from replay.runtime.manifest import Manifest

__all__ = ["routes"]


def _ranges(axes: Sequence[Axis]) -> str:
    """``input_ids_1 4..4, batch 1..3``: the recorded range of each dynamic symbol."""
    seen: dict[str, str] = {}
    for axis in axes:
        symbol = axis.symbol
        if axis.dynamic and symbol and symbol not in seen:
            low, high = axis.min, axis.max
            seen[symbol] = f"{symbol} {low}" if low == high else f"{symbol} {low}..{high}"
    return ", ".join(seen.values()) or "static"


def routes(manifest: Manifest, summary: ModelSummary) -> list[dict[str, Any]]:
    """One row per program entry of the artifact that serves the model's own calls.

    Args:
        manifest: The artifact's typed manifest (`replay.runtime.pt2.loading.read_manifest`).
        summary: One model of `Store.summary()` (its groups' ``name`` and ``structure_id``).

    Returns:
        Rows with ``group`` (the store's call group, None when the store has no group of the
        entry's structure), ``served_as`` (the entry's group: a regime or the group itself),
        ``program`` (the program that runs), ``ranges`` (its guards: the recorded range of each
        dynamic symbol) and ``fills`` (inputs filled per call, ``;``-joined, or None).

    Example:
        >>> import json
        >>> from replay.runtime.manifest import Manifest
        >>> entry = {"module": "", "group": "g0[x_0<=3]", "program": "g0[x_0<=3]",
        ...          "model": "m", "structure_id": "s1", "calls": 2, "signatures": 2,
        ...          "treespec": None, "signature": None, "n_args": 1,
        ...          "leaves": [{"path": "args[0]", "kind": "tensor", "rank": 1}],
        ...          "axes": [{"path": "args[0]", "axis": 0, "symbol": "x_0",
        ...                    "dynamic": True, "min": 2, "max": 3}],
        ...          "form": {"positional": ["x"], "keywords": []}}
        >>> text = {"format": "capture-artifact/2", "model": "m", "programs": [entry],
        ...         "digests": {}, "modules": {"": {"model": "m", "complete": True}}}
        >>> manifest = Manifest.parse(json.dumps(text).encode(), "m.json")
        >>> from types import SimpleNamespace as Record
        >>> routes(manifest, Record(groups=[Record(name="g0", structure_id="s1")]))
        ... # doctest: +NORMALIZE_WHITESPACE
        [{'group': 'g0', 'served_as': 'g0[x_0<=3]', 'program': 'g0[x_0<=3]',
          'ranges': 'x_0 2..3', 'fills': None}]
    """
    names = {g.structure_id: g.name for g in summary.groups}
    rows = []
    for entry in manifest.programs:
        if entry.module_name:
            continue
        fills = [fill.text or fill.argument for fill in entry.fills]
        rows.append(
            {
                "group": names.get(entry.structure_id),
                "served_as": entry.group,
                "program": entry.program,
                "ranges": _ranges(entry.guard.axes),
                "fills": "; ".join(fills) or None,
            }
        )
    return rows
