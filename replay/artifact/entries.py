"""The manifest's entries, the export side: what `save` writes for each program and module.

`manifest_of` turns export results (`replay.pipeline.result.ExportResult`, read through the fields
the `SavedResult` protocol names, so this package never imports the export pipeline) into a
`replay.runtime.manifest.Manifest`: per program its group's recorded structure, guards, call form
and the recorded signatures its check failed (`rejected`: failed rows of kind ``recorded``,
matched by their sizes) and, for a group served by another group's program
(`replay.pipeline.merging`), that program and the inputs it fills per call; per module its coverage
table, errors and notes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from replay.runtime.conditions import Condition
from replay.runtime.coverage import KIND_RECORDED, TARGET_TORCH, CoverageRow
from replay.runtime.guards import ArtifactError, Axis, ProgramGuard, Relation
from replay.runtime.manifest import (
    FORMAT,
    FORMAT_STATES,
    PROGRAM_NAME,
    Manifest,
    ModuleEntry,
    ProgramEntry,
)
from replay.runtime.pt2.graph_check import BUILTIN_SPEC_TYPES

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from replay.inputs.exportgroup import ExportGroup, ExportInputs

__all__ = [
    "SavedResult",
    "manifest_of",
    "module_entry",
    "program_entry",
    "program_name",
    "rejected",
]


class SavedResult(Protocol):
    """What `save` reads of an export result (`replay.pipeline.result.ExportResult` has it all)."""

    @property
    def programs(self) -> Mapping[str, ExportedProgram]: ...
    @property
    def rows(self) -> Sequence[CoverageRow]: ...
    @property
    def inputs(self) -> ExportInputs: ...
    @property
    def complete(self) -> bool: ...
    @property
    def errors(self) -> Mapping[str, str]: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def source(self) -> str | None: ...


def program_name(module_name: str, group: str) -> str:
    """The program's name in the archive: ``decode``, or ``encoder.g0`` for a sub-module's.

    Raises:
        ArtifactError: The name cannot be an archive file name.

    Example:
        >>> program_name("encoder", "g0")
        'encoder.g0'
    """
    name = f"{module_name}.{group}" if module_name else group
    if not PROGRAM_NAME.match(name):
        raise ArtifactError(f"the group name {name!r} cannot name a program file of an artifact")
    return name


def _iso(ts: Any) -> str | None:
    return ts.isoformat() if isinstance(ts, datetime) else None


def _versions() -> dict[str, str | None]:
    import torch

    from capture import __version__ as capture_version

    try:
        from importlib.metadata import version

        transformers_version: str | None = version("transformers")
    except Exception:  # not installed: the artifact does not need it
        transformers_version = None
    return {
        "torch": torch.__version__,
        "transformers": transformers_version,
        "capture": capture_version,
    }


def _axes(group: ExportGroup) -> tuple[Axis, ...]:
    axes = tuple(
        Axis(d.path, int(d.axis), int(d.min), int(d.max), bool(d.dynamic), d.symbol)
        for d in group.dims
    )
    if group.structure.width != len(axes):
        raise ArtifactError(
            f"group {group.name}: {len(axes)} analysed dims for {group.structure.width} "
            "recorded tensor dims; the guards cannot be written"
        )
    return axes


def _pytree_types(spec: Any, out: set[str]) -> None:
    """The serialized names of the node types `spec` holds (builtin containers left out): what
    a loader must register before it rebuilds the program's inputs and outputs."""
    from capture import compat

    tables = compat.serialized_pytree_types()
    node = tables[1].get(spec.type) if tables is not None else None
    name = getattr(node, "serialized_type_name", None) if node is not None else None
    if name and str(name) not in BUILTIN_SPEC_TYPES:
        out.add(str(name))
    for child in spec.children():
        _pytree_types(child, out)


def rejected(
    group: ExportGroup, coverage: Sequence[CoverageRow], target: str = TARGET_TORCH
) -> dict[tuple[int, ...], str]:
    """The recorded signatures of `group` its program failed in the export's check.

    Rows of kind ``recorded`` and of `target` (a ``.pt2`` program answers for the torch rows,
    an ONNX file for the ``onnx`` rows) that are not covered, matched by the sizes they checked
    (never by their position among the group's rows: probes and payloads sit between them).
    """
    return {
        tuple(row.sizes): row.error or "not reproduced"
        for row in coverage
        if row.group == group.name
        and row.kind == KIND_RECORDED
        and row.target == target
        and not row.covered
        and row.sizes is not None
    }


def _assumptions(group: ExportGroup) -> tuple[Condition, ...]:
    """A ``ShapesSpec`` program's divisibility assumptions as guard conditions (the router
    then refuses a call outside them with the reason, before the program's own assert)."""
    from replay.inputs.specs.facts import divisibility_conditions

    if group.options.spec != "shapes":
        return ()
    return tuple(Condition(e, t) for e, t in divisibility_conditions(group.analysis))


def program_entry(
    module_name: str,
    group: ExportGroup,
    program: ExportedProgram,
    coverage: Sequence[CoverageRow],
    target: str = TARGET_TORCH,
) -> ProgramEntry:
    """The manifest entry of one call group served by `program` (its own, or the program of
    the group serving it, `replay.pipeline.merging`): its guard, call form, pytree types and fills.

    Args:
        module_name: The sub-module (``""``: the model itself).
        group: The call group.
        program: The torch program that serves it.
        coverage: The export's rows: the group's failed recorded signatures of `target`
            become the guard's ``rejected``.
        target: Which rows the entry's program answers for (``torch``; ``onnx`` for an ONNX
            set's file, `replay.onnx.entries`).

    Raises:
        ArtifactError: The group was exported with ``fill_missing`` substitutes, or cannot be
            described.
    """
    from replay.runtime.callform import CallForm

    if group.example.added:
        raise ArtifactError(
            f"group {group.name} was exported with fill_missing substitutes "
            f"({', '.join(group.example.added)}); an artifact cannot store them: export without "
            "fill_missing to save it"
        )
    types: set[str] = set()
    _pytree_types(program.call_spec.in_spec, types)
    _pytree_types(program.call_spec.out_spec, types)
    structure = group.structure
    guard = ProgramGuard(
        module_name=module_name,
        group=group.name,
        program=program_name(module_name, group.program_name),
        treespec=structure.treespec,
        leaves=tuple(structure.leaves),
        axes=_axes(group),
        relations=tuple(Relation(r.symbol, tuple(r.terms), int(r.offset)) for r in group.relations),
        rejected=rejected(group, coverage, target),
        conditions=_assumptions(group),
    )
    form = group.example.form
    return ProgramEntry(
        guard=guard,
        model_name=group.model_name,
        structure_id=group.structure_id,
        calls=group.calls,
        signatures=group.signatures,
        signature=structure.signature,
        n_args=structure.n_args,
        form=CallForm(
            tuple(form.positional), tuple(form.keywords), tuple(form.extra), form.var_positional
        ),
        pytree_types=tuple(sorted(types)),
        fills=group.example.fills,
        first_ts=_iso(group.analysis.first_ts),
        last_ts=_iso(group.analysis.last_ts),
        state=group.state,
    )


def module_entry(
    inputs: ExportInputs,
    source: str | None,
    complete: bool,
    coverage: Sequence[CoverageRow],
    errors: Mapping[str, str],
    notes: Sequence[str],
) -> ModuleEntry:
    """The manifest's entry of one exported module: its store and window, coverage and notes.

    Args:
        inputs: The export inputs (their analysed groups give the recorded window).
        source: The store's path or URI.
        complete: Whether the export is complete.
        coverage: Its coverage rows.
        errors: Group -> why it has no program.
        notes: What was done and why.
    """
    starts = [g.first_ts for g in inputs.analysed if g.first_ts]
    ends = [g.last_ts for g in inputs.analysed if g.last_ts]
    return ModuleEntry(
        model_name=inputs.model_name,
        store=source,
        first=_iso(min(starts)) if starts else None,
        last=_iso(max(ends)) if ends else None,
        complete=complete,
        coverage=tuple(coverage),
        errors=dict(errors),
        notes=tuple(notes),
    )


def manifest_of(results: Mapping[str, SavedResult], *, aoti: bool = False) -> Manifest:
    """The manifest of an artifact holding `results` (sub-module name -> result).

    Args:
        results: ``""`` -> the model's result, plus one per recorded sub-module.
        aoti: Whether the archive holds AOTInductor builds of every program.

    Returns:
        The typed manifest.

    Raises:
        ArtifactError: No result for the model itself, no program at all, or a group the
            manifest cannot describe.
    """
    programs: list[ProgramEntry] = []
    modules: dict[str, ModuleEntry] = {}
    for module_name, result in results.items():
        coverage = list(result.rows)
        for group in result.inputs.groups:
            # a merged group runs the program of the group serving it (`replay.pipeline.merging`)
            program = result.programs.get(group.program_name)
            if program is not None:
                programs.append(program_entry(module_name, group, program, coverage))
        modules[module_name] = module_entry(
            result.inputs, result.source, result.complete, coverage, result.errors, result.notes
        )
    if "" not in modules:
        raise ArtifactError("an artifact needs the model's own ExportResult (module name '')")
    if not programs:
        raise ArtifactError("no program to save: torch.export rejected every group")
    several = len({(p.module_name, p.state) for p in programs}) > len(
        {p.module_name for p in programs}
    )
    return Manifest(
        model_name=modules[""].model_name,
        created=datetime.now().astimezone().isoformat(),
        versions=_versions(),
        modules=modules,
        programs=tuple(programs),
        aoti=aoti,
        format=FORMAT_STATES if several else FORMAT,
    )
