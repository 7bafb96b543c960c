"""`Store.summary()`: what a store recorded, per model, as one JSON-serializable dict.

The dict (every timestamp an ISO 8601 string, every count an int)::

    {
      "store": "/path/to/store",
      "calls": 20, "errors": 0, "signatures": 20,
      "first_ts": "2026-01-02T10:00:00.000001+00:00", "last_ts": "...",
      "skipped_files": ["/path/to/store/calls/.../bad.parquet"],
      "models": [
        {
          "model": "LlamaForCausalLM",
          "calls": 20, "errors": 0, "signatures": 20, "first_ts": "...", "last_ts": "...",
          "groups": [      # largest first
            {"name": "decode", "structure_id": "068d...", "calls": 9, "errors": 0,
             "signatures": 9, "share": 0.45, "first_ts": "...", "last_ts": "...",
             "inputs": ["input_ids", "past_key_values", ...],   # passed, not None
             "absent": ["inputs_embeds", "labels"],             # missing or None
             "symbols": [{"symbol": "batch", "expr": None, "min": 2, "max": 3,
                          "distinct": 2, "dims": ["kwargs['input_ids'].shape[0]", ...]}],
             "relations": ["attention_mask_1 = past_key_values_2 + 1"],
             "blocked": None}   # or why a recorded class keeps it from export
          ],
          "optional_inputs": [   # arguments present in some calls, missing or None in others
            {"argument": "attention_mask", "calls": 20, "present": 12, "missing": 8,
             "none": 0, "absent_in": ["decode_no_attention_mask", "prefill_no_attention_mask"]}
          ],
          "always_absent": ["inputs_embeds", "labels"],   # missing or None in every call
          "drift": [             # one input path seen with several kinds, dtypes or ranks
            {"path": "args[0]", "argument": "x", "changes": ["dtype"],
             "variants": [{"kind": "tensor", "dtype": "float32", "rank": 2, "calls": 5,
                           "groups": ["g0"]}, ...]}
          ],
          "relations": [{"group": "decode", "symbol": "attention_mask_1",
                         "expr": "past_key_values_2 + 1",
                         "relation": "attention_mask_1 = past_key_values_2 + 1"}]
        }
      ]
    }
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from capture import schema
from capture.analysis.groups import Group, analyze
from capture.pytree.cachespec import blocking_reason
from capture.pytree.structure import MISSING, NONE, PRESENT

if TYPE_CHECKING:
    from capture.store.reader import StoreReader

__all__ = ["summary", "build_summary", "blocked_rows", "drift_rows", "group_rows"]

_ABSENT = (schema.KIND_MISSING, schema.KIND_NONE)


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.astimezone(timezone.utc).isoformat()


def _status(group: Group) -> dict[str, str]:
    return group.structure.argument_status()


def _symbols(group: Group) -> list[dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for d in group.dims:
        if d.symbol is None:
            continue
        entry = out.setdefault(
            d.symbol,
            {
                "symbol": d.symbol,
                "expr": d.expr,
                "min": d.min,
                "max": d.max,
                "distinct": d.distinct,
                "dims": [],
            },
        )
        entry["dims"].append(f"{d.path}.shape[{d.axis}]")
    return list(out.values())


def _group_entry(group: Group, model_calls: int) -> dict[str, Any]:
    status = _status(group)
    return {
        "name": group.name,
        "structure_id": group.structure_id,
        "calls": group.calls,
        "errors": group.errors,
        "signatures": group.signatures,
        "share": round(group.calls / model_calls, 6) if model_calls else 0.0,
        "first_ts": _iso(group.first_ts),
        "last_ts": _iso(group.last_ts),
        "inputs": [a for a, s in status.items() if s == PRESENT],
        "absent": [a for a, s in status.items() if s != PRESENT],
        "symbols": _symbols(group),
        "relations": [str(r) for r in group.relations],
        # Scalars are part of the structure: groups may differ by one alone.
        "scalars": {leaf.path: leaf.value for leaf in group.structure.leaves if leaf.is_scalar},
        # The class that keeps the group from being rebuilt and exported, and why.
        "blocked": blocking_reason(group.structure),
    }


def _optional_inputs(groups: Sequence[Group]) -> tuple[list[dict[str, Any]], list[str]]:
    """Arguments whose presence varies across calls, and those never passed (or always None)."""
    statuses = [_status(g) for g in groups]
    arguments: list[str] = []
    for st in statuses:
        arguments.extend(a for a in st if a not in arguments)
    order = groups[0].structure.params.index if groups else {}
    arguments.sort(key=lambda a: order.get(a, len(order)))
    total = sum(g.calls for g in groups)
    optional, always_absent = [], []
    for argument in arguments:
        counts = {PRESENT: 0, MISSING: 0, NONE: 0}
        absent_in = []
        for g, st in zip(groups, statuses, strict=True):
            state = st.get(argument, MISSING)
            counts[state] += g.calls
            if state != PRESENT:
                absent_in.append(g.name)
        if counts[PRESENT] == 0:
            always_absent.append(argument)
        elif counts[PRESENT] < total:
            optional.append(
                {"argument": argument, "calls": total, **counts, "absent_in": absent_in}
            )
    return optional, always_absent


def _drift(groups: Sequence[Group]) -> list[dict[str, Any]]:
    """Input paths seen with more than one kind, dtype or rank (missing/None left out)."""
    variants: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
    arguments: dict[str, str | None] = {}
    for g in groups:
        for r in g.structure.leaves:
            if r.kind in _ABSENT:
                continue
            key = (r.kind, r.dtype, r.rank)
            arguments.setdefault(r.path, r.argument)
            entry = variants.setdefault(r.path, {}).setdefault(
                key,
                {
                    "kind": r.kind,
                    "dtype": r.dtype,
                    "rank": r.rank,
                    "calls": 0,
                    "groups": [],
                },
            )
            entry["calls"] += g.calls
            entry["groups"].append(g.name)
    out = []
    for path, seen in variants.items():
        if len(seen) < 2:
            continue
        changes = [
            name
            for i, name in enumerate(("kind", "dtype", "rank"))
            if len({key[i] for key in seen}) > 1
        ]
        rows = sorted(seen.values(), key=lambda v: -int(v["calls"]))
        out.append(
            {"path": path, "argument": arguments[path], "changes": changes, "variants": rows}
        )
    return out


def _model_entry(model: str, groups: Sequence[Group]) -> dict[str, Any]:
    calls = sum(g.calls for g in groups)
    firsts = [g.first_ts for g in groups if g.first_ts is not None]
    lasts = [g.last_ts for g in groups if g.last_ts is not None]
    optional, always_absent = _optional_inputs(groups)
    return {
        "model": model,
        "calls": calls,
        "errors": sum(g.errors for g in groups),
        "signatures": sum(g.signatures for g in groups),
        "first_ts": _iso(min(firsts)) if firsts else None,
        "last_ts": _iso(max(lasts)) if lasts else None,
        "groups": [_group_entry(g, calls) for g in groups],
        "optional_inputs": optional,
        "always_absent": always_absent,
        "drift": _drift(groups),
        "relations": [
            {"group": g.name, "symbol": r.symbol, "expr": r.expr, "relation": str(r)}
            for g in groups
            for r in g.relations
        ],
    }


def summary(store: StoreReader, model: str | None = None) -> dict[str, Any]:
    """What the store recorded, per model (`Store.summary()`): this module's dict.

    Args:
        store: An open store.
        model: A model name, or None for every model.

    Returns:
        A JSON-serializable dict: totals, date range, and per model its call groups,
        inputs sometimes missing or None, dtype/rank drift and relations.

    Raises:
        UnknownModel: `model` is not in the store.

    Example:
        >>> summary(open_store("capture-store"))["calls"]  # doctest: +SKIP
        20
    """
    models = store.check_model(model)
    return build_summary(store, models, analyze(store, model))


def build_summary(
    store: StoreReader, models: Sequence[str], groups: Sequence[Group]
) -> dict[str, Any]:
    """The summary dict described in this module's docstring.

    Args:
        store: The store the groups come from (its path and skipped files are reported).
        models: The models to report, in order (a model without recorded calls gets zeros).
        groups: `capture.analysis.groups.analyze()` over those models.

    Returns:
        The summary dict.

    Example:
        >>> build_summary(store, ["add"], analyze(store, "add"))["calls"]  # doctest: +SKIP
        3
    """
    entries = [_model_entry(m, [g for g in groups if g.model == m]) for m in models]
    firsts = [g.first_ts for g in groups if g.first_ts is not None]
    lasts = [g.last_ts for g in groups if g.last_ts is not None]
    return {
        "store": store.path,
        "calls": sum(e["calls"] for e in entries),
        "errors": sum(e["errors"] for e in entries),
        "signatures": sum(e["signatures"] for e in entries),
        "first_ts": _iso(min(firsts)) if firsts else None,
        "last_ts": _iso(max(lasts)) if lasts else None,
        "skipped_files": [s.path for s in store.skipped],
        "models": entries,
    }


def drift_rows(model: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One flat row per variant of every drifting input of a model's summary entry.

    Args:
        model: One entry of ``build_summary(...)["models"]``.

    Returns:
        Rows with ``path, changes, kind, dtype, rank, calls, groups`` (lists joined with
        ``", "``), as `capture summary` and `capture report` show them.
    """
    return [
        {
            "path": d["path"],
            "changes": ", ".join(map(str, d["changes"])),
            "kind": v["kind"],
            "dtype": v["dtype"],
            "rank": v["rank"],
            "calls": v["calls"],
            "groups": ", ".join(map(str, v["groups"])),
        }
        for d in model.get("drift", ())
        for v in d["variants"]
    ]


def blocked_rows(groups: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per group that a recorded class keeps from export, in order.

    Args:
        groups: The ``groups`` of one entry of ``build_summary(...)["models"]``.

    Returns:
        Rows with ``group, calls, reason``; empty when every group can be rebuilt.

    Example:
        >>> blocked_rows([{"name": "g0", "calls": 3, "blocked": "not reproducible: ..."}])
        [{'group': 'g0', 'calls': 3, 'reason': 'not reproducible: ...'}]
    """
    return [
        {"group": g["name"], "calls": g["calls"], "reason": g["blocked"]}
        for g in groups
        if g.get("blocked")
    ]


def group_rows(groups: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per call group of a model's summary entry, in the order given.

    Args:
        groups: The ``groups`` of one entry of ``build_summary(...)["models"]``.

    Returns:


    """
    return [
        {
            "group": g["name"],
            "calls": g["calls"],
            "share": f"{100 * g['share']:.1f}%",
            "signatures": g["signatures"],
            "raised": g["errors"],
            "inputs": ", ".join(map(str, g["inputs"] or ())),
            "absent": ", ".join(map(str, g["absent"] or ())),
        }
        for g in groups
    ]
