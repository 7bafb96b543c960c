"""One call group's dynamic shapes, built one way for `export_inputs` and ``dims --python``.

`group_shapes` is the single per-group step from an analysed group and the `ExportOptions` to
``dynamic_shapes``: per-axis specs (`replay.inputs.shapes.axis_specs`: ``named_dims``, the example's
symbols), each spec rendered (torch ``Dim`` objects for an export, Python source text for
``capture dims --python``), placed in the recorded ``(args, kwargs)`` tree
(`replay.inputs.shapes.spec_tree` over the structure's parsed treespec), then arranged in the
group's call form (``keyword_only``, ``**kwargs`` entries). `replay.inputs.builder.build_group` and
`replay.inputs.source.dynamic_shapes_source` both call it; the `replay.pipeline.bounded` retry calls
it again with a replaced option.

This module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capture.errors import ReplayError
from capture.pytree.treespec import UnsafeTreespec
from replay.inputs import shapes
from replay.runtime import callform

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from replay.inputs.options import ExportOptions

__all__ = ["GroupShapes", "Render", "group_shapes"]

Render = Callable[[shapes.GroupSpecs], Mapping[int, Mapping[int, Any]]]
"""Turns a group's specs into per tensor leaf ``{axis: value}`` (Dim objects, source text)."""


@dataclass(frozen=True)
class GroupShapes:
    """What `group_shapes` returns.

    Attributes:
        specs: The per-axis specs and named symbols.
        form: How the program is called.
        dynamic_shapes: The ``dynamic_shapes`` value, in the call form.
        positional: The positional entries of the recorded tree, before arranging.
    """

    specs: shapes.GroupSpecs
    form: callform.CallForm
    dynamic_shapes: Any
    positional: int


def group_shapes(
    group: Group,
    options: ExportOptions,
    example: Mapping[str, int],
    render: Render,
    *,
    added: Sequence[str] = (),
    call: tuple[int, Sequence[str]] | None = None,
    form: callform.CallForm | None = None,
) -> GroupShapes:
    """The dynamic shapes of one analysed call group.

    Args:
        group: The call group (`capture.analysis.groups.analyze`).
        options: ``named_dims`` and ``keyword_only`` are read here.
        example: Symbol -> size of the representative example (ranges are widened to hold it).
        render: Turns the specs into the values placed at the tensor leaves.
        added: Keyword entries the program takes beyond the recorded ones (``fill_missing``),
            static (None) in the result.
        call: ``(positional count, keyword names)`` the program is called with, when it differs
            from the recorded tree (no example could be rebuilt); default: the recorded tree.
        form: A call form already decided for this group (a retry keeps it).

    Returns:
        A `GroupShapes`.

    Raises:
        ReplayError: The structure has no treespec or one that cannot be read, or its
            signature is malformed.

    Example:
        >>> shaped = group_shapes(group, ExportOptions(), {}, materialize)  # doctest: +SKIP
        >>> shaped.dynamic_shapes  # doctest: +SKIP
        ({0: Dim.DYNAMIC, 1: Dim.DYNAMIC}, {0: Dim.DYNAMIC, 1: Dim.DYNAMIC})
    """
    structure = group.structure
    specs = shapes.axis_specs(group, named_dims=options.named_dims, example=dict(example))
    try:  # our own parser: nothing a store names is imported
        tree = structure.tree
    except UnsafeTreespec as e:
        raise ReplayError(str(e)) from None
    spec_args, spec_kwargs = shapes.spec_tree(
        tree, shapes.leaf_specs(structure.leaves, dict(render(specs)))
    )
    if form is None:
        n_args, keywords = call if call is not None else (len(spec_args), list(spec_kwargs))
        form = callform.call_form(
            n_args,
            [*keywords, *added],
            structure.checked_params(),
            keyword_only=options.keyword_only,
        )
    spec_kwargs.update(dict.fromkeys(added))
    args_t, kwargs = callform.arrange(form, spec_args, spec_kwargs)
    return GroupShapes(specs, form, callform.shapes_of(form, args_t, kwargs), len(spec_args))
