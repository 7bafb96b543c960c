"""Which recorded calls a saved artifact serves: one answer for `capture check` and `report`.

The artifact's manifest (`replay.runtime.pt2.loading.read_manifest`, the whole archive checked as
`replay.load` checks it) says, per program, the recorded call structure it takes and the
recorded ranges of its dims (`replay.runtime.guards`); the store says what the model received.
Every distinct recorded signature is routed with the runner's own function
(`replay.runtime.guards.route`), so a signature reported served is one the runner serves; a call
that spelled a renamed argument the other way (`capture.renames`) is routed as its structure
spelled the program's way, as the runner passes it. Needs neither torch nor the model's code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from capture.store.reader import StoreReader
    from replay.runtime.manifest import Manifest

__all__ = ["DriftRow", "check_rows"]


@dataclass(frozen=True)
class DriftRow:
    """One distinct recorded signature of the window, and whether the artifact serves it.

    Attributes:
        model_name: The model's name in the store (``model.encoder`` for a recorded
            sub-module; the ``model`` column of ``capture check``).
        structure: The recorded input structure id.
        group: The program serving the signature, or None.
        signature: The sizes in the seeds' notation (``T7s2x5,T7s2x5``).
        calls: The recorded calls of that signature in the window.
        served: Whether a program serves it.
        reason: Why each program refused it (None when served).
        state: The label of the state its calls ran under (`capture.state.state_label`):
            only the programs of that state may serve it, as the runner's ``state()`` view.
    """

    model_name: str
    structure: str
    group: str | None
    signature: str
    calls: int
    served: bool
    reason: str | None
    state: str = "default"

    def to_json(self) -> dict[str, Any]:
        """The row as ``capture check`` prints it (the structure id left out: its group says it;
        the model's name under the store's column name, ``model``)."""
        out = {"model": self.model_name, **dataclasses.asdict(self)}
        del out["model_name"], out["structure"]
        return out


_CALLS = """
SELECT coalesce(state, '') AS state, in_structure, dims, count(*) AS calls,
       min(ts) AS first_ts, max(ts) AS last_ts
FROM calls
WHERE model = $model AND error IS NULL AND ($since IS NULL OR ts >= $since)
GROUP BY ALL
ORDER BY min(ts), in_structure, state
"""

_STRUCTURES = """
SELECT structure_id, leaf, path, argument, kind, dtype, rank, value, dim_offset, treespec
FROM structures WHERE model = $model ORDER BY structure_id, leaf
"""


def check_rows(
    store: StoreReader, manifest: Manifest, since: datetime | None, model_name: str | None
) -> list[DriftRow]:
    """One row per distinct recorded signature of the window, for every module of the artifact.

    Each signature is routed with `replay.runtime.guards.route`, the runner's own rule: the
    recorded treespec and leaves must be the program's, the sizes within its guards, and the
    signature not one the export's check failed; only the programs of the state its calls ran
    under are tried (a state the artifact has no program of serves nothing). The programs
    themselves were checked to be in the archive when the manifest was read
    (`replay.runtime.pt2.loading.read_artifact`).

    Args:
        store: An open `capture.Store`.
        manifest: The artifact's typed manifest (`replay.runtime.pt2.loading.read_manifest`).
        since: Only calls at or after this moment (None: every call).
        model_name: The model's name in the store when it differs from the artifact's.

    Returns:
        One `DriftRow` per distinct recorded signature.

    Example:
        >>> rows = check_rows(store, read_manifest("model.pt2"), None, None)  # doctest: +SKIP
        >>> rows[0].served  # doctest: +SKIP
        True
    """
    from capture.state import state_label
    from replay.inputs.shapes import describe_sizes
    from replay.runtime.guards import route
    from replay.runtime.runner import describe_states

    base = model_name or manifest.model_name
    rows: list[DriftRow] = []
    for module in manifest.modules:
        name = f"{base}.{module}" if module else base
        store.check_model(name)
        guards_of: dict[str, list[Any]] = {}
        for entry in manifest.for_module(module):
            guards_of.setdefault(entry.state, []).append(entry.guard)
        known = describe_states(list(guards_of))
        structures, keys, spelled = _structures(store, name)
        calls = store.query(_CALLS, {"model": name, "since": since}).to_pylist()
        for call in calls:
            own = call["in_structure"]
            structure = structures.get(own)
            leaves = structure.leaves if structure is not None else ()
            dims = [int(v) for v in call["dims"]]
            twins = [s for s in spelled.get(keys.get(own, ()), ()) if s != own]
            served, reasons = None, {}
            guards = guards_of.get(call["state"], [])
            if not guards:
                reasons = {"state": f"the artifact has no program of this state (its: {known})"}
            # its own spelling first, then the other ones
            for sid in [own, *twins] if guards else ():
                twin = structures.get(sid)
                facts = (twin.treespec if twin else None, twin.leaves if twin else (), dims)
                served, why = route(guards, lambda _g, f=facts: f)  # type: ignore[misc]
                reasons = reasons or why
                if served is not None:
                    break
            rows.append(
                DriftRow(
                    model_name=name,
                    structure=call["in_structure"],
                    group=served.label if served is not None else None,
                    signature=describe_sizes(leaves, dims) if leaves else "?",
                    calls=int(call["calls"]),
                    served=served is not None,
                    reason=None
                    if served
                    else ("; ".join(f"{k}: {v}" for k, v in reasons.items()) or "no program"),
                    state=state_label(call["state"] or None),
                )
            )
    return rows


def _structures(
    store: StoreReader, model_name: str
) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]], dict[tuple[Any, ...], list[str]]]:
    """The model's recorded structures by id, each one's spelling key (`capture.renames`), and
    the structures of each spelling key."""
    from capture.pytree.recorded_structure import RecordedStructure
    from capture.renames import spelling_key

    by_id: dict[str, list[dict[str, Any]]] = {}
    for row in store.query(_STRUCTURES, {"model": model_name}).to_pylist():
        by_id.setdefault(row["structure_id"], []).append(row)
    structures = {sid: RecordedStructure.from_rows(rows) for sid, rows in by_id.items()}
    keys = {sid: spelling_key(rows) for sid, rows in by_id.items()}
    spelled: dict[tuple[Any, ...], list[str]] = {}
    for sid, key in keys.items():
        spelled.setdefault(key, []).append(sid)
    return structures, keys, spelled
