"""Which recorded calls a saved artifact serves: one answer for `capture check` and `report`.

The artifact's manifest (`replay.ship.artifact.read_manifest`) says, per program, the recorded call
structure it takes and the recorded ranges of its dims (`replay.ship.guards`); the store says what
the model received. Every distinct recorded signature is checked against the programs in order,
with the same guards as the runner `replay.load` returns, so a signature reported served is one
the runner serves. Needs neither torch nor the model's code.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["check_rows"]

_CALLS = """
SELECT in_structure, dims, count(*) AS calls, min(ts) AS first_ts, max(ts) AS last_ts
FROM calls
WHERE model = $model AND error IS NULL AND ($since IS NULL OR ts >= $since)
GROUP BY in_structure, dims
ORDER BY min(ts), in_structure
"""

_STRUCTURES = """
SELECT structure_id, leaf, path, argument, kind, dtype, rank, value, dim_offset, treespec
FROM structures WHERE model = $model ORDER BY structure_id, leaf
"""


def check_rows(
    store: Any, manifest: dict[str, Any], since: datetime | None, model: str | None
) -> list[dict[str, Any]]:
    """One row per distinct recorded signature of the window, for every module of the artifact.

    Args:
        store: An open `capture.Store`.
        manifest: The artifact's manifest (`replay.ship.artifact.read_manifest`).
        since: Only calls at or after this moment (None: every call).
        model: The model's name in the store when it differs from the artifact's.

    Returns:
        Rows with ``model, structure, group, signature, calls, served, reason``
        (``structure``: the recorded input structure id; ``group``: the program serving the
        signature, or null; ``reason``: why each program refused it).
    """
    from capture.pytree.structure import RecordedStructure
    from replay.shapes import describe_sizes
    from replay.ship.guards import ProgramGuard

    base = model or str(manifest["model"])
    rows: list[dict[str, Any]] = []
    for module in manifest["modules"]:
        name = f"{base}.{module}" if module else base
        store.check_model(name)
        guards = [
            ProgramGuard.from_manifest(e)
            for e in manifest["programs"]
            if e.get("module", "") == module
        ]
        by_id: dict[str, list[dict[str, Any]]] = {}
        for row in store.query(_STRUCTURES, {"model": name}).to_pylist():
            by_id.setdefault(row["structure_id"], []).append(row)
        structures = {sid: RecordedStructure.from_rows(rows) for sid, rows in by_id.items()}
        calls = store.query(_CALLS, {"model": name, "since": since}).to_pylist()
        for call in calls:
            structure = structures.get(call["in_structure"])
            treespec = structure.treespec if structure is not None else None
            leaves = structure.leaves if structure is not None else ()
            dims = [int(v) for v in call["dims"]]
            served, reasons = None, []
            for guard in guards:
                if not guard.matches(treespec, leaves, call["in_structure"]):
                    reasons.append(f"{guard.label}: different call structure")
                    continue
                failed = guard.check(dims)
                if failed is None:
                    served = guard.label
                    break
                reasons.append(f"{guard.label}: {failed}")
            rows.append(
                {
                    "model": name,
                    "structure": call["in_structure"],
                    "group": served,
                    "signature": describe_sizes(leaves, dims) if leaves else "?",
                    "calls": int(call["calls"]),
                    "served": served is not None,
                    "reason": None if served else ("; ".join(reasons) or "no program"),
                }
            )
    return rows
