"""`Store.summary()`: what a store recorded, per model, as typed, frozen records.

`Summary` holds one `ModelSummary` per model, each with its `GroupSummary` rows (largest first),
the inputs sometimes missing or None (`OptionalInput`), the inputs seen with several kinds,
dtypes or ranks (`Drift`), and the relations between dims (`RelationRow`). The CLI, the report
and replay read attributes; `Summary.to_json` is the one JSON form (``capture summary -f json``),
every timestamp an ISO 8601 string and every count an int::

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
             "inputs": ["input_ids", "cache", ...],         # passed, not None
             "absent": ["inputs_embeds", "labels"],          # missing or None
             "symbols": [{"symbol": "batch", "expr": None, "min": 2, "max": 3,
                          "distinct": 2, "dims": ["kwargs['input_ids'].shape[0]", ...]}],
             "relations": ["attention_mask_1 = cache_2 + 1"],
             "scalars": {"kwargs['use_cache']": "true"},
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
                         "expr": "cache_2 + 1", "relation": "attention_mask_1 = cache_2 + 1"}]
        }
      ]
    }

(``capture summary --artifact`` adds ``"programs"`` to a model: `ModelSummary.programs`.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from capture import schema
from capture.analysis.groups import Group, analyze
from capture.pytree.cachespec import blocking_reason
from capture.pytree.recorded_structure import MISSING, NONE, PRESENT

if TYPE_CHECKING:
    from capture.store.reader import StoreReader

__all__ = [
    "Summary",
    "ModelSummary",
    "GroupSummary",
    "SymbolSummary",
    "OptionalInput",
    "Drift",
    "DriftVariant",
    "RelationRow",
    "summary",
    "build_summary",
    "blocked_rows",
    "drift_rows",
    "group_table_rows",
    "state_rows",
]

_ABSENT = (schema.KIND_MISSING, schema.KIND_NONE)


def _json(value: Any) -> Any:
    """`value` as JSON-ready data: records as dicts of their fields in order, tuples as lists."""
    if isinstance(value, _Record):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


class _Record:
    """A frozen record whose JSON form is its fields, in order, records and tuples nested."""

    def to_json(self) -> dict[str, Any]:
        """This record as JSON-ready dicts and lists (what ``-f json`` prints)."""
        return {
            f.name: _json(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
        }


@dataclass(frozen=True)
class SymbolSummary(_Record):
    """One symbol of a group: the dims it names and their recorded range."""

    symbol: str
    expr: str | None
    min: int | None
    max: int | None
    distinct: int | None
    dims: tuple[str, ...]


@dataclass(frozen=True)
class GroupSummary(_Record):
    """One call group: its calls, inputs passed or absent, symbols, relations, scalars."""

    name: str
    structure_id: str
    calls: int
    errors: int
    signatures: int
    share: float
    first_ts: str | None
    last_ts: str | None
    inputs: tuple[str, ...]
    absent: tuple[str, ...]
    symbols: tuple[SymbolSummary, ...]
    relations: tuple[str, ...]
    scalars: Mapping[str, Any]
    blocked: str | None
    state: str = ""
    """The state key its calls ran under (`capture.state`; ``""``: the default state)."""


@dataclass(frozen=True)
class OptionalInput(_Record):
    """An argument passed in some calls and missing or None in others (counts are calls)."""

    argument: str
    calls: int
    present: int
    missing: int
    none: int
    absent_in: tuple[str, ...]


@dataclass(frozen=True)
class DriftVariant(_Record):
    """One kind/dtype/rank an input path was seen with."""

    kind: str
    dtype: str | None
    rank: int | None
    calls: int
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Drift(_Record):
    """An input path seen with several kinds, dtypes or ranks."""

    path: str
    argument: str | None
    changes: tuple[str, ...]
    variants: tuple[DriftVariant, ...]


@dataclass(frozen=True)
class RelationRow(_Record):
    """A relation between dims that holds in every recorded call of a group."""

    group: str
    symbol: str
    expr: str
    relation: str


@dataclass(frozen=True)
class ModelSummary(_Record):
    """One model of the store: totals and its groups, optional inputs, drift, relations.

    Attributes:
        model_name: The model's name in the store (``model`` in the JSON form, as in the
            store's tables).
        programs: Filled by ``capture summary --artifact``: one row per group saying which
            program of the artifact serves it (`replay.runtime.routes`); None otherwise.
    """

    model_name: str
    calls: int
    errors: int
    signatures: int
    first_ts: str | None
    last_ts: str | None
    groups: tuple[GroupSummary, ...]
    optional_inputs: tuple[OptionalInput, ...]
    always_absent: tuple[str, ...]
    drift: tuple[Drift, ...]
    relations: tuple[RelationRow, ...]
    programs: tuple[Mapping[str, Any], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"model": self.model_name, **super().to_json()}
        del out["model_name"]
        if self.programs is None:
            del out["programs"]
        return out


@dataclass(frozen=True)
class Summary(_Record):
    """What a store recorded: totals, date range, files skipped, and one entry per model."""

    store: str
    calls: int
    errors: int
    signatures: int
    first_ts: str | None
    last_ts: str | None
    skipped_files: tuple[str, ...]
    models: tuple[ModelSummary, ...]


def _iso(ts: datetime | None) -> str | None:
    return None if ts is None else ts.astimezone(timezone.utc).isoformat()


def _status(group: Group) -> dict[str, str]:
    return group.structure.argument_status()


def _symbols(group: Group) -> tuple[SymbolSummary, ...]:
    out: dict[str, SymbolSummary] = {}
    for d in group.dims:
        if d.symbol is None:
            continue
        dim = f"{d.path}.shape[{d.axis}]"
        seen = out.get(d.symbol)
        out[d.symbol] = (
            SymbolSummary(d.symbol, d.expr, d.min, d.max, d.distinct, (dim,))
            if seen is None
            else dataclasses.replace(seen, dims=(*seen.dims, dim))
        )
    return tuple(out.values())


def _group_entry(group: Group, model_calls: int) -> GroupSummary:
    status = _status(group)
    return GroupSummary(
        name=group.name,
        structure_id=group.structure_id,
        calls=group.calls,
        errors=group.errors,
        signatures=group.signatures,
        share=round(group.calls / model_calls, 6) if model_calls else 0.0,
        first_ts=_iso(group.first_ts),
        last_ts=_iso(group.last_ts),
        inputs=tuple(a for a, s in status.items() if s == PRESENT),
        absent=tuple(a for a, s in status.items() if s != PRESENT),
        symbols=_symbols(group),
        relations=tuple(str(r) for r in group.relations),
        # Scalars are part of the structure: groups may differ by one alone.
        scalars={leaf.path: leaf.value for leaf in group.structure.leaves if leaf.is_scalar},
        # The class that keeps the group from being rebuilt and exported, and why.
        blocked=blocking_reason(group.structure),
        state=group.state,
    )


def _optional_inputs(groups: Sequence[Group]) -> tuple[tuple[OptionalInput, ...], tuple[str, ...]]:
    """Arguments whose presence varies across calls, and those never passed (or always None)."""
    statuses = [_status(g) for g in groups]
    arguments: list[str] = []
    for st in statuses:
        arguments.extend(a for a in st if a not in arguments)
    order = groups[0].structure.params.index if groups else {}
    arguments.sort(key=lambda a: order.get(a, len(order)))
    total = sum(g.calls for g in groups)
    optional: list[OptionalInput] = []
    always_absent: list[str] = []
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
                OptionalInput(
                    argument,
                    total,
                    counts[PRESENT],
                    counts[MISSING],
                    counts[NONE],
                    tuple(absent_in),
                )
            )
    return tuple(optional), tuple(always_absent)


def _drift(groups: Sequence[Group]) -> tuple[Drift, ...]:
    """Input paths seen with more than one kind, dtype or rank (missing/None left out)."""
    variants: dict[str, dict[tuple[Any, ...], tuple[int, list[str]]]] = {}
    arguments: dict[str, str | None] = {}
    for g in groups:
        for r in g.structure.leaves:
            if r.kind in _ABSENT:
                continue
            key = (r.kind, r.dtype, r.rank)
            arguments.setdefault(r.path, r.argument)
            calls, names = variants.setdefault(r.path, {}).get(key, (0, []))
            variants[r.path][key] = (calls + g.calls, [*names, g.name])
    out = []
    for path, seen in variants.items():
        if len(seen) < 2:
            continue
        changes = tuple(
            name
            for i, name in enumerate(("kind", "dtype", "rank"))
            if len({key[i] for key in seen}) > 1
        )
        rows = sorted(
            (
                DriftVariant(k[0], k[1], k[2], calls, tuple(names))
                for k, (calls, names) in seen.items()
            ),
            key=lambda v: -v.calls,
        )
        out.append(Drift(path, arguments[path], changes, tuple(rows)))
    return tuple(out)


def _model_entry(model_name: str, groups: Sequence[Group]) -> ModelSummary:
    calls = sum(g.calls for g in groups)
    firsts = [g.first_ts for g in groups if g.first_ts is not None]
    lasts = [g.last_ts for g in groups if g.last_ts is not None]
    optional, always_absent = _optional_inputs(groups)
    return ModelSummary(
        model_name=model_name,
        calls=calls,
        errors=sum(g.errors for g in groups),
        signatures=sum(g.signatures for g in groups),
        first_ts=_iso(min(firsts)) if firsts else None,
        last_ts=_iso(max(lasts)) if lasts else None,
        groups=tuple(_group_entry(g, calls) for g in groups),
        optional_inputs=optional,
        always_absent=always_absent,
        drift=_drift(groups),
        relations=tuple(
            RelationRow(g.name, r.symbol, r.expr, str(r)) for g in groups for r in g.relations
        ),
    )


def summary(store: StoreReader, model_name: str | None = None) -> Summary:
    """What the store recorded, per model (`Store.summary()`).

    Args:
        store: An open store.
        model_name: A model name, or None for every model.

    Returns:
        The `Summary`: totals, date range, and per model its call groups, inputs sometimes
        missing or None, dtype/rank drift and relations (`Summary.to_json` for its JSON form).

    Raises:
        UnknownModel: `model_name` is not in the store.

    Example:
        >>> summary(open_store("capture-store")).calls  # doctest: +SKIP
        20
    """
    model_names = store.check_model(model_name)
    return build_summary(store, model_names, analyze(store, model_name))


def build_summary(
    store: StoreReader, model_names: Sequence[str], groups: Sequence[Group]
) -> Summary:
    """The `Summary` of `groups`, one entry per model of `model_names`.

    Args:
        store: The store the groups come from (its path and skipped files are reported).
        model_names: The models to report, in order (a model without recorded calls gets zeros).
        groups: `capture.analysis.groups.analyze()` over those models.

    Returns:
        The `Summary`.

    Example:
        >>> build_summary(store, ["add"], analyze(store, "add")).calls  # doctest: +SKIP
        3
    """
    entries = tuple(_model_entry(m, [g for g in groups if g.model_name == m]) for m in model_names)
    firsts = [g.first_ts for g in groups if g.first_ts is not None]
    lasts = [g.last_ts for g in groups if g.last_ts is not None]
    return Summary(
        store=store.path,
        calls=sum(e.calls for e in entries),
        errors=sum(e.errors for e in entries),
        signatures=sum(e.signatures for e in entries),
        first_ts=_iso(min(firsts)) if firsts else None,
        last_ts=_iso(max(lasts)) if lasts else None,
        skipped_files=tuple(s.path for s in store.skipped),
        models=entries,
    )


def drift_rows(model_summary: ModelSummary) -> list[dict[str, Any]]:
    """One flat table row per variant of every drifting input of a model.

    Returns:
        Rows with ``path, changes, kind, dtype, rank, calls, groups`` (lists joined with
        ``", "``), as `capture summary` and `capture report` show them.
    """
    return [
        {
            "path": d.path,
            "changes": ", ".join(d.changes),
            "kind": v.kind,
            "dtype": v.dtype,
            "rank": v.rank,
            "calls": v.calls,
            "groups": ", ".join(v.groups),
        }
        for d in model_summary.drift
        for v in d.variants
    ]


def blocked_rows(groups: Iterable[GroupSummary]) -> list[dict[str, Any]]:
    """One table row per group that a recorded class keeps from export, in order.

    Returns:
        Rows with ``group, calls, reason``; empty when every group can be rebuilt.
    """
    return [{"group": g.name, "calls": g.calls, "reason": g.blocked} for g in groups if g.blocked]


def state_rows(groups: Iterable[GroupSummary]) -> list[dict[str, Any]]:
    """One row per state the groups' calls ran under (``state``, ``calls``, ``groups``), most
    calls first; empty when they ran under one state (`capture.state`)."""
    from capture.state import state_label

    calls: dict[str, int] = {}
    count: dict[str, int] = {}
    for g in groups:
        calls[g.state] = calls.get(g.state, 0) + g.calls
        count[g.state] = count.get(g.state, 0) + 1
    if len(calls) < 2:
        return []
    order = sorted(calls, key=lambda s: (-calls[s], s))
    return [{"state": state_label(s or None), "calls": calls[s], "groups": count[s]} for s in order]


def group_table_rows(groups: Iterable[GroupSummary]) -> list[dict[str, Any]]:
    """One flat table row per call group, in the order given (`capture summary`, the report)."""
    return [
        {
            "group": g.name,
            "calls": g.calls,
            "share": f"{100 * g.share:.1f}%",
            "signatures": g.signatures,
            "raised": g.errors,
            "inputs": ", ".join(g.inputs),
            "absent": ", ".join(g.absent),
        }
        for g in groups
    ]
