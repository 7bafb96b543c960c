"""Which programs of an artifact serve which recorded call group: regimes and merged groups.

A call group of the store may be served by several programs of an artifact (its **regimes**,
`replay.regimes`: ``prefill[input_ids_1<=4]``, ``prefill[input_ids_1>=5]``), or by another
group's program with an input filled (`replay.merging`). ``capture summary --artifact PATH``
shows it per group, from the artifact's manifest (`replay.ship.artifact.read_manifest`) and the
store's summary. Needs neither torch nor the model's code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["routes"]


def _ranges(axes: Sequence[Mapping[str, Any]]) -> str:
    """``input_ids_1 4..4, batch 1..3``: the recorded range of each dynamic symbol."""
    seen: dict[str, str] = {}
    for axis in axes:
        symbol = axis.get("symbol")
        if axis.get("dynamic") and symbol and symbol not in seen:
            low, high = axis.get("min"), axis.get("max")
            seen[str(symbol)] = f"{symbol} {low}" if low == high else f"{symbol} {low}..{high}"
    return ", ".join(seen.values()) or "static"


def routes(manifest: Mapping[str, Any], model: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per program entry of the artifact that serves the model's own calls.

    Args:
        manifest: The artifact's manifest.
        model: One model of `Store.summary()` (``groups`` with ``name`` and ``structure_id``).

    Returns:
        Rows with ``group`` (the store's call group, None when the store has no group of the
        entry's structure), ``served_as`` (the entry's group: a regime or the group itself),
        ``program`` (the program that runs), ``ranges`` (its guards: the recorded range of each
        dynamic symbol) and ``fills`` (inputs filled per call, ``;``-joined, or None).

    Example:
        >>> entry = {"module": "", "group": "g0[x_0<=3]", "program": "g0[x_0<=3]",
        ...          "structure_id": "s1", "axes": [{"symbol": "x_0", "dynamic": True,
        ...          "min": 2, "max": 3}], "fills": []}
        >>> routes({"programs": [entry]}, {"groups": [{"name": "g0", "structure_id": "s1"}]})
        ... # doctest: +NORMALIZE_WHITESPACE
        [{'group': 'g0', 'served_as': 'g0[x_0<=3]', 'program': 'g0[x_0<=3]',
          'ranges': 'x_0 2..3', 'fills': None}]
    """
    names = {g["structure_id"]: g["name"] for g in model.get("groups", ())}
    rows = []
    for entry in manifest.get("programs", ()):
        if entry.get("module", ""):
            continue
        fills = [str(f.get("text") or f.get("argument")) for f in entry.get("fills") or ()]
        rows.append(
            {
                "group": names.get(entry.get("structure_id")),
                "served_as": entry.get("group"),
                "program": entry.get("program"),
                "ranges": _ranges(entry.get("axes") or ()),
                "fills": "; ".join(fills) or None,
            }
        )
    return rows
