"""dynamic_shapes_source(): the dynamic_shapes of a recorded model as Python source to paste.

Used by ``capture dims --python``, so this module must not import torch: it reads the call groups
from `capture.analysis.groups` and the argument structure from the stored treespec
(`replay.inputs.shapes`), and writes text. The text itself imports torch when it runs::

    from torch.export import Dim

    batch = Dim.DYNAMIC(min=1, max=3)
    past_key_values_2 = Dim.DYNAMIC(min=4, max=9)
    attention_mask_1 = Dim.DYNAMIC(min=5, max=10)  # = past_key_values_2 + 1 in every call
    dynamic_shapes = {
        'input_ids': {0: batch},
        ...
    }

It is the structure `replay.export_inputs` builds, with **bounded hints**
``Dim.DYNAMIC(min=, max=)`` carrying the recorded ranges (``named_dims=True``, the default
here) instead of named ``Dim`` objects: torch.export rejects a named Dim outright when it cannot
prove a guard over its range (the ``min(...)`` stride guard of a grouped-query attention cache on
torch 2.13), and only running torch can tell, which this module does not. A bounded hint keeps
the range (the program refuses sizes beyond it) and torch finds the shared symbols and relations
while tracing; they are kept as comments. `replay.export` tries the named Dims first
(`replay.pipeline.bounded`).

Names from the store reach the text only as ``repr()`` literals, as sanitized identifiers, or in
comments with unprintable characters escaped. A model with several call groups gets one
``dynamic_shapes_<group>`` per group (each after its own dims) and ``dynamic_shapes`` names the
largest group's. The header says how to use them.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from replay.inputs import select, shapes
from replay.inputs.groupshapes import group_shapes
from replay.inputs.options import ExportOptions

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.engines.report_data import ExportPlan
    from capture.store.reader import StoreReader

__all__ = ["dynamic_shapes_source", "export_plan"]

_WIDTH = 96

_HINTS = """\
# Bounded hints with the recorded ranges: the program refuses sizes beyond them, and
# torch.export finds the shared dims and relations while tracing (checked at run time)."""


class _Code:
    """A value rendered as its source text (``repr`` gives the text itself)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_RESERVED = {"Dim", "torch"}


def _identifier(text: str) -> str:
    """An ASCII Python identifier made from `text` (a name read from the store)."""
    name = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_") or "group"
    name = f"_{name}" if name[0].isdigit() else name
    return f"{name}_" if keyword.iskeyword(name) or name in _RESERVED else name


def _comment(text: str) -> str:
    """A comment line; unprintable characters (a newline in a stored name) are escaped."""
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _variables(specs: shapes.GroupSpecs) -> dict[str, str]:
    """Symbol -> a distinct identifier for it (symbols come from stored argument names)."""
    names: dict[str, str] = {}
    symbols = list(specs.symbols)
    for axes in specs.by_leaf.values():
        symbols += [a.symbol for a in axes.values() if a.symbol is not None]
    for symbol in dict.fromkeys(symbols):
        name, n = _identifier(symbol), 2
        while name in names.values() or name.startswith("dynamic_shapes"):
            name, n = f"{_identifier(symbol)}_{n}", n + 1
        names[symbol] = name
    return names


def _expr(spec: shapes.AxisSpec, names: dict[str, str]) -> str:
    """``coef * root + offset`` of a derived axis, with the root's variable."""
    text = names[str(spec.root)] if spec.coef == 1 else f"{spec.coef} * {names[str(spec.root)]}"
    if spec.offset:
        text += f" {'+' if spec.offset > 0 else '-'} {abs(spec.offset)}"
    return text


def _axis_code(spec: shapes.AxisSpec, names: dict[str, str]) -> _Code:
    """``Dim.DYNAMIC`` or the variable of the axis' symbol."""
    return _Code("Dim.DYNAMIC" if spec.symbol is None else names[spec.symbol])


def _render(value: Any, indent: int = 0) -> str:
    """Python source of a nested dynamic_shapes value, broken over lines when long."""
    flat = _inline(value)
    if len(flat) + indent <= _WIDTH or not isinstance(value, dict | list | tuple):
        return flat
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = [f"{pad}{k!r}: {_render(v, indent + 4)}," for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")")
    items = [f"{pad}{_render(v, indent + 4)}," for v in value]
    return opening + "\n" + "\n".join(items) + "\n" + " " * indent + closing


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_inline(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(_inline(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    return repr(value)


def _hint(low: int, high: int | None) -> str:
    return f"Dim.DYNAMIC(min={low}" + (f", max={high})" if high is not None else ")")


def _dim_lines(specs: shapes.GroupSpecs, names: dict[str, str]) -> list[str]:
    """One bounded hint per symbol; a derived one says its relation in a comment."""
    lines = [f"{names[s.name]} = {_hint(s.min, s.max)}" for s in specs.symbols.values()]
    derived: dict[str, shapes.AxisSpec] = {}
    for axes in specs.by_leaf.values():
        for spec in axes.values():
            if spec.symbol is not None and spec.root is not None:
                derived[spec.symbol] = spec
    for symbol, spec in derived.items():
        hint = _hint(*shapes.bounds_of(specs, spec))
        lines.append(f"{names[symbol]} = {hint}  # = {_expr(spec, names)} in every call")
    return lines


def _code(specs: shapes.GroupSpecs) -> dict[int, dict[int, _Code]]:
    """Renders the specs as source: ``Dim.DYNAMIC`` or the variable of the axis' symbol."""
    names = _variables(specs)
    return {
        leaf: {axis: _axis_code(spec, names) for axis, spec in axes.items()}
        for leaf, axes in specs.by_leaf.items()
    }


def _group_source(
    group: Group, variable: str, options: ExportOptions, options_text: str
) -> tuple[list[str], shapes.GroupSpecs]:
    example = select.representative(group)
    shaped = group_shapes(group, options, example.symbols, _code)
    specs, form, structure = shaped.specs, shaped.form, shaped.dynamic_shapes
    names = _variables(specs)
    named_dims = options.named_dims
    lines = [
        _comment(
            f"{group.model_name}, group {group.name}: {group.calls} calls, "
            f"{group.signatures} distinct signatures"
        )
    ]
    lines.extend(_comment(note) for note in specs.notes)
    if form.extra:
        extra = ", ".join(form.extra)
        lines.append(_comment(f"passed through **kwargs: {extra}; g.module(model) names them"))
        lines.append("# (torch.export cannot match dynamic_shapes to **kwargs entries)")
    # Both lines below run as they are once uncommented ("with g = ...:" did not).
    lines.append(
        _comment(f"g = replay.export_inputs(store, {group.model_name!r}{options_text})")
        + f".group({group.name!r})"
    )
    lines.append(
        f"# torch.export.export(g.module(model), g.args, g.kwargs, dynamic_shapes={variable})"
    )
    if named_dims and specs.symbols:
        lines.extend(_dim_lines(specs, names))
    lines.append(f"{variable} = {_render(structure)}")
    return lines, specs


def dynamic_shapes_source(
    store: StoreReader,
    model_name: str | None = None,
    *,
    group: str | None = None,
    named_dims: bool = True,
    set_batch_dimension_for: bool | Iterable[str | int] | None = None,
    keyword_only: bool = False,
    spec: str = "dims",
) -> str:
    """Python source defining the ``dynamic_shapes`` of the recorded calls, for torch.export.

    Args:
        store: An open store.
        model_name: One model, or None for every model of the store.
        group: Only this call group.
        named_dims: Named Dims with ranges (default) instead of ``Dim.DYNAMIC``.
        set_batch_dimension_for: See `replay.export_inputs`.
        keyword_only: See `replay.export_inputs`.
        spec: ``"dims"``: ``Dim`` objects (the default); ``"shapes"``: torch's ``ShapesSpec``
            (torch >= 2.14) with ranges, optimization hints and divisibility assumptions
            learned from the store (`replay.inputs.specs.shapesspec`), one ``shapes_spec``
            per group, ``shapes_spec`` naming the largest group's.

    Returns:
        The source text (no trailing newline).

    Raises:
        UnknownModel: `model_name` is not in the store.
        ReplayError: `group` is not a group of the model(s), or a structure cannot be rebuilt.

    Example:
        >>> print(dynamic_shapes_source(open_store("capture-store"), "add"))  # doctest: +SKIP
        from torch.export import Dim
        <BLANKLINE>
        # add, group g0: 3 calls, 3 distinct signatures
        x_0 = Dim('x_0', min=2, max=4)
        ...
    """
    from capture.analysis.groups import analyze
    from capture.errors import ReplayError

    if set_batch_dimension_for not in (None, True, False):
        set_batch_dimension_for = list(set_batch_dimension_for)  # type: ignore[arg-type]
    options = ExportOptions.of(
        set_batch_dimension_for=set_batch_dimension_for,
        named_dims=named_dims,
        keyword_only=keyword_only,
        spec=spec,
    )
    groups = analyze(store, model_name, set_batch_dimension_for=options.set_batch_dimension_for)
    if group is not None:
        known = sorted({g.name for g in groups})
        groups = [g for g in groups if g.name == group]
        if not groups:
            raise ReplayError(f"no group {group!r} (groups: {', '.join(known)})")
    models = list(dict.fromkeys(g.model_name for g in groups))
    # The options export_inputs needs to build the same example inputs.
    options_text = ""
    if set_batch_dimension_for:
        options_text += f", set_batch_dimension_for={set_batch_dimension_for!r}"
    if keyword_only:
        options_text += ", keyword_only=True"
    if spec == "shapes":
        return _shapes_source(groups, models, options, options_text)
    sections = ["from torch.export import Dim"]
    if named_dims:
        sections[0] += "\n\n" + _HINTS
    for g in groups:
        if len(groups) == 1:
            variable = "dynamic_shapes"
        elif len(models) == 1:
            variable = f"dynamic_shapes_{_identifier(g.name)}"
        else:
            variable = f"dynamic_shapes_{_identifier(g.model_name)}_{_identifier(g.name)}"
        lines, _ = _group_source(g, variable, options, options_text)
        sections.append("\n".join(lines))
    if len(groups) > 1 and len(models) == 1:
        sections.append(f"dynamic_shapes = dynamic_shapes_{_identifier(groups[0].name)}")
    return "\n\n".join(sections)


_SHAPES_HEADER = """\
# torch's ShapesSpec (torch >= 2.14): every size below is unbacked, never specialized (0 and 1
# included); min/max are the recorded ranges, optimization_hint the size most calls had, and
# each assumption a divisor every recorded size shares (export checks it at run time)."""


def _shapes_source(
    groups: list[Group], models: list[str], options: ExportOptions, options_text: str
) -> str:
    from replay.inputs.specs import shapesspec
    from replay.inputs.specs.facts import group_facts

    sections = [shapesspec.IMPORT_LINE + "\n\n" + _SHAPES_HEADER]
    for g in groups:
        if len(groups) == 1:
            variable = "shapes_spec"
        elif len(models) == 1:
            variable = f"shapes_spec_{_identifier(g.name)}"
        else:
            variable = f"shapes_spec_{_identifier(g.model_name)}_{_identifier(g.name)}"
        facts = group_facts(g)
        tree = shapesspec.spec_tree(g, options, facts)
        lines = [
            _comment(
                f"{g.model_name}, group {g.name}: {g.calls} calls, "
                f"{g.signatures} distinct signatures"
            ),
            *(_comment(note) for note in facts.notes),
            _comment(f"g = replay.export_inputs(store, {g.model_name!r}{options_text})")
            + f".group({g.name!r})",
            f"# torch.export.export(g.module(model), g.args, g.kwargs, dynamic_shapes={variable})",
            *shapesspec.source_lines(tree, facts, variable),
        ]
        sections.append("\n".join(lines))
    if len(groups) > 1 and len(models) == 1:
        sections.append(f"shapes_spec = shapes_spec_{_identifier(groups[0].name)}")
    return "\n\n".join(sections)


def export_plan(group: Group, probes: int = ExportOptions.probes) -> ExportPlan:
    """What `capture export` does with one call group, for `capture report` to show.

    The report lives in `capture` and may not import `replay`; the CLI hands it this function.

    Args:
        group: A call group from `capture.analysis.groups.analyze`.
        probes: How many probes `capture export` checks (its ``--probes``).

    Returns:
        An `ExportPlan`: the group's ``dynamic_shapes`` as `dynamic_shapes_source` prints it
        (bounded named hints), each symbol's exported range, and each free symbol's values in
        the probes (`replay.inputs.select.probes`).

    Raises:
        ReplayError: The group's structure cannot be rebuilt.

    Example:
        >>> export_plan(analyze(store, "tiny-llama")[0]).ranges["batch"]  # doctest: +SKIP
        (2, 4)
    """
    from capture.engines.report_data import ExportPlan

    lines, specs = _group_source(group, "dynamic_shapes", ExportOptions.of(named_dims=True), "")
    source = "\n".join(["from torch.export import Dim", "", *lines])
    ranges = {name: (r.min, r.max) for name, r in specs.symbols.items()}
    for axes in specs.by_leaf.values():
        for spec in axes.values():
            if spec.symbol is not None and spec.root is not None:
                ranges.setdefault(spec.symbol, shapes.bounds_of(specs, spec))
    columns = {d.symbol: j for j, d in reversed(list(enumerate(group.dims))) if d.symbol}
    values: dict[str, set[int]] = {}
    for vector in select.probes(group, probes):
        for symbol, j in columns.items():
            values.setdefault(symbol, set()).add(int(vector[j]))
    return ExportPlan(source, ranges, {k: sorted(v) for k, v in values.items()})
