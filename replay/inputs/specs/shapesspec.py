"""A call group's shapes as torch's ``ShapesSpec`` (torch >= 2.14), object or Python source.

``torch.fx.experimental.dynamic_spec`` describes dynamic shapes per parameter: a `TensorSpec`
per tensor (one entry per axis: a ``ShapeVar``, an expression over ShapeVars, or ``STATIC``),
`SeqSpec` / `DictSpec` / `ObjectSpec` for containers (a transformers cache is an `ObjectSpec`
named by its pytree keys, ``key_cache_0``), and ``assumptions`` that export checks at run time.
Every size it names is unbacked: torch never specializes it, 0 and 1 included.

From a group's facts (`replay.inputs.specs.facts`): one ``ShapeVar(name, min=, max=,
optimization_hint=)`` per free symbol, derived axes as expressions (``past_key_values_2 + 1``,
``a + b``: any relation capture found, not only one root), and ``symbol % k == 0`` for every
trusted divisor. The tree follows the group's call form (`replay.inputs.groupshapes`), so the
spec binds to the same arguments as the group's ``Dim`` form.

`shapes_spec` builds the torch object (imports torch); `source_lines` writes the same spec as
Python text without importing torch (``capture dims --python --spec shapes``).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capture.errors import ReplayError
from replay.inputs.groupshapes import group_shapes
from replay.inputs.specs.facts import Expr, GroupFacts, group_facts

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from replay.inputs.options import ExportOptions
    from replay.runtime.callform import CallForm

__all__ = [
    "SpecNode",
    "MIN_TORCH",
    "supported",
    "require",
    "spec_tree",
    "shapes_spec",
    "source_lines",
    "IMPORT_LINE",
]

MIN_TORCH = (2, 14)
"""The first torch whose ``torch.export.export`` takes a ``ShapesSpec``."""

IMPORT_LINE = (
    "from torch.fx.experimental.dynamic_spec import (\n"
    "    STATIC, DictSpec, ObjectSpec, ParamsSpec, SeqSpec, ShapesSpec, ShapeVar, TensorSpec\n"
    ")"
)

_ATTRIBUTE = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?$")


def _torch_version() -> tuple[int, int] | None:
    try:
        text = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    found = re.match(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def supported() -> bool:
    """Whether the installed torch exports with a ``ShapesSpec`` (read from its version, so
    asking imports no torch)."""
    version = _torch_version()
    return version is not None and version >= MIN_TORCH


def require() -> None:
    """Raises `ReplayError` naming the fix when the installed torch takes no ``ShapesSpec``."""
    if not supported():
        version = _torch_version()
        found = "no torch" if version is None else f"torch {version[0]}.{version[1]}"
        raise ReplayError(
            f"spec='shapes' needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (torch.export takes a "
            f"ShapesSpec from there on); {found} is installed: upgrade torch or use spec='dims'"
        )


@dataclass(frozen=True)
class SpecNode:
    """One node of a spec tree: ``kind`` is params, tensor, seq, dict or object.

    ``tensor``: `rank` and `axes` (axis -> `Expr`); the others: `children` (name or position
    -> node; None children are static and left out, except a sequence's positions).
    """

    kind: str
    children: Mapping[Any, SpecNode | None] | None = None
    rank: int = 0
    axes: Mapping[int, Expr] | None = None


def _is_axes(value: Any) -> bool:
    return (
        isinstance(value, dict) and bool(value) and all(isinstance(v, Expr) for v in value.values())
    )


def _object_name(node: SpecNode | None) -> str | None:
    """The pytree attribute key of an object's child, read from its tensor's path:
    ``.key_cache[0]`` -> ``key_cache_0`` (`capture.pytree.nodes.CacheKey`)."""
    if node is None or node.kind != "tensor" or not node.axes:
        return None
    path = next(iter(node.axes.values())).path
    found = _ATTRIBUTE.search(path)
    if found is None:
        return None
    return found.group(1) if found.group(2) is None else f"{found.group(1)}_{found.group(2)}"


def _node(value: Any) -> SpecNode | None:
    if value is None:
        return None
    if _is_axes(value):
        first = next(iter(value.values()))
        return SpecNode("tensor", rank=first.rank, axes=dict(sorted(value.items())))
    if isinstance(value, dict):
        kids = {k: _node(v) for k, v in value.items()}
        kids = {k: v for k, v in kids.items() if v is not None}
        return SpecNode("dict", kids) if kids else None
    if isinstance(value, list | tuple):
        kids_list = [_node(v) for v in value]
        present = [k for k in kids_list if k is not None]
        if not present:
            return None
        names = [_object_name(k) for k in present]
        if all(n is not None for n in names):  # a registered class: its children by key
            return SpecNode("object", dict(zip(names, present, strict=True)))
        if any(k.kind == "tensor" and _object_name(k) for k in present):
            raise ReplayError(
                "a container of the recorded call mixes attribute children with others; "
                "it cannot be written as a ShapesSpec"
            )
        return SpecNode("seq", dict(enumerate(kids_list)))
    raise ReplayError(f"unexpected dynamic_shapes entry {type(value).__name__}")


def spec_tree(
    group: Group,
    options: ExportOptions,
    facts: GroupFacts | None = None,
    *,
    added: Sequence[str] = (),
    call: tuple[int, Sequence[str]] | None = None,
    form: CallForm | None = None,
) -> SpecNode:
    """The group's ``ParamsSpec`` as a `SpecNode` tree, in the group's call form.

    Args:
        group: The call group.
        options: ``keyword_only`` is read (as for the ``Dim`` form).
        facts: The group's facts (default: read from the group).
        added: Keyword entries the program takes beyond the recorded ones (static).
        call: ``(positional count, keyword names)`` of the program call, when not recorded.
        form: The group's call form, when already decided.

    Returns:
        A node of kind ``params``: parameter name -> node.

    Raises:
        ReplayError: The structure cannot be read or a container cannot be written.
    """
    from replay.inputs import select

    facts = facts or group_facts(group)
    shaped = group_shapes(
        group,
        options,
        select.representative(group).symbols,
        lambda _specs: facts.axes,
        added=added,
        call=call,
        form=form,
    )
    top = shaped.dynamic_shapes
    if isinstance(top, tuple):
        named = [n for n in shaped.form.positional if not n.startswith("args[")]
        if len(named) < len(top):
            raise ReplayError("*args entries cannot be named in a ShapesSpec")
        top = dict(zip(named, top, strict=False))
    params = {name: _node(v) for name, v in top.items()}
    return SpecNode("params", {k: v for k, v in params.items() if v is not None})


# -- the torch object --------------------------------------------------------------------------
def shapes_spec(tree: SpecNode, facts: GroupFacts) -> Any:
    """The ``torch.fx.experimental.dynamic_spec.ShapesSpec`` of a spec tree.

    Raises:
        ReplayError: The installed torch takes no ``ShapesSpec`` (`require`).
    """
    require()
    from torch.fx.experimental import dynamic_spec as ds

    variables = {
        s.name: ds.ShapeVar(s.name, min=s.min, max=s.max, optimization_hint=s.hint)
        for s in facts.symbols.values()
    }

    def size(expr: Expr) -> Any:
        value: Any = None
        for t in expr.terms:
            value = variables[t] if value is None else value + variables[t]
        return value + expr.offset if expr.offset else value

    def build(node: SpecNode | None) -> Any:
        if node is None:
            return None
        if node.kind == "tensor":
            axes = node.axes or {}
            return ds.TensorSpec(
                [size(axes[i]) if i in axes else ds.STATIC for i in range(node.rank)]
            )
        kids = {k: build(v) for k, v in (node.children or {}).items()}
        if node.kind == "seq":
            return ds.SeqSpec([kids.get(i) for i in range(max(kids, default=-1) + 1)])
        if node.kind == "dict":
            return ds.DictSpec(kids)
        if node.kind == "object":
            return ds.ObjectSpec(kids)
        return ds.ParamsSpec(kids)

    assumptions = [variables[name] % k == 0 for name, k in facts.assumptions.items()]
    # Each is a SymBool at run time (a comparison of torch's symbolic sizes).
    return ds.ShapesSpec(build(tree), assumptions=assumptions)  # type: ignore[arg-type]


# -- the source text -----------------------------------------------------------------------------
def _identifier(text: str, taken: set[str]) -> str:
    name = re.sub(r"[^0-9A-Za-z_]+", "_", text).strip("_") or "size"
    name = f"_{name}" if name[0].isdigit() else name
    reserved = {
        "STATIC",
        "DictSpec",
        "ObjectSpec",
        "ParamsSpec",
        "SeqSpec",
        "ShapesSpec",
        "ShapeVar",
        "TensorSpec",
        "shapes_spec",
    }
    base, n = name, 2
    while name in taken or name in reserved or name.startswith("shapes_spec"):
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _text(node: SpecNode, names: dict[str, str], indent: int) -> str:
    pad = " " * (indent + 4)
    if node.kind == "tensor":
        axes = node.axes or {}
        dims = [axes[i].text(names) if i in axes else "STATIC" for i in range(node.rank)]
        return f"TensorSpec([{', '.join(dims)}])"
    kids = node.children or {}
    if node.kind == "seq":
        length = max(kids, default=-1) + 1
        items = [kids.get(i) for i in range(length)]
        body = [f"{pad}{_text(v, names, indent + 4) if v else 'None'}," for v in items]
        return "SeqSpec([\n" + "\n".join(body) + "\n" + " " * indent + "])"
    body = [f"{pad}{k!r}: {_text(v, names, indent + 4)}," for k, v in kids.items() if v]
    kind = {"dict": "DictSpec", "object": "ObjectSpec", "params": "ParamsSpec"}[node.kind]
    if not body:
        return f"{kind}({{}})"
    return f"{kind}({{\n" + "\n".join(body) + "\n" + " " * indent + "})"


def source_lines(tree: SpecNode, facts: GroupFacts, variable: str) -> list[str]:
    """The spec as Python lines: one ``ShapeVar`` per free symbol (its facts in a comment),
    then ``variable = ShapesSpec(ParamsSpec({...}), assumptions=[...])``."""
    taken: set[str] = {variable}
    names = {s: _identifier(s, taken) for s in facts.symbols}
    lines = []
    for s in facts.symbols.values():
        args = [repr(s.name), f"min={s.min}"]
        if s.max is not None:
            args.append(f"max={s.max}")
        if s.hint is not None:
            args.append(f"optimization_hint={s.hint}")
        why = f"  # {s.sizes} sizes, most calls at {s.hint}" if s.hint is not None else ""
        if s.small:
            why += f"; recorded at {' and '.join(map(str, s.small))}, kept dynamic"
        lines.append(f"{names[s.name]} = ShapeVar({', '.join(args)}){why}")
    assumptions = [f"{names[n]} % {k} == 0" for n, k in facts.assumptions.items()]
    tail = f",\n    assumptions=[{', '.join(assumptions)}],\n)" if assumptions else ",\n)"
    lines.append(f"{variable} = ShapesSpec(\n    {_text(tree, names, 4)}{tail}")
    return lines
