"""export_inputs(): from a store to torch.export arguments and dynamic_shapes, per call group.

One `ExportGroup` per call group (`capture.analysis.analyze`: calls sharing one input structure,
such as prefill and decode), largest first. Each holds example ``args``/``kwargs`` rebuilt from
the recorded metadata (`replay.select` picks sizes with every dynamic dim >= 2, `replay.rebuild`
makes the tensors) and the matching ``dynamic_shapes`` (`replay.shapes`), ready for::

    group = inputs.groups[0]
    torch.export.export(group.module(model), group.args, group.kwargs,
                        dynamic_shapes=group.dynamic_shapes)

How arguments that are not plain tensors are handled (each group's ``notes`` says which applied):

- **Scalars** (``use_cache=True``, ``logits_to_keep=1``): passed as the recorded constants; they
  are part of the group's structure, so every call of the group had these values. torch.export
  specializes them and the program accepts only these values.
- **Entries of ``**kwargs``** (``return_dict`` in transformers models): torch.export 2.13 cannot
  match ``dynamic_shapes`` to them, so `ExportGroup.module` wraps the model in a module whose
  forward names every entry of the group explicitly and calls the model as recorded.
- **None leaves** (an explicit None, the empty layers of a prefill DynamicCache): passed as None.
- **Missing optionals** (not passed by the group's calls): left out, so the program runs the
  model's default, unless ``fill_missing=True``: then every tensor argument that some group of the
  model passes is given to every program, as ``value_if_missing[name]`` or an empty tensor (batch
  0) of its recorded dtype and shape, static in ``dynamic_shapes`` (torch.export cannot keep a
  dim of size 0 dynamic). That reproduces the seeds' single-signature form; the coverage check of
  `replay.export` tells whether the model really ignores the empty tensor (a multiplicative mask
  does not).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from capture import nodes, schema
from capture.errors import ReplayError
from replay import rebuild as rb
from replay import select, shapes

if TYPE_CHECKING:
    from capture.analysis import DimInfo, Group, Relation
    from capture.store import Store

__all__ = ["ExportGroup", "ExportInputs", "export_inputs", "resolve_model", "build_group"]


@dataclass
class ExportGroup:
    """Export arguments and dynamic shapes of one call group.

    Attributes:
        name: The group's name (``decode``, ``prefill``, ``g0``).
        model: The model name in the store.
        structure_id: The input structure shared by the group's calls.
        calls: Recorded calls the group stands for.
        signatures: Distinct recorded size vectors in the group.
        args: Example positional arguments.
        kwargs: Example keyword arguments.
        dynamic_shapes: The matching ``dynamic_shapes`` for torch.export.
        notes: How the example and the arguments were chosen (module docstring).
        dims: The analysis' per-axis dims of the group.
        relations: The analysis' relations of the group.
        example: The sizes the example was built from.
        form: How the program is called (positional, keywords, ``**kwargs`` entries).
        analysis: The `capture.analysis.Group` it was built from.
    """

    name: str
    model: str
    structure_id: str
    calls: int
    signatures: int
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dynamic_shapes: Any
    notes: list[str]
    dims: list[DimInfo]
    relations: list[Relation]
    example: select.Representative
    form: shapes.CallForm
    analysis: Group | None = field(repr=False, default=None)
    leaves: list[dict[str, Any]] = field(repr=False, default_factory=list)
    added: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)
    ranges: dict[tuple[int, ...], select.Ranges] = field(repr=False, default_factory=dict)
    seed: int = rb.DEFAULT_SEED
    device: str | None = None

    def module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to export: `model`, or a wrapper naming its ``**kwargs`` entries.

        Example:
            >>> ep = torch.export.export(group.module(model), group.args, group.kwargs,
            ...                          dynamic_shapes=group.dynamic_shapes)  # doctest: +SKIP
        """
        if not self.form.extra:
            return model
        return _named_call(model, self.form)

    def recorded(self) -> list[tuple[tuple[int, ...], int]]:
        """The distinct recorded size vectors of the group with their calls, most calls first."""
        if self.analysis is None:
            raise ReplayError(f"group {self.name} was not built from an analysis")
        return select.signatures(self.analysis)

    def recorded_call(self, sizes: Iterable[int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Fresh ``(args, kwargs)`` of one recorded signature, as the recorded calls passed them.

        A size vector that was never recorded (a probe) takes the integer value ranges of the
        closest recorded signature (`replay.select.nearest_ranges`).
        """
        sizes = tuple(int(s) for s in sizes)
        return rb.rebuild(
            self.leaves,
            self.leaves[0].get("treespec") if self.leaves else None,
            sizes,
            select.nearest_ranges(self.ranges, sizes),
            seed=self.seed,
            device=self.device,
        )

    def program_call(self, sizes: Iterable[int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Fresh ``(args, kwargs)`` of one signature (recorded or probe), in the program's call
        form."""
        args, kwargs = self.recorded_call(sizes)
        kwargs.update({k: v.clone() for k, v in self.added.items()})
        return shapes.arrange(self.form, args, kwargs)


@dataclass
class ExportInputs:
    """What `export_inputs` returns: one `ExportGroup` per call group, largest first.

    ``args``, ``kwargs`` and ``dynamic_shapes`` are those of the largest group.
    """

    model: str
    groups: list[ExportGroup]
    analysed: list[Group] = field(repr=False, default_factory=list)
    """Every analysed call group of the model (also those left out by ``groups=``)."""

    @property
    def args(self) -> tuple[Any, ...]:
        """Example positional arguments of the largest group."""
        return self.groups[0].args

    @property
    def kwargs(self) -> dict[str, Any]:
        """Example keyword arguments of the largest group."""
        return self.groups[0].kwargs

    @property
    def dynamic_shapes(self) -> Any:
        """``dynamic_shapes`` of the largest group."""
        return self.groups[0].dynamic_shapes

    def group(self, name: str) -> ExportGroup:
        """The group called `name`."""
        for g in self.groups:
            if g.name == name:
                return g
        known = ", ".join(g.name for g in self.groups)
        raise ReplayError(f"no group {name!r} for model {self.model} (groups: {known})")


def _named_call(model: torch.nn.Module, form: shapes.CallForm) -> torch.nn.Module:
    """A module calling `model` as the group's calls did, whose forward names every entry."""
    names = list(form.positional) + list(form.keywords)
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ReplayError(f"cannot name the entries {', '.join(bad)} in a wrapper signature")
    positional, keywords = list(form.positional), list(form.keywords)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        values = dict(zip(names, args, strict=False))
        values.update(kwargs)
        return self.model(*(values[n] for n in positional), **{n: values[n] for n in keywords})

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind) for n in ["self", *names]]
    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cls = type(f"{type(model).__name__}Call", (torch.nn.Module,), {"forward": forward})
    wrapper: torch.nn.Module = cls()
    wrapper.model = model
    return wrapper


def resolve_model(store: Store, name: str | None, module: Any = None) -> str:
    """The store model to use: `name`, the only one, or the one named like `module`'s class.

    Args:
        store: An open store.
        name: The model name asked for, or None.
        module: The model object (its class name is tried when the store has several models).

    Returns:
        A model name of the store.

    Raises:
        UnknownModel: `name` is not in the store.
        ReplayError: Several models and nothing to choose between them.

    Example:
        >>> resolve_model(open_store("capture-store"), None)  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    models = store.check_model(name)
    if name is not None or len(models) == 1:
        return models[0]
    if module is not None and type(module).__name__ in models:
        return type(module).__name__
    raise ReplayError(
        f"the store at {store.path} holds several models ({', '.join(models)}); "
        "choose one with model=... (--model NAME)"
    )


def _open(store: Any) -> tuple[Store, bool]:
    from capture.store import Store, open_store

    if isinstance(store, Store):
        return store, False
    if isinstance(store, str | os.PathLike):
        return open_store(store), True
    raise TypeError(f"store must be a path or a capture Store, not {type(store).__name__}")


def _missing_substitutes(
    group: Group,
    groups: list[Group],
    value_if_missing: Mapping[str, torch.Tensor],
    fill_missing: bool,
    notes: list[str],
) -> dict[str, torch.Tensor]:
    """Empty tensors for the missing optionals a group's program takes (``fill_missing``)."""
    missing = [r["argument"] for r in group.leaves if r["kind"] == schema.KIND_MISSING]
    unused = sorted(set(value_if_missing) & set(missing))
    if not fill_missing:
        if unused:
            notes.append(
                f"value_if_missing for {', '.join(unused)} not used: this group's calls never "
                "pass it, so its program does not take it (fill_missing=True gives every "
                "program the same tensor inputs)"
            )
        return {}
    added: dict[str, torch.Tensor] = {}
    for name in missing:
        if name in value_if_missing:
            added[name] = value_if_missing[name].detach().clone()
            continue
        seen = [
            (r, g)
            for g in groups
            for r in g.leaves
            if r["argument"] == name and r["kind"] != schema.KIND_MISSING
        ]
        tensors = [(r, g) for r, g in seen if r["kind"] == schema.KIND_TENSOR]
        if not tensors:
            continue
        row, other = tensors[0]
        if row["path"] != f"kwargs['{name}']" or len({r["path"] for r, _ in seen}) != 1:
            notes.append(f"{name}: a structured argument, not filled in (fill_missing)")
            continue
        lows = {d.axis: d.min for d in other.dims if d.leaf == row["leaf"]}
        shape = [0] + [lows[a] for a in range(1, int(row["rank"] or 0))]
        added[name] = torch.zeros(shape, dtype=rb.dtype_of(str(row["dtype"])))
    if added:
        text = ", ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in added.items())
        notes.append(f"missing optionals given as static empty tensors (fill_missing): {text}")
    return added


def _calls(n: int) -> str:
    return f" ({n} call{'' if n == 1 else 's'})"


def _short(row: dict[str, Any]) -> str:
    """'use_cache' for kwargs['use_cache'], else the path."""
    argument = row.get("argument")
    if argument and row["path"] in (f"kwargs['{argument}']", f"args[{row.get('position')}]"):
        return str(argument)
    return str(row["path"])


def _constants_note(leaves: list[dict[str, Any]]) -> str | None:
    scalars = [
        f"{_short(r)}={r['value']}"
        for r in leaves
        if r["kind"] in (schema.KIND_INT, schema.KIND_FLOAT, schema.KIND_BOOL, schema.KIND_STR)
    ]
    if not scalars:
        return None
    return (
        f"recorded constants passed as is: {', '.join(scalars)} (torch.export specializes "
        "them; the program accepts these values only)"
    )


def build_group(
    group: Group,
    groups: list[Group],
    ranges: dict[tuple[int, ...], select.Ranges],
    *,
    named_dims: bool = False,
    keyword_only: bool = False,
    value_if_missing: Mapping[str, torch.Tensor] | None = None,
    fill_missing: bool = False,
    seed: int = rb.DEFAULT_SEED,
    device: str | None = None,
) -> ExportGroup:
    """The `ExportGroup` of one analysed call group.

    Args:
        group: The call group (`capture.analysis.analyze`).
        groups: Every call group of the model (``fill_missing`` looks for recorded shapes there).
        ranges: The group's integer value ranges per signature (`replay.select.value_ranges`).
        named_dims: See `export_inputs`.
        keyword_only: See `export_inputs`.
        value_if_missing: See `export_inputs`.
        fill_missing: See `export_inputs`.
        seed: See `export_inputs`.
        device: See `export_inputs`.

    Returns:
        An `ExportGroup`.

    Raises:
        ReplayError: The group's calls cannot be rebuilt (the message says why).

    Example:
        >>> groups = analyze(store, "add")  # doctest: +SKIP
        >>> build_group(groups[0], groups, value_ranges(store, groups[0])).dynamic_shapes
        ... # doctest: +SKIP
        ({0: Dim.DYNAMIC, 1: Dim.DYNAMIC}, {0: Dim.DYNAMIC, 1: Dim.DYNAMIC})
    """
    leaves = list(group.leaves)
    treespec = leaves[0].get("treespec") if leaves else None
    params = shapes.parse_params(leaves[0].get("signature") if leaves else None)
    example = select.representative(group)
    notes = []
    if example.synthesized:
        notes.append(
            "example synthesized (no recorded signature has every dynamic dim >= 2): "
            + ", ".join(example.raised)
            + "; "
            + shapes.describe_sizes(leaves, example.sizes)
        )
    else:
        notes.append(
            "example: the recorded signature "
            + shapes.describe_sizes(leaves, example.sizes)
            + _calls(int(group.weights[example.row]) if group.weights is not None else 0)
        )
    specs = shapes.axis_specs(group, named_dims=named_dims, example=example.symbols)
    notes.extend(specs.notes)
    by_leaf = shapes.materialize(specs)
    spec_args, spec_kwargs = shapes.spec_tree(treespec, shapes.leaf_specs(leaves, by_leaf))
    base = group.matrix[example.row] if group.matrix is not None else None
    rep_ranges = ranges.get(tuple(int(v) for v in base)) if base is not None else None
    unsupported = nodes.unsupported_reason(leaves)
    try:
        args, kwargs = rb.rebuild(
            leaves, treespec, example.sizes, rep_ranges, seed=seed, device=device
        )
    except ReplayError:
        if unsupported is None:
            raise
        # Cache state we cannot rebuild (issue 9): no example, and `replay.export` reports
        # every signature of the group not covered with the reason instead of failing.
        args, kwargs = (), {}
        notes.append(f"cache state not reproducible: {unsupported}; no example arguments")
    added = _missing_substitutes(group, groups, value_if_missing or {}, fill_missing, notes)
    form = shapes.call_form(len(args), [*kwargs, *added], params, keyword_only=keyword_only)
    kwargs.update(added)
    spec_kwargs.update(dict.fromkeys(added))
    args, kwargs = shapes.arrange(form, args, kwargs)
    spec_args_t, spec_kwargs = shapes.arrange(form, spec_args, spec_kwargs)
    dynamic_shapes = shapes.shapes_of(form, spec_args_t, spec_kwargs)
    if keyword_only and spec_args:
        notes.append("positional arguments moved to keyword arguments (keyword_only)")
    constants = _constants_note(leaves)
    if constants:
        notes.append(constants)
    if form.extra:
        notes.append(
            f"passed through **kwargs: {', '.join(form.extra)}; exported from group.module(model), "
            "a wrapper naming them (torch.export cannot match dynamic_shapes to **kwargs entries)"
        )
    absent = [r["argument"] for r in leaves if r["kind"] == schema.KIND_MISSING]
    absent = [a for a in absent if a not in added]
    if absent:
        notes.append(f"not passed (missing in the recorded calls): {', '.join(absent)}")
    return ExportGroup(
        name=group.name,
        model=group.model,
        structure_id=group.structure_id,
        calls=group.calls,
        signatures=group.signatures,
        args=args,
        kwargs=kwargs,
        dynamic_shapes=dynamic_shapes,
        notes=notes,
        dims=list(group.dims),
        relations=list(group.relations),
        example=example,
        form=form,
        analysis=group,
        leaves=leaves,
        added=added,
        ranges=ranges,
        seed=seed,
        device=device,
    )


def export_inputs(
    store: Any,
    model: str | None = None,
    *,
    set_batch_dimension_for: bool | Iterable[str | int] | None = None,
    named_dims: bool = False,
    keyword_only: bool = False,
    value_if_missing: Mapping[str, torch.Tensor] | None = None,
    fill_missing: bool = False,
    seed: int = rb.DEFAULT_SEED,
    device: str | None = None,
    module: Any = None,
    groups: Iterable[str] | None = None,
) -> ExportInputs:
    """Export arguments and dynamic shapes for every call group of a recorded model.

    Args:
        store: A store path (or URI) or an open `capture.Store`.
        model: The model name in the store; optional when it holds one model.
        set_batch_dimension_for: True (axis 0 of every input tensor) or argument names or
            positions whose axis 0 is dynamic even when it never varied (as in the seeds).
        named_dims: Named ``Dim(symbol, min=, max=)`` with the observed ranges, shared per
            symbol, derived for relations (`replay.shapes`); default ``Dim.DYNAMIC``.
        keyword_only: Pass positional arguments by keyword (``ModelInputs.move_to_kwargs``).
        value_if_missing: Name -> tensor given for that argument where it is missing, with
            ``fill_missing`` (module docstring).
        fill_missing: Give every program the tensor arguments some group of the model passes.
        seed: Seed of the example tensors.
        device: Device of the example tensors (default: recorded device if available, else CPU).
        module: The model object, used only to pick the store model by class name.
        groups: Only these call groups (default: all of them).

    Returns:
        An `ExportInputs`.

    Raises:
        StoreNotFound, EmptyStore, UnknownModel: The store or the model cannot be found.
        ReplayError: The recordings cannot be turned into arguments (the message says why).

    Example:
        >>> inputs = export_inputs("capture-store", "add")  # doctest: +SKIP
        >>> inputs.dynamic_shapes  # doctest: +SKIP
        ({0: Dim.DYNAMIC, 1: Dim.DYNAMIC}, {0: Dim.DYNAMIC, 1: Dim.DYNAMIC})
    """
    from capture.analysis import analyze

    opened, owned = _open(store)
    try:
        name = resolve_model(opened, model, module)
        analysed = analyze(opened, name, set_batch_dimension_for=set_batch_dimension_for)
        if not analysed:
            raise ReplayError(f"model {name} has no analysable recorded call in {opened.path}")
        arguments = {r["argument"] for g in analysed for r in g.leaves}
        unknown_missing = sorted(set(value_if_missing or {}) - arguments)
        if unknown_missing:
            raise ReplayError(
                f"value_if_missing names {', '.join(unknown_missing)}, which no recorded call of "
                f"{name} has (arguments: {', '.join(sorted(a for a in arguments if a))})"
            )
        selected = analysed
        if groups is not None:
            wanted = list(groups)
            known = [g.name for g in analysed]
            unknown = [g for g in wanted if g not in known]
            if unknown:
                raise ReplayError(
                    f"no group {', '.join(map(repr, unknown))} for model {name} "
                    f"(groups: {', '.join(known)})"
                )
            selected = [g for g in analysed if g.name in wanted]
        out = []
        for group in selected:
            out.append(
                build_group(
                    group,
                    analysed,
                    select.value_ranges(opened, group),
                    named_dims=named_dims,
                    keyword_only=keyword_only,
                    value_if_missing=value_if_missing,
                    fill_missing=fill_missing,
                    seed=seed,
                    device=device,
                )
            )
        return ExportInputs(name, out, analysed)
    finally:
        if owned:
            opened.close()
