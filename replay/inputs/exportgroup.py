"""What `replay.export_inputs` returns: an `ExportInputs` of one `ExportGroup` per call group.

An `ExportGroup` is three frozen values and what the export found out about them:

- the **analysed call group** (`capture.analysis.groups.Group`: its name, calls, structure,
  dims and relations, read from the store), and the integer value ranges of its signatures
  (`replay.inputs.select.value_ranges`);
- the **example** it is exported from (`Example`: ``args``, ``kwargs``, ``dynamic_shapes``,
  the program's call form, the sizes they were built from, the inputs given to every call);
- the **options** it was built with (`ExportOptions`) and how a retry reshaped its dynamic
  shapes (`ShapeRetry`: `replay.pipeline.bounded`, `replay.pipeline.splitting`);
- the **notes** saying how each was chosen, and the group whose program serves it
  (``served_by``, `replay.pipeline.merging`).

Every step of the export returns a new `ExportGroup` (`ExportGroup.reshaped`,
`ExportGroup.noted`, `dataclasses.replace`) rather than changing one. The read-only properties
(``name``, ``calls``, ``args``, ``kwargs``, ``dynamic_shapes``, ...) read through to the three.
The coverage check rebuilds any recorded signature as the recorded calls passed it
(`ExportGroup.recorded_call`) and in the program's call form (`ExportGroup.program_call`).
`replay.inputs.builder` builds them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from capture.errors import ReplayError
from capture.renames import same_argument
from capture.signature import POSITIONAL_OR_KEYWORD, Param, Signature
from capture.state import DEFAULT
from replay.inputs import rebuild as rb
from replay.inputs import select, shapes, tokens
from replay.inputs.groupshapes import group_shapes
from replay.inputs.options import ExportOptions, ShapeRetry
from replay.runtime import callform
from replay.runtime.fills import Fill, fill_call

if TYPE_CHECKING:
    from capture.analysis.groups import DimInfo, Group, Relation
    from capture.pytree.recorded_structure import RecordedStructure

__all__ = ["Example", "ExportGroup", "ExportInputs"]


@dataclass(frozen=True)
class Example:
    """The example arguments a group is exported from, and how its program is called.

    Attributes:
        args: Example positional arguments.
        kwargs: Example keyword arguments (the `added` inputs among them).
        dynamic_shapes: The matching ``dynamic_shapes`` for torch.export.
        form: How the program is called (positional, keywords, ``**kwargs`` entries).
        representative: The sizes the example was built from (`replay.inputs.select`).
        added: Missing optionals given to the program as static tensors (``fill_missing``).
        fills: Inputs the serving program takes that the group's calls lack, filled per call
            (`replay.pipeline.merging`).
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dynamic_shapes: Any
    form: callform.CallForm
    representative: select.Representative = field(repr=False)
    added: Mapping[str, torch.Tensor] = field(repr=False, default_factory=dict)
    fills: tuple[Fill, ...] = ()


@dataclass(frozen=True)
class ExportGroup:
    """One call group ready for torch.export: its analysis, example and options (module
    docstring).

    Attributes:
        analysis: The analysed call group (`capture.analysis.groups.analyze`, or a regime of
            one: `capture.analysis.regimes.regime`).
        example: The example arguments and dynamic shapes.
        options: The options the group was built with.
        retry: How a retry reshaped its ``dynamic_shapes`` (`reshaped`); default: not reshaped.
        ranges: The integer value ranges of its signatures (`replay.inputs.select.value_ranges`).
        served_by: The group whose program serves this one (`replay.pipeline.merging`), or
            None: its own.
        notes: How the example and the arguments were chosen, and what the export did.
    """

    analysis: Group
    example: Example
    options: ExportOptions = field(repr=False, default_factory=ExportOptions)
    retry: ShapeRetry = field(repr=False, default_factory=ShapeRetry)
    ranges: Mapping[tuple[int, ...], select.Ranges] = field(repr=False, default_factory=dict)
    served_by: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The group's name (``decode``, ``prefill``, ``g0``, a regime's ``prefill[...]``)."""
        return self.analysis.name

    @property
    def model_name(self) -> str:
        """The model's name in the store."""
        return self.analysis.model_name

    @property
    def state(self) -> str:
        """The state key its calls ran under (`capture.state`; ``""``: the default state)."""
        return self.analysis.state

    @property
    def structure_id(self) -> str:
        """The input structure shared by the group's calls."""
        return self.analysis.structure_id

    @property
    def structure_ids(self) -> tuple[str, ...]:
        """Every recorded input structure of the group: `structure_id`, and the structures that
        spell a renamed argument the other way (`capture.renames`)."""
        return self.analysis.structure_ids

    @property
    def calls(self) -> int:
        """Recorded calls the group stands for."""
        return self.analysis.calls

    @property
    def signatures(self) -> int:
        """Distinct recorded size vectors in the group."""
        return self.analysis.signatures

    @property
    def dims(self) -> list[DimInfo]:
        """The analysis' per-axis dims of the group."""
        return self.analysis.dims

    @property
    def relations(self) -> list[Relation]:
        """The analysis' relations of the group."""
        return self.analysis.relations

    @property
    def structure(self) -> RecordedStructure:
        """The group's typed recorded structure (`capture.analysis.groups.Group.structure`)."""
        return self.analysis.structure

    @property
    def args(self) -> tuple[Any, ...]:
        """Example positional arguments."""
        return self.example.args

    @property
    def kwargs(self) -> dict[str, Any]:
        """Example keyword arguments."""
        return self.example.kwargs

    @property
    def dynamic_shapes(self) -> Any:
        """The matching ``dynamic_shapes`` for torch.export."""
        return self.example.dynamic_shapes

    @property
    def program_name(self) -> str:
        """The name of the program that serves the group: its own, or `served_by`'s."""
        return self.served_by or self.name

    def noted(self, *notes: str) -> ExportGroup:
        """The group with `notes` added after its own.

        Example:
            >>> group = group.noted("exported with bounded hints")  # doctest: +SKIP
        """
        return dataclasses.replace(self, notes=(*self.notes, *notes)) if notes else self

    def module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to export: `model`, or a wrapper naming its ``**kwargs`` entries, and the
        keywords recorded under a name the library has renamed since (`capture.renames`: a store
        of transformers 5.23 passes ``past_key_values``, 5.24's forward declares ``cache`` and
        still takes the old name through ``**kwargs``): the program takes them as recorded.

        Example:
            >>> ep = torch.export.export(group.module(model), group.args, group.kwargs,
            ...                          dynamic_shapes=group.dynamic_shapes)  # doctest: +SKIP
        """
        form = self.example.form
        if not form.extra and not _renamed_since(model, form.keywords):
            return model
        return _named_call(model, form)

    def recorded(self) -> list[tuple[tuple[int, ...], int]]:
        """The distinct recorded size vectors of the group with their calls, most calls first."""
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
        """The group with its ``dynamic_shapes`` built again the way `retry` says (same options,
        example arguments, call form and notes): how `replay.pipeline.bounded` and
        `replay.pipeline.splitting` retry an export.

        Example:
            >>> hinted = group.reshaped(ShapeRetry(hinted=("seq",)))  # doctest: +SKIP
        """
        options = self.options
        if retry.unbounded:
            options = dataclasses.replace(options, named_dims=False)
        example = self.example
        shaped = group_shapes(
            self.analysis,
            options,
            example.representative.symbols,
            lambda specs: shapes.materialize(specs, retry.hinted, retry.floor, retry.auto),
            added=list(example.added),
            form=example.form,
        )
        example = dataclasses.replace(example, dynamic_shapes=shaped.dynamic_shapes)
        return dataclasses.replace(self, example=example, retry=retry)

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
        substitutes and the fills added, arranged in the program's call form.

        Args:
            args: The call's positional arguments.
            kwargs: Its keyword arguments.
            sizes: Every input tensor size of the call, in leaf order (the fills' shapes).

        Returns:
            ``(args, kwargs)`` for the serving program.

        Example:
            >>> args, kwargs = group.to_program(*real_call, sizes)  # doctest: +SKIP
        """
        example = self.example
        kwargs = {**kwargs, **{k: v.clone() for k, v in example.added.items()}}
        args, kwargs = fill_call(example.fills, tuple(args), kwargs, list(sizes))
        return callform.arrange(example.form, args, kwargs)


@dataclass(frozen=True)
class ExportInputs:
    """What `export_inputs` returns: one `ExportGroup` per call group, largest first.

    ``args``, ``kwargs`` and ``dynamic_shapes`` are those of the largest group.
    """

    model_name: str
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

    def group_for(
        self, structure_id: str, sizes: Iterable[int], state: str | None = None
    ) -> ExportGroup | None:
        """The group (or regime) a call of `structure_id` with these input sizes belongs to.

        A group split into regimes (`replay.pipeline.splitting`) has several groups of one
        structure: the call belongs to the one that recorded its sizes, else to the one whose
        recorded ranges hold them.

        Args:
            structure_id: The call's recorded input structure.
            sizes: Every input tensor size of the call, in leaf order (``calls.dims``).
            state: The call's state key (``calls.state``, null read as ``""``: the default
                state); None: whatever the state, for a store whose calls ran under one.

        Returns:
            The group, or None when no group of the structure holds the call.

        Raises:
            ReplayError: `state` is None and the structure's groups are of several states.

        Example:
            >>> inputs.group_for(row["in_structure"], row["dims"]).name  # doctest: +SKIP
            'prefill[input_ids_1<=4]'
        """
        key = tuple(int(s) for s in sizes)
        mine = [g for g in self.groups if structure_id in g.structure_ids]
        if state is not None:
            mine = [g for g in mine if g.state == (state or DEFAULT)]
        elif len({g.state for g in mine}) > 1:
            raise ReplayError(
                f"the groups of structure {structure_id} ran under several states: pass the "
                "call's state (calls.state) to group_for"
            )
        if len(mine) <= 1:
            return mine[0] if mine else None
        for g in mine:
            if key in {sizes for sizes, _ in g.recorded()}:
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
        raise ReplayError(f"no group {name!r} for model {self.model_name} (groups: {known})")


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
