"""export_inputs(): from a store to torch.export arguments and dynamic_shapes, per call group.

One `ExportGroup` per call group (`capture.analysis.groups.analyze`: calls sharing one input
structure, such as prefill and decode), largest first. Each holds example ``args``/``kwargs``
rebuilt from the recorded metadata (`replay.inputs.select` picks sizes with every dynamic dim >= 2,
`replay.inputs.rebuild` makes the tensors) and the matching ``dynamic_shapes``
(`replay.inputs.shapes`), ready
for::

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

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from capture import schema
from capture.errors import ReplayError
from capture.pytree.cachespec import blocking_reason
from replay.inputs import rebuild as rb
from replay.inputs import select, shapes
from replay.inputs.exportgroup import Example, ExportGroup, ExportInputs
from replay.inputs.groupshapes import group_shapes
from replay.inputs.options import INPUT_OPTIONS, ExportOptions, takes_options
from replay.runtime import callform

if TYPE_CHECKING:
    from typing import TypeAlias

    from capture.analysis.groups import Group
    from capture.pytree.recorded_structure import RecordedLeaf
    from capture.store.reader import StoreReader

    StoreSource: TypeAlias = StoreReader | str | os.PathLike[str]
    """A store as the API takes it: an open `capture.Store`, or its path or URI."""

__all__ = [
    "Example",
    "ExportGroup",
    "ExportInputs",
    "export_inputs",
    "inputs_for",
    "reading",
    "resolve_model",
    "build_group",
]


def resolve_model(store: StoreReader, model_name: str | None, model: Any = None) -> str:
    """The store model to use: `model_name`, the only one, or the one named like `model`'s
    class.

    Args:
        store: An open store.
        model_name: The model name asked for, or None.
        model: The model object (its class name is tried when the store has several models).

    Returns:
        A model name of the store.

    Raises:
        UnknownModel: `name` is not in the store.
        ReplayError: Several models and nothing to choose between them.

    Example:
        >>> resolve_model(open_store("capture-store"), None)  # doctest: +SKIP
        'LlamaForCausalLM'
    """
    models = store.check_model(model_name)
    if model_name is not None or len(models) == 1:
        return models[0]
    if model is not None and type(model).__name__ in models:
        return type(model).__name__
    raise ReplayError(
        f"the store at {store.path} holds several models ({', '.join(models)}); "
        "choose one with model_name=... (--model NAME)"
    )


@contextlib.contextmanager
def reading(store: StoreSource) -> Iterator[StoreReader]:
    """The store as a reader: `store` itself when it is an open store, else opened (a path or
    URI) and closed at the end of the block. An export opens its store here once and passes
    the reader down.

    Raises:
        TypeError: `store` is neither a path nor an open store.
        StoreNotFound, EmptyStore: Nothing, or no recorded call, at the path.
    """
    from capture.store.reader import StoreReader

    if isinstance(store, StoreReader):
        yield store
        return
    if not isinstance(store, str | os.PathLike):
        raise TypeError(f"store must be a path or a capture Store, not {type(store).__name__}")
    opened = StoreReader(store)
    try:
        yield opened
    finally:
        opened.close()


def _missing_substitutes(
    group: Group,
    groups: list[Group],
    value_if_missing: Mapping[str, torch.Tensor],
    fill_missing: bool,
    notes: list[str],
) -> dict[str, torch.Tensor]:
    """Empty tensors for the missing optionals a group's program takes (``fill_missing``)."""
    missing = [leaf.argument for leaf in group.structure.leaves if leaf.is_missing]
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
        if name is None:
            continue
        if name in value_if_missing:
            added[name] = value_if_missing[name].detach().clone()
            continue
        seen = [
            (leaf, g)
            for g in groups
            for leaf in g.structure.leaves
            if leaf.argument == name and not leaf.is_missing
        ]
        tensors = [(leaf, g) for leaf, g in seen if leaf.is_tensor]
        if not tensors:
            continue
        leaf, other = tensors[0]
        if leaf.path != f"kwargs['{name}']" or len({r.path for r, _ in seen}) != 1:
            notes.append(f"{name}: a structured argument, not filled in (fill_missing)")
            continue
        lows = {d.axis: d.min for d in other.dims if d.leaf == leaf.leaf}
        shape = [0] + [lows[a] for a in range(1, leaf.ndim)]
        added[name] = torch.zeros(shape, dtype=rb.dtype_of(str(leaf.dtype)))
    if added:
        text = ", ".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in added.items())
        notes.append(f"missing optionals given as static empty tensors (fill_missing): {text}")
    return added


def _calls(n: int) -> str:
    return f" ({n} call{'' if n == 1 else 's'})"


def _short(leaf: RecordedLeaf) -> str:
    """'use_cache' for kwargs['use_cache'], else the path."""
    argument = leaf.argument
    if argument and leaf.path in (f"kwargs['{argument}']", f"args[{leaf.position}]"):
        return argument
    return leaf.path


def _constants_note(group: Group) -> str | None:
    scalars = [f"{_short(leaf)}={leaf.value}" for leaf in group.structure.leaves if leaf.is_scalar]
    if not scalars:
        return None
    return (
        f"recorded constants passed as is: {', '.join(scalars)} (torch.export specializes "
        "them; the program accepts these values only)"
    )


def _example_note(group: Group, example: select.Representative) -> str:
    leaves = group.structure.leaves
    if example.synthesized:
        return (
            "example synthesized (no recorded signature has every dynamic dim >= 2): "
            + ", ".join(example.raised)
            + "; "
            + shapes.describe_sizes(leaves, example.sizes)
        )
    return (
        "example: the recorded signature "
        + shapes.describe_sizes(leaves, example.sizes)
        + _calls(int(group.weights[example.row]) if group.weights is not None else 0)
    )


def build_group(
    group: Group,
    groups: list[Group],
    ranges: Mapping[tuple[int, ...], select.Ranges],
    options: ExportOptions | None = None,
    **kwargs: Any,
) -> ExportGroup:
    """The `ExportGroup` of one analysed call group.

    Args:
        group: The call group (`capture.analysis.groups.analyze`).
        groups: Every call group of the model (``fill_missing`` looks for recorded shapes there).
        ranges: The group's integer value ranges per signature
            (`replay.inputs.select.value_ranges`).
        options: The replay's options (``named_dims``, ``keyword_only``, ``value_if_missing``,
            ``fill_missing``, ``seed``, ``device``; see `export_inputs`).
        **kwargs: Options given one by one instead (`ExportOptions.of`), without `options`.

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
    if options is None:
        options = ExportOptions.of(**kwargs)
    elif kwargs:
        raise TypeError("build_group takes options or keyword options, not both")
    structure = group.structure
    structure.checked_params()  # a malformed stored signature fails before any work
    chosen = select.representative(group)
    notes = [_example_note(group, chosen)]
    base = group.matrix[chosen.row] if group.matrix is not None else None
    rep_ranges = ranges.get(tuple(int(v) for v in base)) if base is not None else None
    blocked = blocking_reason(structure)
    try:
        args, kwargs_ = rb.rebuild(
            structure,
            chosen.sizes,
            rep_ranges,
            seed=options.seed,
            device=options.device,
        )
    except ReplayError:
        if blocked is None:
            raise
        # A class we cannot rebuild: no example, and `replay.export` reports
        # every signature of the group not covered with the reason instead of failing.
        args, kwargs_ = (), {}
        notes.append(f"{blocked}; no example arguments")
    added = _missing_substitutes(
        group, groups, options.value_if_missing, options.fill_missing, notes
    )
    shaped = group_shapes(
        group,
        options,
        chosen.symbols,
        shapes.materialize,
        added=list(added),
        call=(len(args), list(kwargs_)),
    )
    # The specs' notes come right after the example's.
    notes[1:1] = shaped.specs.notes
    form = shaped.form
    kwargs_.update(added)
    args, kwargs_ = callform.arrange(form, args, kwargs_)
    notes += _call_notes(group, form, added, options.keyword_only and bool(shaped.positional))
    dynamic_shapes = shaped.dynamic_shapes
    if options.spec == "shapes":
        dynamic_shapes = _shapes_spec(group, options, list(added), form, notes)
    example = Example(args, kwargs_, dynamic_shapes, form, chosen, added)
    return ExportGroup(group, example, options, ranges=ranges, notes=tuple(notes))


def _call_notes(
    group: Group, form: callform.CallForm, added: Mapping[str, torch.Tensor], moved: bool
) -> list[str]:
    """What the group's call form does to the recorded calls: keywords moved, constants kept,
    ``**kwargs`` entries named, optionals left out."""
    notes = []
    if moved:
        notes.append("positional arguments moved to keyword arguments (keyword_only)")
    constants = _constants_note(group)
    if constants:
        notes.append(constants)
    if form.extra:
        notes.append(
            f"passed through **kwargs: {', '.join(form.extra)}; exported from group.module(model), "
            "a wrapper naming them (torch.export cannot match dynamic_shapes to **kwargs entries)"
        )
    absent = [a for a in group.structure.arguments_of([schema.KIND_MISSING]) if a not in added]
    if absent:
        notes.append(f"not passed (missing in the recorded calls): {', '.join(map(str, absent))}")
    return notes


def _shapes_spec(
    group: Group, options: ExportOptions, added: list[str], form: Any, notes: list[str]
) -> Any:
    """The group's ``ShapesSpec`` (`replay.inputs.specs.shapesspec`), its decisions noted."""
    from replay.inputs.specs import shapesspec
    from replay.inputs.specs.facts import group_facts

    shapesspec.require()
    facts = group_facts(group)
    notes.extend(facts.notes)
    for name, k in facts.assumptions.items():
        notes.append(f"ShapesSpec assumption {name} % {k} == 0: every recorded size is a multiple")
    for name, small in facts.small.items():
        sizes = " and ".join(map(str, small))
        notes.append(f"{name} recorded at {sizes}: kept dynamic (ShapesSpec sizes are unbacked)")
    tree = shapesspec.spec_tree(group, options, facts, added=added, form=form)
    return shapesspec.shapes_spec(tree, facts)


# The keyword defaults are `ExportOptions`' (the one place an option and its default are
# defined); tests/test_replay_options.py checks that the two stay the same.
@takes_options(INPUT_OPTIONS)
def export_inputs(
    store: StoreSource, model_name: str | None = None, *, model: Any = None, **options: Any
) -> ExportInputs:
    """Export arguments and dynamic shapes for every call group of a recorded model.

    Args:
        store: A store path (or URI) or an open `capture.Store`.
        model_name: The model name in the store; optional when it holds one model.
        set_batch_dimension_for: True (axis 0 of every input tensor) or argument names or
            positions whose axis 0 is dynamic even when it never varied (as in the seeds).
        named_dims: Named ``Dim(symbol, min=, max=)`` with the observed ranges, shared per
            symbol, derived for relations (`replay.inputs.shapes`); default ``Dim.DYNAMIC``.
        keyword_only: Pass positional arguments by keyword (``ModelInputs.move_to_kwargs``).
        value_if_missing: Name -> tensor given for that argument where it is missing, with
            ``fill_missing`` (module docstring).
        fill_missing: Give every program the tensor arguments some group of the model passes.
        seed: Seed of the example tensors.
        device: Device of the example tensors (default: recorded device if available, else CPU).
        model: The model object, used only to pick the store model by class name.
        groups: Only these call groups (default: all of them).
        spec: ``"dims"`` (default): ``dynamic_shapes`` of ``torch.export.Dim`` objects;
            ``"shapes"``: torch's ``ShapesSpec`` learned from the store (torch >= 2.14;
            `replay.inputs.specs.shapesspec`): recorded ranges, the most called size as
            ``optimization_hint``, trusted divisors as ``assumptions``.

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
    return inputs_for(store, model_name, ExportOptions.of_inputs(**options), model=model)


def inputs_for(
    store: StoreSource, model_name: str | None, options: ExportOptions, *, model: Any = None
) -> ExportInputs:
    """`export_inputs` with its options already built (the pipeline behind the API).

    Args:
        store: A store path (or URI) or an open `capture.Store`.
        model_name: The model name in the store; optional when it holds one model.
        options: The replay's options.
        model: The model object, used only to pick the store model by class name.

    Returns:
        An `ExportInputs`.

    Raises:
        StoreNotFound, EmptyStore, UnknownModel: The store or the model cannot be found.
        ReplayError: The recordings cannot be turned into arguments (the message says why).
    """
    from capture.analysis.groups import analyze

    with reading(store) as opened:
        name = resolve_model(opened, model_name, model)
        analysed = analyze(opened, name, set_batch_dimension_for=options.set_batch_dimension_for)
        if not analysed:
            raise ReplayError(f"model {name} has no analysable recorded call in {opened.path}")
        arguments = {leaf.argument for g in analysed for leaf in g.structure.leaves}
        unknown_missing = sorted(set(options.value_if_missing) - arguments)
        if unknown_missing:
            raise ReplayError(
                f"value_if_missing names {', '.join(unknown_missing)}, which no recorded call of "
                f"{name} has (arguments: {', '.join(sorted(a for a in arguments if a))})"
            )
        selected = analysed
        if options.groups is not None:
            wanted = list(options.groups)
            known = [g.name for g in analysed]
            unknown = [g for g in wanted if g not in known]
            if unknown:
                raise ReplayError(
                    f"no group {', '.join(map(repr, unknown))} for model {name} "
                    f"(groups: {', '.join(known)})"
                )
            selected = [g for g in analysed if g.name in wanted]
        out = [
            build_group(group, analysed, select.value_ranges(opened, group), options)
            for group in selected
        ]
        return ExportInputs(name, out, analysed)
