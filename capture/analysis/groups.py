"""Call groups, dynamic dims, shared symbols and relations, read from a store's signatures.

This is the analysis layer behind `Store.dims()`, `Store.summary()` and `replay`. It reads a
store through its data-access object (`capture.store.reader.StoreReader`), which never imports it:

- a **call group** is the set of calls sharing one input structure (prefill vs decode, with or
  without an optional input); `analyze()` returns one `Group` per structure, largest first;
- for every tensor leaf and axis of a group, a `DimInfo`: dynamic or static, observed min, max,
  number of distinct values, and the **symbol** shared by the dynamic dims that are equal in
  every call; derived dims carry an **expr** over other symbols (``past_key_values_2 + 1``) and
  the group lists them as `Relation` objects. `capture.analysis.symbols` documents how relations
  are found and the rule that keeps spurious ones out (``min_support``).

It reads the ``signatures`` view (the stats rows merged: one row per distinct signature,
with its call count) and the ``structures`` view, never the raw calls, so the cost depends on the
number of distinct signatures (thousands), not on the number of calls (millions). It imports
duckdb through `capture.store.reader`, numpy and pyarrow, never torch.

Groups are per state too: calls that ran under two states (`capture.state`) are never one group.
How groups are named: `capture.analysis.group_names`.

An argument a library renamed (`capture.renames`: ``past_key_values`` -> ``cache`` in
transformers 5.24) is one argument here: structures that differ only by its spelling (a store
recorded across an upgrade) are one group, read through the structure recorded most recently
(its names, its symbols: the spelling the serving library passes now); `Group.structure_ids`
lists every recorded structure of the group.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from capture.analysis.group_names import group_names
from capture.analysis.symbols import MIN_SUPPORT, Axis, Relation, find_symbols, format_expr
from capture.errors import CorruptStoreFile
from capture.pytree.recorded_structure import RecordedLeaf, RecordedStructure
from capture.renames import RENAMED, spelling_key
from capture.schema import STATE
from capture.state import DEFAULT
from capture.store import stats_merge
from capture.untrusted import printable

if TYPE_CHECKING:
    from capture.store.reader import StoreReader

__all__ = [
    "DimInfo",
    "Relation",
    "Group",
    "BatchSpec",
    "MIN_SUPPORT",
    "DIMS_SCHEMA",
    "analyze",
    "dims_table",
    "format_expr",
]

logger = logging.getLogger(__name__)

BatchSpec = bool | Iterable[str | int] | None
"""``set_batch_dimension_for``: None, True (every input tensor), or argument names/positions."""


@dataclass(frozen=True)
class DimInfo:
    """One axis of one tensor leaf, within one call group.

    Attributes:
        leaf: Leaf index in the group's structure (``structures.leaf``).
        path: Pytree key path of the leaf, e.g. ``kwargs['past_key_values'].key_cache[0]``.
        argument: Top-level parameter name (``past_key_values``, ``x``).
        axis: The axis.
        dynamic: Takes more than one value among the group's calls, or is a forced batch dim.
        min: Smallest observed size.
        max: Largest observed size.
        distinct: Number of distinct observed sizes.
        calls: Calls of the group where this leaf is a tensor.
        symbol: Shared by the dynamic dims equal in every call; None when static.
        expr: For a derived dim, its expression over other symbols (``past + 1``); else None.
    """

    leaf: int
    path: str
    argument: str | None
    axis: int
    dynamic: bool
    min: int
    max: int
    distinct: int
    calls: int
    symbol: str | None
    expr: str | None


@dataclass(frozen=True)
class Group:
    """A call group: the calls sharing one input structure.

    Attributes:
        model_name: The model's name in the store.
        name: Stable, readable name (``decode``, ``prefill``, ``g0``), unique within the model.
        structure_id: The ``calls.in_structure`` of the group.
        calls: Recorded calls in the group.
        signatures: Distinct size vectors in the group.
        structure: The group's input structure, typed and read once from its ``structures`` rows
            (`capture.pytree.recorded_structure`).
        dims: Every tensor leaf x axis, leaf order then axis order.
        relations: Derived symbols, true in every call of the group.
        errors: Calls of the group whose forward raised.
        structure_ids: Every recorded input structure of the group, `structure_id` first: more
            than one when calls spelled a renamed argument both ways (`capture.renames`).
        first_ts: First recorded call of the group.
        last_ts: Last recorded call of the group.
        state: The state key its calls ran under (`capture.state`; ``""``: the default state).
            Calls of two states are never one group.
    """

    model_name: str
    name: str
    structure_id: str
    calls: int
    signatures: int
    structure: RecordedStructure = field(repr=False)
    dims: list[DimInfo]
    relations: list[Relation]
    errors: int = 0
    first_ts: datetime | None = None
    last_ts: datetime | None = None
    matrix: np.ndarray[Any, np.dtype[np.int64]] | None = field(
        default=None, repr=False, compare=False
    )
    """Distinct signatures of the group (rows) x dims (columns, the order of `dims`)."""
    weights: np.ndarray[Any, np.dtype[np.int64]] | None = field(
        default=None, repr=False, compare=False
    )
    """Calls per row of `matrix`."""
    structure_ids: tuple[str, ...] = field(default=(), kw_only=True)
    state: str = field(default=DEFAULT, kw_only=True)

    def __post_init__(self) -> None:
        if not self.structure_ids:
            object.__setattr__(self, "structure_ids", (self.structure_id,))


DIMS_SCHEMA = pa.schema(
    [
        pa.field("model", pa.string()),
        pa.field("group", pa.string()),
        pa.field("structure_id", pa.string()),
        pa.field("leaf", pa.int32()),
        pa.field("path", pa.string()),
        pa.field("argument", pa.string()),
        pa.field("axis", pa.int32()),
        pa.field("dynamic", pa.bool_()),
        pa.field("min", pa.int64()),
        pa.field("max", pa.int64()),
        pa.field("distinct", pa.int64()),
        pa.field("calls", pa.int64()),
        pa.field("symbol", pa.string()),
        pa.field("expr", pa.string()),
    ]
)
"""Columns of `dims_table()` / `Store.dims()`."""

# Signatures that differ only in their outputs merge here, by the stats rule.
# A call's state (null: the default state) is part of its group's key.
_GROUP_MERGE = stats_merge.select(
    ("model", f"coalesce({STATE}, '') AS {STATE}", "in_structure", "dims"),
    ("calls", "errors", "first_ts", "last_ts"),
)
_SIGNATURES_SQL = f"""
SELECT {_GROUP_MERGE}
FROM signatures
WHERE model IN (SELECT unnest($models))
GROUP BY ALL
ORDER BY model, {STATE}, in_structure
"""

_STRUCTURES_SQL = """
SELECT * FROM structures
WHERE model IN (SELECT unnest($models))
  AND structure_id IN (SELECT in_structure FROM stats WHERE model IN (SELECT unnest($models)))
ORDER BY model, structure_id, leaf
"""


def _batch_matcher(spec: BatchSpec, structure: RecordedStructure) -> set[int]:
    """Leaf indices whose axis 0 is forced dynamic."""
    if spec is None or spec is False:
        return set()
    tensors = [leaf for leaf in structure.tensors if leaf.ndim > 0]
    if spec is True:
        return {leaf.leaf for leaf in tensors}
    wanted = list(spec)
    names = {w for w in wanted if isinstance(w, str)}
    positions = {w for w in wanted if isinstance(w, int) and not isinstance(w, bool)}
    names |= {name for name, i in structure.params.index.items() if i in positions}
    return {
        leaf.leaf
        for leaf in tensors
        if leaf.argument in names or (leaf.position is not None and leaf.position in positions)
    }


def _group(
    model_name: str,
    structure_id: str,
    structure: RecordedStructure,
    matrix: np.ndarray[Any, np.dtype[np.int64]],
    weights: np.ndarray[Any, np.dtype[np.int64]],
    set_batch_dimension_for: BatchSpec,
    min_support: int,
) -> Group:
    axes: list[Axis] = []
    leaf_of: list[RecordedLeaf] = []
    columns: list[int] = []
    for r in structure.tensors:
        for axis in range(r.ndim):
            axes.append(Axis(r.argument, axis, r.path))
            leaf_of.append(r)
            columns.append(int(r.dim_offset or 0) + axis)
    if columns and max(columns) >= matrix.shape[1]:
        raise CorruptStoreFile(
            f"the structures rows of {structure_id!r} (model {model_name!r}) place a tensor's "
            f"sizes at position {max(columns)} of its calls' dims, which hold {matrix.shape[1]}: "
            "the store's structures and calls files disagree; restore them from a copy"
        )
    forced_leaves = _batch_matcher(set_batch_dimension_for, structure)
    forced = [ax.axis == 0 and r.leaf in forced_leaves for ax, r in zip(axes, leaf_of, strict=True)]
    sub = matrix[:, columns] if columns else np.zeros((matrix.shape[0], 0), np.int64)
    calls = int(weights.sum())
    found = find_symbols(sub, axes, forced, min_support)
    dims = [
        DimInfo(
            leaf=r.leaf,
            path=r.path,
            argument=r.argument,
            axis=ax.axis,
            dynamic=found.dynamic[j],
            min=found.minimum[j],
            max=found.maximum[j],
            distinct=found.distinct[j],
            calls=calls,
            symbol=found.symbol[j],
            expr=found.expr[j],
        )
        for j, (ax, r) in enumerate(zip(axes, leaf_of, strict=True))
    ]
    return Group(
        model_name=model_name,
        name="",
        structure_id=structure_id,
        calls=calls,
        signatures=int(matrix.shape[0]),
        structure=structure,
        dims=dims,
        relations=found.relations,
        matrix=sub,
        weights=weights,
    )


def analyze(
    store: StoreReader,
    model_name: str | None = None,
    *,
    set_batch_dimension_for: BatchSpec = None,
    min_support: int = MIN_SUPPORT,
) -> list[Group]:
    """The call groups of one model (or of every model), with their dims and relations.

    Args:
        store: An open store (`capture.open_store`).
        model_name: A model name, or None for every model.
        set_batch_dimension_for: None, True (axis 0 of every input tensor), or argument names
            and/or positions: axis 0 of those leaves is dynamic even when it never varied.
        min_support: Refuting chances a relation must survive to be reported; see
            `capture.analysis.symbols` (default 3).

    Returns:
        Groups sorted by model, then by calls (largest first), first call, structure id.

    Raises:
        UnknownModel: `model_name` is not in the store.

    Example:
        >>> groups = analyze(open_store("capture-store"), "LlamaForCausalLM")  # doctest: +SKIP
        >>> [(g.name, g.calls) for g in groups]  # doctest: +SKIP
        [('decode', 9), ('decode_no_attention_mask', 6), ('prefill', 3), ...]
    """
    model_names = store.check_model(model_name)
    params = {"models": model_names}
    sigs = store.query(_SIGNATURES_SQL, params)
    structures = store.query(_STRUCTURES_SQL, params).to_pylist()
    leaves_of: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in structures:
        leaves_of.setdefault((row["model"], row["structure_id"]), []).append(row)

    groups: list[Group] = []
    sigs, members = _one_spelling(sigs, leaves_of)
    if sigs.num_rows:
        sig_models = sigs.column("model").to_pylist()
        sig_structures = sigs.column("in_structure").to_pylist()
        sig_states = sigs.column(STATE).to_pylist()
        keys = list(zip(sig_models, sig_structures, sig_states, strict=True))
        dims_col = sigs.column("dims").combine_chunks()
        offsets = dims_col.offsets.to_numpy()
        values = dims_col.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        calls = sigs.column("calls").to_numpy()
        errors = sigs.column("errors").to_numpy()
        first_ts = sigs.column("first_ts").to_pylist()
        last_ts = sigs.column("last_ts").to_pylist()
        # One group per run of rows of one (model, structure, state): the rows are sorted so.
        bounds = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
        for start, stop in zip([0, *bounds], [*bounds, len(keys)], strict=True):
            model_name, structure_id, state = keys[start]
            key = (model_name, structure_id)
            group = _build(
                key,
                leaves_of.get(key),
                offsets,
                values,
                calls,
                start,
                stop,
                set_batch_dimension_for,
                min_support,
            )
            if group is not None:
                group = dataclasses.replace(
                    group,
                    structure_ids=members.get(key, (key[1],)),
                    errors=int(errors[start:stop].sum()),
                    first_ts=min((t for t in first_ts[start:stop] if t), default=None),
                    last_ts=max((t for t in last_ts[start:stop] if t), default=None),
                    state=state,
                )
                groups.append(group)
    return _named(groups, model_names)


def _named(groups: list[Group], model_names: list[str]) -> list[Group]:
    """The groups by model, largest first, each with its name (`group_names`)."""
    out: list[Group] = []
    for m in model_names:
        mine = [g for g in groups if g.model_name == m]
        mine.sort(key=lambda g: (-g.calls, _timestamp(g.first_ts), g.structure_id, g.state))
        names = group_names(mine)
        out.extend(dataclasses.replace(g, name=n) for g, n in zip(mine, names, strict=True))
    return out


def _one_spelling(
    sigs: pa.Table, leaves_of: dict[tuple[str, str], list[dict[str, Any]]]
) -> tuple[pa.Table, dict[tuple[str, str], tuple[str, ...]]]:
    """The signature rows with the structures that differ only by a renamed argument's spelling
    under one id: the one whose calls were recorded last (its spelling is the serving
    library's). Returns the rows, sorted by (model, state, structure), and, per merged
    structure, every structure it stands for (itself first)."""
    names = set(RENAMED) | set(RENAMED.values())
    spelled: dict[tuple[str, tuple[Any, ...]], list[tuple[str, str]]] = {}
    for key, rows in leaves_of.items():
        if any(r.get("argument") in names for r in rows):
            spelled.setdefault((key[0], spelling_key(rows)), []).append(key)
    merged = [keys for keys in spelled.values() if len(keys) > 1]
    if not merged or not sigs.num_rows:
        return sigs, {}
    model_names = sigs.column("model").to_pylist()
    structures = sigs.column("in_structure").to_pylist()
    last = sigs.column("last_ts").to_pylist()
    latest: dict[tuple[str, str], float] = {}
    for m, st, ts in zip(model_names, structures, last, strict=True):
        t = ts.timestamp() if ts is not None else -float("inf")
        latest[(m, st)] = max(latest.get((m, st), -float("inf")), t)
    stands_for: dict[tuple[str, str], str] = {}
    members: dict[tuple[str, str], tuple[str, ...]] = {}
    for keys in merged:
        ordered = sorted(keys, key=lambda k: (-latest.get(k, -float("inf")), k[1]))
        head = ordered[0]
        members[head] = tuple(k[1] for k in ordered)
        for k in ordered:
            stands_for[k] = head[1]
    target = [stands_for.get((m, st), st) for m, st in zip(model_names, structures, strict=True)]
    states = sigs.column(STATE).to_pylist()
    order = sorted(range(len(target)), key=lambda i: (model_names[i], states[i], target[i], i))
    out = sigs.take(pa.array(order, pa.int64()))
    column = out.schema.get_field_index("in_structure")
    out = out.set_column(column, "in_structure", pa.array([target[i] for i in order], pa.string()))
    return out, members


def _timestamp(ts: datetime | None) -> float:
    return ts.timestamp() if ts is not None else float("inf")


def _build(
    key: tuple[str, str],
    leaves: list[dict[str, Any]] | None,
    offsets: np.ndarray[Any, Any],
    values: np.ndarray[Any, Any],
    calls: np.ndarray[Any, Any],
    start: int,
    stop: int,
    set_batch_dimension_for: BatchSpec,
    min_support: int,
) -> Group | None:
    """One group from rows ``start:stop`` of the merged signatures (all of one structure)."""
    model_name, structure_id = key
    if leaves is None:
        logger.warning(
            "capture: %d calls of model %s use structure %s, which no readable structures file "
            "describes; they are left out of the analysis",
            int(calls[start:stop].sum()),
            printable(model_name),
            printable(structure_id),
        )
        return None
    # The one reading of the structure's rows: analysis and replay use it from here on.
    structure = RecordedStructure.from_rows(leaves)
    width = structure.width
    lengths = np.diff(offsets[start : stop + 1])
    keep = np.flatnonzero(lengths == width)
    if keep.size < stop - start:
        logger.warning(
            "capture: %d signatures of model %s, structure %s do not have the %d sizes their "
            "structure describes; they are left out of the analysis",
            stop - start - keep.size,
            printable(model_name),
            printable(structure_id),
            width,
        )
    if keep.size == 0:
        return None
    rows = start + keep
    index = offsets[rows][:, None] + np.arange(width)[None, :]
    matrix = values[index] if width else np.zeros((rows.size, 0), np.int64)
    weights = calls[rows].astype(np.int64)
    if width and rows.size > 1:
        # One size vector recorded under two spellings of a renamed argument: one signature.
        _, first, inverse = np.unique(matrix, axis=0, return_index=True, return_inverse=True)
        if first.size < rows.size:
            order = np.sort(first)
            summed = np.bincount(inverse.ravel(), weights=weights, minlength=first.size)
            position = np.empty(first.size, np.int64)
            position[np.argsort(first)] = np.arange(first.size)
            merged = np.zeros(first.size, np.int64)
            merged[position] = summed.astype(np.int64)
            matrix, weights = matrix[order], merged
    return _group(
        model_name, structure_id, structure, matrix, weights, set_batch_dimension_for, min_support
    )


def dims_table(store: StoreReader, model_name: str | None = None, **options: Any) -> pa.Table:
    """One row per model, call group, tensor leaf and axis (`Store.dims()`).

    Args:
        store: An open store.
        model_name: A model name, or None for every model.
        **options: Passed to `analyze` (``set_batch_dimension_for``, ``min_support``).

    Returns:
        A `pyarrow.Table` with the columns of `DIMS_SCHEMA`: model, group, structure_id, leaf,
        path, argument, axis, dynamic, min, max, distinct, calls, symbol, expr.

    Raises:
        UnknownModel: `model_name` is not in the store.

    Example:
        >>> dims_table(open_store("capture-store"), "add").column("symbol")  # doctest: +SKIP
    """
    rows: dict[str, list[Any]] = {f.name: [] for f in DIMS_SCHEMA}
    for g in analyze(store, model_name, **options):
        for d in g.dims:
            rows["model"].append(g.model_name)
            rows["group"].append(g.name)
            rows["structure_id"].append(g.structure_id)
            for name in ("leaf", "path", "argument", "axis", "dynamic", "min", "max"):
                rows[name].append(getattr(d, name))
            for name in ("distinct", "calls", "symbol", "expr"):
                rows[name].append(getattr(d, name))
    return pa.table(rows, schema=DIMS_SCHEMA)
