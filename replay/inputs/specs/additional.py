"""A call group's representative recorded calls as torch's ``torch.export.AdditionalInputs``.

``AdditionalInputs`` is torch's own "several example inputs -> dynamic shapes" tool: every size
that differs between the export's example and an added input becomes ``Dim.DYNAMIC``, and
``verify(ep)`` checks that a program accepts every added input (its call structure and its
guards). `additional_inputs` fills one from a store: the group's calls rebuilt from their
recorded sizes (`replay.inputs.exportgroup.ExportGroup.program_call`), in the call form of the
group's program, so the object serves both as ``dynamic_shapes`` for
``torch.export.export(g.module(model), g.args, g.kwargs, dynamic_shapes=...)`` and as a check of
a program `replay.export` made for the group.

**Representative calls**: the group's most called signature, then for every dynamic axis a
signature where it is smallest and one where it is largest (the ends of every recorded range),
then the most called of the rest, distinct, at most `limit`.
"""

from __future__ import annotations

from typing import Any

import torch

from capture.errors import ReplayError
from capture.pytree import nodes
from replay.inputs import select
from replay.inputs.builder import inputs_for
from replay.inputs.options import ExportOptions

__all__ = ["additional_inputs", "representative_signatures", "StoreInputs"]


class StoreInputs(torch.export.AdditionalInputs):
    """torch's ``AdditionalInputs`` whose ``dynamic_shapes`` and ``verify`` see a
    transformers cache as capture flattens it (`capture.pytree.nodes`): the recorded calls
    pass caches, which torch's pytree alone cannot flatten."""

    def dynamic_shapes(self, m: Any, args: Any, kwargs: Any = None) -> Any:
        with nodes.register_flattening_functions():
            return super().dynamic_shapes(m, args, kwargs)  # type: ignore[no-untyped-call]

    def verify(self, ep: Any) -> None:
        with nodes.register_flattening_functions():
            super().verify(ep)  # type: ignore[no-untyped-call]


def representative_signatures(group: Any, limit: int = 8) -> list[tuple[int, ...]]:
    """The size vectors `additional_inputs` adds for an analysed group (module docstring).

    Example:
        >>> representative_signatures(analyze(store, "m")[0], limit=3)  # doctest: +SKIP
        [(2, 16), (1, 8), (3, 32)]
    """
    rows = select.signatures(group)  # most calls first
    chosen: list[tuple[int, ...]] = [rows[0][0]] if rows else []
    for j, d in enumerate(group.dims):
        if not d.dynamic:
            continue
        for pick in (min, max):
            sizes = pick(rows, key=lambda r, j=j: (r[0][j], -r[1]))[0]  # type: ignore[misc]
            if sizes not in chosen:
                chosen.append(sizes)
    chosen += [sizes for sizes, _ in rows if sizes not in chosen]
    return chosen[: max(1, limit)]


def additional_inputs(
    store: Any,
    model_name: str | None = None,
    *,
    group: str | None = None,
    limit: int = 8,
    seed: int = ExportOptions.seed,
    device: str | None = ExportOptions.device,
) -> Any:
    """A ``torch.export.AdditionalInputs`` holding a call group's representative calls.

    Args:
        store: A store path (or URI) or an open `capture.Store`.
        model_name: The model name in the store; optional when it holds one model.
        group: The call group (default: the model's group with the most calls; a program
            serves one group, so one object describes one group).
        limit: Most calls added (the signatures of `representative_signatures`).
        seed: Seed of the rebuilt tensors.
        device: Device of the rebuilt tensors.

    Returns:
        A ``torch.export.AdditionalInputs`` (`StoreInputs`: flattening caches as capture
        does); its inputs are in the call form of the group's
        program (``replay.export_inputs(store, groups=[group]).group(group)`` gives the
        example ``args``/``kwargs`` and ``module(model)`` to export with it).

    Raises:
        StoreNotFound, EmptyStore, UnknownModel: The store or model cannot be found.
        ReplayError: `group` is not a group of the model, or its calls cannot be rebuilt.

    Example:
        >>> extra = replay.additional_inputs("capture-store", group="decode")  # doctest: +SKIP
        >>> extra.verify(replay.export(model, "capture-store").programs["decode"])
        ... # doctest: +SKIP
    """
    options = ExportOptions.of(groups=None if group is None else [group], seed=seed, device=device)
    inputs = inputs_for(store, model_name, options)
    chosen = inputs.groups[0]
    if group is None:  # the group with the most calls
        chosen = max(inputs.groups, key=lambda g: g.calls)
    if chosen.analysis.matrix is None:
        raise ReplayError(f"group {chosen.name} carries no recorded signatures")
    extra = StoreInputs()  # type: ignore[no-untyped-call]
    for sizes in representative_signatures(chosen.analysis, limit):
        args, kwargs = chosen.program_call(sizes)
        extra.add(tuple(args), dict(kwargs))  # type: ignore[no-untyped-call]
    return extra
