"""Dims -> dynamic_shapes: per-axis specs, the structure torch.export expects, and call forms.

This module does not import torch (``capture dims --python`` goes through it via
`replay.inputs.source`): it describes dynamic shapes with `AxisSpec` values, and `materialize` (the
only function that imports torch) turns them into `torch.export.Dim` objects.

What it decides, for one call group (`capture.analysis.groups.Group`):

- **Axis specs** (`axis_specs`): a dynamic axis is ``Dim.DYNAMIC`` by default. With
  ``named_dims=True`` it is a named ``Dim(symbol, min=..., max=...)``, one object per symbol so that
  equal dims share it; a derived symbol (``attention_mask_1 = past_key_values_2 + 1``) becomes
  Dim arithmetic on its root (``past_key_values_2 + 1``). torch.export only derives a Dim from
  *one* root (``a * k + c``), so a relation over two symbols (``c = a + b``) is left to
  ``Dim.DYNAMIC`` on ``c``, and torch.export finds it while tracing (a note says so).
- **Ranges**: observed min/max over the group's calls. An observed min of 0 or 1 is kept:
  torch.export accepts it as a *range* (it only refuses 0 or 1 as the *example* size, which
  `replay.inputs.select` avoids), and the program then accepts batch 1 or sequence 1 at run time.
  The max is widened to the representative example when that one was synthesized above it, and
  left unbounded for a forced batch dim that never varied (``set_batch_dimension_for``: there
  is no range to report).
- **Structure** (`spec_tree`): the pytree of the recorded ``(args, kwargs)``, read from the
  stored treespec JSON, with each tensor leaf replaced by its ``{axis: spec}`` dict (None when
  nothing is dynamic) and every non-tensor leaf by None. Builtin containers keep their type; a
  registered class (a transformers cache) becomes the flat list of its children, the form
  torch.export matches against (a DynamicCache of L layers: ``[k_0..k_{L-1}, v_0..v_{L-1}]``).
- **Call form** (`replay.runtime.callform`): positional arguments stay positional unless
  ``keyword_only``; `dynamic_shapes` is a tuple when the program takes positional arguments only,
  else a dict keyed by parameter name (positional ones included, as torch.export binds them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from capture.errors import ReplayError
from capture.pytree.recorded_structure import RecordedLeaf, as_leaves
from capture.pytree.treespec import Node, UnsafeTreespec
from capture.pytree.treespec import parse as parse_treespec

if TYPE_CHECKING:
    from capture.analysis.groups import Group

__all__ = [
    "AxisSpec",
    "SymbolRange",
    "GroupSpecs",
    "axis_specs",
    "spec_tree",
    "leaf_specs",
    "materialize",
    "bounds_of",
    "describe_sizes",
]

_SEQUENCES = ("builtins.tuple", "builtins.list", "collections.deque", "collections.namedtuple")
_MAPPINGS = ("builtins.dict", "collections.OrderedDict")


@dataclass(frozen=True)
class AxisSpec:
    """The dynamic spec of one axis.

    ``symbol=None``: ``Dim.DYNAMIC``. Otherwise a named Dim; when ``root`` is set it is derived:
    ``root * coef + offset``.
    """

    symbol: str | None = None
    root: str | None = None
    coef: int = 1
    offset: int = 0


@dataclass(frozen=True)
class SymbolRange:
    """The range given to a named Dim (``max=None``: unbounded)."""

    name: str
    min: int
    max: int | None


@dataclass
class GroupSpecs:
    """Per tensor leaf (structure leaf index) its ``{axis: AxisSpec}``, plus named symbols."""

    by_leaf: dict[int, dict[int, AxisSpec]]
    symbols: dict[str, SymbolRange]
    notes: list[str] = field(default_factory=list)


def _root_of(terms: Sequence[str]) -> tuple[str, int] | None:
    """(root, coefficient) when every term is the same symbol, else None."""
    if not terms or len(set(terms)) != 1:
        return None
    return terms[0], len(terms)


def axis_specs(
    group: Group, *, named_dims: bool = False, example: dict[str, int] | None = None
) -> GroupSpecs:
    """The per-axis dynamic specs of a group's tensor leaves.

    Args:
        group: A call group from `capture.analysis.groups.analyze`.
        named_dims: Named ``Dim`` objects with observed ranges, shared per symbol and derived
            for relations; False: ``Dim.DYNAMIC`` on every dynamic axis.
        example: Symbol -> size of the representative example; ranges are widened to hold it.

    Returns:
        A `GroupSpecs`.

    Example:
        >>> specs = axis_specs(group, named_dims=True)  # doctest: +SKIP
        >>> specs.by_leaf[0]  # doctest: +SKIP
        {0: AxisSpec(symbol='batch'), 1: AxisSpec(symbol='x_1')}
    """
    example = example or {}
    relations = {r.symbol: r for r in group.relations}
    by_leaf: dict[int, dict[int, AxisSpec]] = {}
    lows: dict[str, int] = {}
    highs: dict[str, int] = {}
    varies: dict[str, bool] = {}
    notes: list[str] = []
    noted: set[str] = set()
    for d in group.dims:
        if not d.dynamic:
            continue
        spec = AxisSpec()
        if named_dims and d.symbol is not None:
            relation = relations.get(d.symbol)
            if relation is None:
                spec = AxisSpec(d.symbol)
                lows[d.symbol] = min(lows.get(d.symbol, d.min), d.min)
                highs[d.symbol] = max(highs.get(d.symbol, d.max), d.max)
                varies[d.symbol] = varies.get(d.symbol, False) or d.distinct > 1
            else:
                root = _root_of(relation.terms)
                if root is not None:
                    spec = AxisSpec(d.symbol, root[0], root[1], relation.offset)
                elif d.symbol not in noted:
                    noted.add(d.symbol)
                    notes.append(
                        f"{d.symbol} = {relation.expr} (recorded relation) is left to "
                        "Dim.DYNAMIC: torch.export derives a Dim from one root only"
                    )
        by_leaf.setdefault(d.leaf, {})[d.axis] = spec
    symbols = {}
    for name in lows:
        low, high = lows[name], highs[name]
        if name in example:
            low, high = min(low, example[name]), max(high, example[name])
        symbols[name] = SymbolRange(name, low, high if varies[name] else None)
    # A derived symbol's root must exist as a Dim even when no axis uses it directly.
    for specs in by_leaf.values():
        for spec in specs.values():
            if spec.root is not None and spec.root not in symbols:
                symbols[spec.root] = SymbolRange(spec.root, 0, None)
    return GroupSpecs(by_leaf, symbols, notes)


# -- the structure of (args, kwargs) -------------------------------------------------------------
def _build(node: Node, leaves: Iterator[Any]) -> Any:
    kind = node.type
    if kind is None:
        return next(leaves)
    children = [_build(child, leaves) for child in node.children]
    if kind in _SEQUENCES:
        return tuple(children) if kind != "builtins.list" else children
    if kind in _MAPPINGS:
        return dict(zip(node.context, children, strict=True))
    if kind == "collections.defaultdict":  # context: (factory name, keys)
        return dict(zip(node.context[1], children, strict=True))
    # A registered class (a cache): torch.export matches its flattened children, as a list.
    return children


def spec_tree(
    treespec: str | Node | None, leaves: Sequence[Any]
) -> tuple[list[Any], dict[str, Any]]:
    """Builds the ``(args, kwargs)`` structure of a recorded treespec with `leaves` at its leaves.

    Args:
        treespec: The stored JSON treespec (``torch.utils._pytree.treespec_dumps`` format) of
            ``(args, kwargs)``, or it already parsed
            (`capture.pytree.recorded_structure.RecordedStructure.tree`).
        leaves: One value per treespec leaf, in order (missing arguments have none).

    Returns:
        ``(args, kwargs)``: a list of positional entries and a dict of keyword entries.

    Raises:
        ReplayError: No treespec, or it does not describe ``(args, kwargs)`` with
            ``len(leaves)`` leaves.

    Example:
        >>> import json
        >>> spec = json.dumps([1, {"type": "builtins.tuple", "context": "null", "children_spec": [
        ...     {"type": "builtins.tuple", "context": "null", "children_spec": [
        ...         {"type": None, "context": None, "children_spec": []}]},
        ...     {"type": "builtins.dict", "context": "[]", "children_spec": []}]}])
        >>> spec_tree(spec, [{0: "batch"}])
        ([{0: 'batch'}], {})
    """
    if not treespec:
        raise ReplayError(
            "the recorded structure has no treespec (a node type that torch's pytree cannot "
            "serialize); it cannot be rebuilt"
        )
    if isinstance(treespec, Node):
        root = treespec
    else:
        try:  # our own parser: nothing a store names is imported
            root = parse_treespec(treespec, "the store's structures")
        except UnsafeTreespec as e:
            raise ReplayError(str(e)) from None
    top = root.children
    if root.type != "builtins.tuple" or len(top) != 2:
        raise ReplayError("the recorded treespec does not describe (args, kwargs)")
    if root.num_leaves != len(leaves):
        raise ReplayError(
            f"the recorded treespec has {root.num_leaves} leaves, the structure rows {len(leaves)}"
        )
    it = iter(leaves)
    args = _build(top[0], it)
    kwargs = _build(top[1], it)
    if next(it, _END) is not _END:
        raise ReplayError("the recorded treespec has fewer leaves than the structure rows")
    return list(args), dict(kwargs)


class _End:
    pass


_END = _End()


def leaf_specs(
    leaves: Sequence[RecordedLeaf | Mapping[str, Any]], by_leaf: Mapping[int, Mapping[int, Any]]
) -> list[Any]:
    """One value per treespec leaf: the tensor's ``{axis: spec}`` (None when static), else None.

    Missing arguments are not treespec leaves and are skipped.
    """
    out = []
    for leaf in as_leaves(leaves):
        if leaf.is_missing:
            continue
        specs = by_leaf.get(leaf.leaf) if leaf.is_tensor else None
        out.append(dict(sorted(specs.items())) if specs else None)
    return out


def bounds_of(specs: GroupSpecs, spec: AxisSpec, floor: int = 0) -> tuple[int, int | None]:
    """(min, max) of a named axis: its symbol's range, or its root's through the relation.

    `floor` raises the min (2: the smallest size torch.export keeps dynamic).
    """
    symbol = specs.symbols[spec.root or str(spec.symbol)]
    low, high = symbol.min, symbol.max
    if spec.root is not None:
        low = low * spec.coef + spec.offset
        high = high * spec.coef + spec.offset if high is not None else None
    low = max(low, floor)
    return (min(low, high), high) if high is not None else (low, None)


def materialize(
    specs: GroupSpecs, hinted: Iterable[str] = (), floor: int = 0, auto: bool = False
) -> dict[int, dict[int, Any]]:
    """Turns `AxisSpec` values into torch.export ``Dim`` objects, one object per symbol.

    Args:
        specs: The group's axis specs.
        hinted: Symbols given as bounded hints, ``Dim.DYNAMIC(min=, max=)`` with the recorded
            range, instead of named Dims (with the axes derived from them): torch.export turns
            a guard it cannot prove over a hint's range into a runtime check, where a named
            Dim is rejected (``Constraints violated``). The program stays bounded.
        floor: Raise the min of the hinted axes to this (2: torch specializes 0 and 1).
        auto: ``Dim.AUTO`` on every dynamic axis, whatever the specs say: torch.export then
            narrows or pins a dim where the traced code needs it instead of rejecting the
            export, and the program's guards say where (`replay.pipeline.splitting` reads them).

    Returns:
        Structure leaf index -> ``{axis: Dim | Dim.DYNAMIC | Dim.DYNAMIC(min=, max=)}``.
    """
    from torch.export import Dim

    if auto:
        return {leaf: dict.fromkeys(axes, Dim.AUTO) for leaf, axes in specs.by_leaf.items()}

    hints = set(hinted)
    dims: dict[str, Any] = {
        s.name: Dim(s.name, min=s.min, max=s.max) if s.max is not None else Dim(s.name, min=s.min)
        for s in specs.symbols.values()
        if s.name not in hints
    }
    out: dict[int, dict[int, Any]] = {}
    for leaf, axes in specs.by_leaf.items():
        converted: dict[int, Any] = {}
        for axis, spec in axes.items():
            if spec.symbol is None:
                converted[axis] = Dim.DYNAMIC
            elif (spec.root or spec.symbol) in hints:
                low, high = bounds_of(specs, spec, floor)
                converted[axis] = Dim.DYNAMIC(min=low, max=high)
            elif spec.root is None:
                converted[axis] = dims[spec.symbol]
            else:
                root = dims[spec.root]
                value = root * spec.coef if spec.coef != 1 else root
                converted[axis] = value + spec.offset if spec.offset else value
        out[leaf] = converted
    return out


def describe_sizes(leaves: Sequence[RecordedLeaf | Mapping[str, Any]], sizes: Sequence[int]) -> str:
    """A compact text of a size vector: ``input_ids=2x1 past_key_values=[2x2x8x16]*4``.

    Tensors of one argument are listed together; equal shapes are counted, not repeated.

    Example:
        >>> rows = [{"leaf": 0, "kind": "tensor", "argument": "x", "path": "args[0]",
        ...          "dim_offset": 0, "rank": 2}]
        >>> describe_sizes(rows, [2, 6])
        'x=2x6'
    """
    by_argument: dict[str, list[str]] = {}
    for leaf in as_leaves(leaves):
        if not leaf.is_tensor:
            continue
        offset, rank = int(leaf.dim_offset or 0), leaf.ndim
        shape = "x".join(str(s) for s in sizes[offset : offset + rank]) or "scalar"
        by_argument.setdefault(str(leaf.argument or leaf.path), []).append(shape)
    parts = []
    for argument, shapes_ in by_argument.items():
        if len(shapes_) == 1:
            parts.append(f"{argument}={shapes_[0]}")
        elif len(set(shapes_)) == 1:
            parts.append(f"{argument}=[{shapes_[0]}]*{len(shapes_)}")
        else:
            parts.append(f"{argument}=[{','.join(shapes_)}]")
    return " ".join(parts)
