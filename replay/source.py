"""dynamic_shapes_source(): the dynamic_shapes of a recorded model as Python source to paste.

Used by ``capture dims --python``, so this module must not import torch: it reads the call groups
from `capture.analysis` and the argument structure from the stored treespec (`replay.shapes`),
and writes text. The text itself imports torch when it runs::

    from torch.export import Dim

    batch = Dim('batch', min=1, max=3)
    past_key_values_2 = Dim('past_key_values_2', min=4, max=9)
    attention_mask_1 = past_key_values_2 + 1
    dynamic_shapes = {
        'input_ids': {0: batch},
        ...
    }

It is the same structure `replay.export_inputs` builds (with ``named_dims=True`` by default
here): named Dims with the recorded ranges, one per symbol, derived Dims for relations.
A model with several call groups gets one ``dynamic_shapes_<group>`` per group (each after its
own Dims) and ``dynamic_shapes`` names the largest group's.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from replay import select, shapes

if TYPE_CHECKING:
    from capture.analysis import Group
    from capture.store import Store

__all__ = ["dynamic_shapes_source"]

_WIDTH = 96


class _Code:
    """A value rendered as its source text (``repr`` gives the text itself)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _identifier(text: str) -> str:
    # ASCII only: stored names must not shape the generated source (issue 11).
    name = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_") or "group"
    name = f"_{name}" if name[0].isdigit() else name
    return f"{name}_" if keyword.iskeyword(name) else name


def _comment(text: str) -> str:
    """One comment line: stored text never ends the comment (newlines become escapes)."""
    return repr(text)[1:-1] if not text.isprintable() else text


def _axis_code(spec: shapes.AxisSpec, *, expand: bool = False) -> _Code:
    """``Dim.DYNAMIC``, the symbol's variable, or (``expand``) a derived Dim's arithmetic."""
    if spec.symbol is None:
        return _Code("Dim.DYNAMIC")
    if spec.root is None or not expand:
        return _Code(spec.symbol)
    text = spec.root if spec.coef == 1 else f"{spec.coef} * {spec.root}"
    if spec.offset:
        text += f" {'+' if spec.offset > 0 else '-'} {abs(spec.offset)}"
    return _Code(text)


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


def _dim_lines(specs: shapes.GroupSpecs) -> list[str]:
    lines = []
    for symbol in specs.symbols.values():
        bounds = f"min={symbol.min}" + (f", max={symbol.max}" if symbol.max is not None else "")
        lines.append(f"{symbol.name} = Dim({symbol.name!r}, {bounds})")
    derived: dict[str, str] = {}
    for axes in specs.by_leaf.values():
        for spec in axes.values():
            if spec.symbol is not None and spec.root is not None:
                derived[spec.symbol] = _axis_code(spec, expand=True).text
    lines.extend(f"{name} = {text}" for name, text in derived.items())
    return lines


def _group_source(group: Group, variable: str, named_dims: bool, keyword_only: bool) -> list[str]:
    leaves = group.leaves
    example = select.representative(group)
    specs = shapes.axis_specs(group, named_dims=named_dims, example=example.symbols)
    by_leaf = {
        leaf: {axis: _axis_code(spec) for axis, spec in axes.items()}
        for leaf, axes in specs.by_leaf.items()
    }
    treespec = leaves[0].get("treespec") if leaves else None
    args, kwargs = shapes.spec_tree(treespec, shapes.leaf_specs(leaves, by_leaf))
    params = shapes.parse_params(leaves[0].get("signature") if leaves else None)
    form = shapes.call_form(len(args), list(kwargs), params, keyword_only=keyword_only)
    args_t, kwargs = shapes.arrange(form, args, kwargs)
    structure = shapes.shapes_of(form, args_t, kwargs)
    lines = [
        f"# {group.model!r}, group {group.name!r}: {group.calls} calls, "
        f"{group.signatures} distinct signatures"
    ]
    lines.extend(f"# {_comment(note)}" for note in specs.notes)
    if form.extra:
        lines.append(
            f"# passed through **kwargs: {', '.join(map(repr, form.extra))} (torch.export "
            "cannot match dynamic_shapes there);"
        )
        lines.append(
            f"# export replay.export_inputs(store).group({group.name!r}).module(model), "
            "which names them"
        )
    if named_dims and specs.symbols:
        lines.extend(_dim_lines(specs))
    lines.append(f"{variable} = {_render(structure)}")
    return lines


def dynamic_shapes_source(
    store: Store,
    model: str | None = None,
    *,
    group: str | None = None,
    named_dims: bool = True,
    set_batch_dimension_for: bool | Iterable[str | int] | None = None,
    keyword_only: bool = False,
) -> str:
    """Python source defining the ``dynamic_shapes`` of the recorded calls, for torch.export.

    Args:
        store: An open store.
        model: One model, or None for every model of the store.
        group: Only this call group.
        named_dims: Named Dims with ranges (default) instead of ``Dim.DYNAMIC``.
        set_batch_dimension_for: See `replay.export_inputs`.
        keyword_only: See `replay.export_inputs`.

    Returns:
        The source text (no trailing newline).

    Raises:
        UnknownModel: `model` is not in the store.
        ReplayError: `group` is not a group of the model(s), or a structure cannot be rebuilt.

    Example:
        >>> print(dynamic_shapes_source(open_store("capture-store"), "add"))  # doctest: +SKIP
        from torch.export import Dim
        <BLANKLINE>
        # add, group g0: 3 calls, 3 distinct signatures
        x_0 = Dim('x_0', min=2, max=4)
        ...
    """
    from capture.analysis import analyze
    from capture.errors import ReplayError

    groups = analyze(store, model, set_batch_dimension_for=set_batch_dimension_for)
    if group is not None:
        known = sorted({g.name for g in groups})
        groups = [g for g in groups if g.name == group]
        if not groups:
            raise ReplayError(f"no group {group!r} (groups: {', '.join(known)})")
    models = list(dict.fromkeys(g.model for g in groups))
    sections = ["from torch.export import Dim"]
    for g in groups:
        if len(groups) == 1:
            variable = "dynamic_shapes"
        elif len(models) == 1:
            variable = f"dynamic_shapes_{_identifier(g.name)}"
        else:
            variable = f"dynamic_shapes_{_identifier(g.model)}_{_identifier(g.name)}"
        sections.append("\n".join(_group_source(g, variable, named_dims, keyword_only)))
    if len(groups) > 1 and len(models) == 1:
        sections.append(f"dynamic_shapes = dynamic_shapes_{_identifier(groups[0].name)}")
    return "\n\n".join(sections)
