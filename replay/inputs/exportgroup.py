"""What `replay.export_inputs` returns: an `ExportInputs` of one `ExportGroup` per call group.

An `ExportGroup` holds what torch.export needs for one call group (example ``args``/``kwargs``,
``dynamic_shapes``, the module to export) and what the coverage check needs to rebuild any
recorded signature as the recorded calls passed it (`ExportGroup.recorded_call`) and in the
program's call form (`ExportGroup.program_call`). It keeps the `ExportOptions` it was built
with, so a retry (`replay.pipeline.bounded`) reshapes it with one replaced option
(`ExportGroup.reshaped`). `replay.inputs.builder` builds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from capture.errors import ReplayError
from capture.renames import same_argument
from capture.signature import POSITIONAL_OR_KEYWORD, Param, Signature
from replay.inputs import rebuild as rb
from replay.inputs import select, shapes, tokens
from replay.inputs.groupshapes import group_shapes
from replay.inputs.options import ExportOptions, ShapeRetry
from replay.runtime import callform
from replay.runtime.fills import Fill, fill_call

if TYPE_CHECKING:
    from capture.analysis.groups import DimInfo, Group, Relation
    from capture.pytree.structure import RecordedStructure

__all__ = ["ExportGroup", "ExportInputs"]


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
        analysis: The `capture.analysis.groups.Group` it was built from.
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
    form: callform.CallForm
    analysis: Group | None = field(repr=False, default=None)
    added: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)
    ranges: dict[tuple[int, ...], select.Ranges] = field(repr=False, default_factory=dict)
    options: ExportOptions = field(repr=False, default_factory=ExportOptions)
    """The options the group was built with."""
    retry: ShapeRetry = field(repr=False, default_factory=ShapeRetry)
    """How a retry reshaped its ``dynamic_shapes`` (`reshaped`); the default: not reshaped."""
    served_by: str | None = None
    """The group whose program serves this one (`replay.pipeline.merging`), or None: its own."""
    fills: tuple[Fill, ...] = ()
    """Inputs the serving program takes that this group's calls lack, filled per call."""

    @property
    def structure_ids(self) -> tuple[str, ...]:
        """Every recorded input structure of the group: `structure_id`, and the structures that
        spell a renamed argument the other way (`capture.renames`)."""
        return self.analysis.structure_ids if self.analysis is not None else (self.structure_id,)

    @property
    def program_name(self) -> str:
        """The name of the program that serves the group: its own, or `served_by`'s."""
        return self.served_by or self.name

    def module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to export: `model`, or a wrapper naming its ``**kwargs`` entries, and the
        keywords recorded under a name the library has renamed since (`capture.renames`: a store
        of transformers 5.23 passes ``past_key_values``, 5.24's forward declares ``cache`` and
        still takes the old name through ``**kwargs``): the program takes them as recorded.

        Example:
            >>> ep = torch.export.export(group.module(model), group.args, group.kwargs,
            ...                          dynamic_shapes=group.dynamic_shapes)  # doctest: +SKIP
        """
        if not self.form.extra and not _renamed_since(model, self.form.keywords):
            return model
        return _named_call(model, self.form)

    @property
    def structure(self) -> RecordedStructure:
        """The group's typed recorded structure (`capture.analysis.groups.Group.structure`).

        Raises:
            ReplayError: The group was not built from an analysis.
        """
        if self.analysis is None:
            raise ReplayError(f"group {self.name} was not built from an analysis")
        return self.analysis.structure

    def recorded(self) -> list[tuple[tuple[int, ...], int]]:
        """The distinct recorded size vectors of the group with their calls, most calls first."""
        if self.analysis is None:
            raise ReplayError(f"group {self.name} was not built from an analysis")
        return select.signatures(self.analysis)

    def recorded_call(self, sizes: Iterable[int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Fresh ``(args, kwargs)`` of one recorded signature, as the recorded calls passed them.

        A size vector that was never recorded (a probe) takes the integer value ranges of the
        closest recorded signature (`replay.inputs.select.nearest_ranges`), and the special token
        counts its sizes imply (`replay.inputs.tokens.probe_ranges`).
        """
        sizes = tuple(int(s) for s in sizes)
        return rb.rebuild(
            self.structure,
            sizes,
            tokens.probe_ranges(self.structure, self.ranges, sizes),
            seed=self.options.seed,
            device=self.options.device,
        )

    def reshaped(self, retry: ShapeRetry) -> ExportGroup:
        """A copy whose ``dynamic_shapes`` are built again the way `retry` says (same options,
        example arguments and call form, own notes list): how `replay.pipeline.bounded` and
        `replay.pipeline.splitting` retry an export.

        Raises:
            ReplayError: The group was not built from an analysis.

        Example:
            >>> hinted = group.reshaped(ShapeRetry(hinted=("seq",)))  # doctest: +SKIP
        """
        if self.analysis is None:
            raise ReplayError(f"group {self.name} was not built from an analysis")
        options = self.options
        if retry.unbounded:
            options = dataclasses.replace(options, named_dims=False)
        shaped = group_shapes(
            self.analysis,
            options,
            self.example.symbols,
            lambda specs: shapes.materialize(specs, retry.hinted, retry.floor, retry.auto),
            added=list(self.added),
            form=self.form,
        )
        return dataclasses.replace(
            self,
            dynamic_shapes=shaped.dynamic_shapes,
            notes=list(self.notes),
            retry=retry,
        )

    def program_call(self, sizes: Iterable[int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Fresh ``(args, kwargs)`` of one signature (recorded or probe), in the program's call
        form."""
        sizes = tuple(int(s) for s in sizes)
        args, kwargs = self.recorded_call(sizes)
        return self.to_program(args, kwargs, sizes)

    def to_program(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], sizes: Iterable[int]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A call as the group's calls pass it, made the program's call: the ``fill_missing``
        substitutes and the `fills` added, arranged in the program's call form.

        Args:
            args: The call's positional arguments.
            kwargs: Its keyword arguments.
            sizes: Every input tensor size of the call, in leaf order (the fills' shapes).

        Returns:
            ``(args, kwargs)`` for the serving program.

        Example:
            >>> args, kwargs = group.to_program(*real_call, sizes)  # doctest: +SKIP
        """
        kwargs = {**kwargs, **{k: v.clone() for k, v in self.added.items()}}
        args, kwargs = fill_call(self.fills, tuple(args), kwargs, list(sizes))
        return callform.arrange(self.form, args, kwargs)


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

    def group_for(self, structure_id: str, sizes: Iterable[int]) -> ExportGroup | None:
        """The group (or regime) a call of `structure_id` with these input sizes belongs to.

        A group split into regimes (`replay.pipeline.splitting`) has several groups of one
        structure: the call belongs to the one that recorded its sizes, else to the one whose
        recorded ranges hold them.

        Args:
            structure_id: The call's recorded input structure.
            sizes: Every input tensor size of the call, in leaf order (``calls.dims``).

        Returns:
            The group, or None when no group of the structure holds the call.

        Example:
            >>> inputs.group_for(row["in_structure"], row["dims"]).name  # doctest: +SKIP
            'prefill[input_ids_1<=4]'
        """
        key = tuple(int(s) for s in sizes)
        mine = [g for g in self.groups if structure_id in g.structure_ids]
        if len(mine) <= 1:
            return mine[0] if mine else None
        for g in mine:
            if g.analysis is not None and key in {sizes for sizes, _ in g.recorded()}:
                return g
        for g in mine:
            if len(g.dims) == len(key) and all(
                d.min <= v <= d.max for d, v in zip(g.dims, key, strict=True)
            ):
                return g
        return None

    def group(self, name: str) -> ExportGroup:
        """The group called `name`."""
        for g in self.groups:
            if g.name == name:
                return g
        known = ", ".join(g.name for g in self.groups)
        raise ReplayError(f"no group {name!r} for model {self.model} (groups: {known})")


def _renamed_since(model: torch.nn.Module, keywords: Iterable[str]) -> bool:
    """Whether a recorded keyword is one the model's forward now declares under another name."""
    declared = Signature.of(getattr(model, "forward", model)).plain
    return any(k not in declared and same_argument(k, declared) for k in keywords)


def _named_call(model: torch.nn.Module, form: callform.CallForm) -> torch.nn.Module:
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

    params = tuple(Param(n, POSITIONAL_OR_KEYWORD, False) for n in ["self", *names])
    forward.__signature__ = Signature(params).to_inspect()  # type: ignore[attr-defined]
    cls = type(f"{type(model).__name__}Call", (torch.nn.Module,), {"forward": forward})
    wrapper: torch.nn.Module = cls()
    wrapper.model = model
    return wrapper
