"""export(): torch.export (and optionally ONNX) from a store, checked on recorded signatures.

For each call group of the model (`replay.inputs.builder.export_inputs`), one
``torch.export.export`` of ``group.module(model)`` with the group's example and ``dynamic_shapes``
(non-strict, the default of torch.export). Then the **coverage check**: for every distinct recorded
signature of the group, fresh inputs of exactly those sizes and integer value ranges are rebuilt
twice (a forward may mutate its inputs: a DynamicCache grows in place), the exported program
(``ep.module()``) runs on one copy and the eager model on the other, as the recorded calls passed
them, and every output tensor (flattened with torch's pytree) is compared. A signature is
covered when both ran and agree within ``atol + rtol * max|eager|``. **Probes** are checked the
same way: a few size vectors never recorded, inside each dynamic dim's recorded range and at
its ends (`replay.inputs.select.probes`, at most ``probes`` per group), as rows of kind ``probe``.

A group whose recorded range torch.export cuts (a sliding window, a branch on a size) is split
at the cut and each side, a **regime**, exported on its own (`replay.pipeline.splitting`); a group
lacking an optional input another group passes is served by that group's program with the input
filled, where the check proves it on its own signatures, probes and payloads
(`replay.pipeline.merging`); groups that pass more inputs are exported first for that reason. A
group (or regime) torch.export rejects has no program; its signatures are in the coverage table,
uncovered, with the error. With ``onnx=PATH`` the result then takes the step
``ExportResult.save(PATH)`` takes: every program converted to ONNX and every row checked again
on its ONNX file with onnxruntime (rows of target ``onnx``, `replay.onnx.target`).
`ExportResult.complete` is true when every row (every kind, every target) is covered and every
option asked for was honoured.

The store is opened once (`replay.inputs.builder.reading`) and that reader is what every step
reads: the inputs, the merges' and the payload check's sampled calls, the sub-modules. Nothing
is printed: the CLI (`cli.export`) renders the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from typing import TYPE_CHECKING, Any

import torch

from capture import schema
from capture.output_paths import check_file
from capture.state.entering import StateNotEntered, entered, own_weights
from replay.check.payload_rows import payload_rows
from replay.inputs.builder import ExportGroup, inputs_for, reading
from replay.inputs.options import ExportOptions, takes_options
from replay.onnx.target import output_path, require_one_state, require_onnx
from replay.pipeline.binding import check_signature
from replay.pipeline.chain import Job, Part, export_group, refused
from replay.pipeline.result import ExportResult, Origin, with_onnx
from replay.pipeline.submodules import recorded_submodules, submodule
from replay.runtime.coverage import (
    COVERAGE_SCHEMA,
    KIND_PROBE,
    KIND_RECORDED,
    CoverageRow,
)

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from capture.store.reader import StoreReader
    from replay.inputs.builder import StoreSource

__all__ = [
    "ExportResult",
    "export",
    "export_with",
    "check_signature",
    "COVERAGE_SCHEMA",
    "require_onnx",
    "output_path",
    "KIND_RECORDED",
    "KIND_PROBE",
]

logger = logging.getLogger(__name__)


def _export_groups(job: Job) -> list[tuple[int, Part]]:
    """Every group through the chain (`replay.pipeline.chain.export_group`), each part with
    its group's index, in the order exported: state by state, the model put in each recorded
    state (`capture.state.entering`; a state it cannot enter has its groups refused, with the
    reason), and within a state the groups that pass more inputs first, so that a group lacking
    one may be served by their program (`replay.pipeline.merging`; never by another state's)."""
    groups = list(job.inputs.groups)
    order = sorted(range(len(groups)), key=lambda i: (groups[i].state, _absent(groups[i]), i))
    parts: list[tuple[int, Part]] = []
    for state, members in itertools.groupby(order, key=lambda i: groups[i].state):
        indices = list(members)
        with contextlib.ExitStack() as stack:
            try:
                done = stack.enter_context(entered(job.model, state, job.options.set_state))
            except StateNotEntered as e:
                parts += [(i, refused(job, groups[i], str(e))) for i in indices]
                continue
            mine: list[tuple[int, Part]] = []
            for index in indices:
                served = [(p.group, p.program) for _, p in mine if p.program is not None]
                mine += [(index, part) for part in export_group(job, groups[index], served)]
            own_weights((p.program for _, p in mine if p.program is not None), done)
            parts += mine
    return parts


def _place(indexed: tuple[int, Part]) -> int:
    return indexed[0]


def _absent(group: ExportGroup) -> int:
    """How many inputs the group's calls leave out (missing or None)."""
    return sum(
        leaf.kind in (schema.KIND_MISSING, schema.KIND_NONE) for leaf in group.structure.leaves
    )


@takes_options(field.name for field in dataclasses.fields(ExportOptions))
def export(
    model: Any, store: StoreSource, model_name: str | None = None, **options: Any
) -> ExportResult:
    """Exports `model` once per recorded call group and checks every recorded signature.

    Besides the recorded signatures, up to `probes` unseen size vectors per group inside the
    recorded ranges (`replay.inputs.select.probes`) are checked the same way: coverage rows of
    kind ``probe`` tell whether the program generalizes inside the range it claims.

    Args:
        model: The model (a `torch.nn.Module`) whose calls were recorded.
        store: A store path (or URI) or an open `capture.Store`.
        model_name: Its name in the store; default: the only model, or the model's class name.
        groups: Export only these call groups (default: all of them).
        onnx: Also write the ONNX set at this path, as `ExportResult.save` writes it: every
            file checked with onnxruntime on the same rows (coverage rows of target ``onnx``,
            which count in ``complete``). Needs ``capture[onnx]``.
        modules: Also export every sub-module recorded with ``Recorder(modules=...)`` (store
            models ``<model_name>.<module_name>``; `replay.pipeline.submodules`) with the same
            options, into ``ExportResult.modules``; ``complete`` then covers them too, and
            ``save`` writes them in the same artifact.
        strict: Passed to ``torch.export.export``.
        atol: Absolute tolerance of the output comparison.
        rtol: Relative tolerance (times the largest eager magnitude of the output).
        set_batch_dimension_for: See `replay.export_inputs`.
        named_dims: See `replay.export_inputs`. When torch.export rejects the named Dims,
            bounded ``Dim.DYNAMIC(min=, max=)`` hints are tried (`replay.pipeline.bounded`); when
            none is accepted the group is exported with ``Dim.DYNAMIC`` and listed in
            ``not_honoured`` (``complete`` is then False).
        keyword_only: See `replay.export_inputs`.
        value_if_missing: See `replay.export_inputs`.
        fill_missing: See `replay.export_inputs`.
        seed: Seed of the rebuilt tensors.
        device: Device of the rebuilt tensors (default: the model's).
        probes: Most probes checked per group (default 4; 0: recorded signatures only).
        max_payloads: Check at most this many sampled real calls, the newest ones
            (`replay.check.payload_rows`); 0 skips them.
        max_payload_bytes: Most bytes of tensors a sampled call's file may hold; a bigger one
            is a not-covered row, never read (default: the recorder's default).
        max_regimes: Where torch.export cuts a group's recorded range, export each side as a
            regime of its own, at most this many per group (`replay.pipeline.splitting`).
        merge: Serve a group that lacks an optional input with the program of a group that
            passes it, the input filled, where the check proves it (`replay.pipeline.merging`).
        time_budget: Seconds of torch.export per call group (default 300; None: no bound):
            half for the dynamic exports, the rest for the static fallback
            (`replay.pipeline.budget.deadline`); a group past it says what served it instead.
        max_static: Most static programs per group, one per recorded signature its dynamic
            program does not serve (`replay.pipeline.budget.static`); 0: no static fallback.
        set_state: For a store recorded with ``Recorder(..., state=fn)``: ``set_state(items)``
            puts the model in a recorded state, ``set_state(None)`` back; each state's groups
            are exported and checked in that state (`capture.state.entering`; peft adapters
            and ``training`` are entered without it).
        spec: ``"dims"`` (default): ``torch.export.Dim`` shapes, with the retries and regimes
            above; ``"shapes"``: torch's ``ShapesSpec`` learned from the store (torch >= 2.14,
            `replay.inputs.specs.shapesspec`), every dynamic size unbacked, never retried.
        allow_ops: Operators the programs may call beyond the allow-list, as the artifact will
            be loaded with (``replay.load(path, allow_ops=...)``): a program the loader would
            refuse is not covered, with its reason (`replay.artifact.loadable`).

    Returns:
        An `ExportResult`.

    Raises:
        StoreNotFound, EmptyStore, UnknownModel: The store or model cannot be found.
        ReplayError: ``model.forward`` no longer matches the recordings, the recordings cannot
            be rebuilt, ``onnx`` is asked without the ONNX dependencies, or ``spec="shapes"``
            on a torch without ``ShapesSpec``.

    Example:
        >>> result = export(model, "capture-store")  # doctest: +SKIP
        >>> result.complete, result.coverage.column("covered").to_pylist()  # doctest: +SKIP
        (True, [True, True, True])
    """
    return export_with(model, store, model_name, ExportOptions.of(**options))


def export_with(
    model: Any, store: StoreSource, model_name: str | None, options: ExportOptions
) -> ExportResult:
    """`export` with its options already built (``capture export`` builds them itself).

    The store is opened once (or read as it is, when it is an open store) and every step of
    the export (inputs, payload rows, sub-modules, ONNX check) reads that one handle.

    Args:
        model: The model (a `torch.nn.Module`) whose calls were recorded.
        store: A store path (or URI) or an open `capture.Store`.
        model_name: Its name in the store; default: the only model, or the model's class name.
        options: The replay's options.

    Returns:
        An `ExportResult`.

    Raises:
        StoreNotFound, EmptyStore, UnknownModel: The store or model cannot be found.
        ReplayError: See `export`.
    """
    options = _prepared(model, options)
    with reading(store) as opened:
        result = _exported(model, opened, model_name, options)
        modules = _submodules(model, opened, store, result, options)
        result = dataclasses.replace(result, modules=modules, origin=Origin(model, store, options))
        if options.onnx is None:
            return result
        return with_onnx(result, options.onnx, modules, opened)


def _exported(
    model: Any, store: StoreReader, model_name: str | None, options: ExportOptions
) -> ExportResult:
    """The model's groups exported and checked (its sub-modules aside)."""
    inputs = inputs_for(store, model_name, options, model=model)
    if options.onnx is not None:
        require_one_state(inputs)
    check_signature(model, inputs.groups)
    parts = _export_groups(Job(model, store, inputs, options))
    # The groups as exported: regimes and static programs in their group's place.
    inputs = dataclasses.replace(inputs, groups=[p.group for _, p in sorted(parts, key=_place)])
    job = Job(model, store, inputs, options)
    exported = tuple(p for _, p in parts)
    programs = {p.group.name: p.program for p in exported if p.program is not None}
    errors = {p.group.name: p.error for p in exported if p.error is not None}
    payloads, notes = _payload_rows(job, programs, errors)
    return ExportResult(exported, inputs, tuple(payloads), tuple(notes), source=_source(store))


def _source(store: StoreReader) -> str:
    """The store's path or URI, as the artifact names it."""
    return str(store.path)


def _submodules(
    model: Any,
    store: StoreReader,
    source: StoreSource,
    result: ExportResult,
    options: ExportOptions,
) -> dict[str, ExportResult]:
    """Every group of each recorded sub-module (``modules=True``), with the model's options
    (no ONNX of their own: their files join the model's set) and the same open store."""
    if not options.modules:
        return {}
    sub_options = dataclasses.replace(options, groups=None, onnx=None, modules=False)
    name = result.inputs.model_name
    subs = {m: submodule(model, m) for m in recorded_submodules(store, name)}
    return {
        module_name: dataclasses.replace(
            _exported(module, store, f"{name}.{module_name}", sub_options),
            origin=Origin(module, source, sub_options),
        )
        for module_name, module in subs.items()
    }


def _prepared(model: Any, options: ExportOptions) -> ExportOptions:
    """The options checked before any work (the ONNX extra and path), with the model's device
    when none is given."""
    if options.onnx is not None:
        require_onnx()
        check_file(options.onnx, what="ONNX set", example="model.onnx")  # before the export
    if options.device is None and isinstance(model, torch.nn.Module):
        first = next(iter(model.parameters()), None)
        if first is not None:
            return dataclasses.replace(options, device=str(first.device))
    return options


def _payload_rows(
    job: Job, programs: dict[str, ExportedProgram], errors: dict[str, str]
) -> tuple[list[CoverageRow], list[str]]:
    """The rows of the sampled real calls (`replay.check.payload_rows`), state by state: each
    call checked with the model in the state it ran under (its payload file says which), against
    the programs of that state's groups."""
    states = sorted({g.state for g in job.inputs.groups})
    options = job.options
    several = len(states) > 1
    rows: list[CoverageRow] = []
    notes: list[str] = []
    for state in states:
        mine = [g for g in job.inputs.groups if g.state == state]
        try:
            with entered(job.model, state, options.set_state):
                found, said = payload_rows(
                    job.model,
                    job.store,
                    dataclasses.replace(job.inputs, groups=mine) if several else job.inputs,
                    programs,
                    errors,
                    atol=options.atol,
                    rtol=options.rtol,
                    limit=options.max_payloads,
                    max_bytes=options.max_payload_bytes,
                    device=options.device,
                    state=state if several else None,
                )
        except StateNotEntered as e:
            notes.append(f"payloads: not checked ({e})")
            continue
        rows += found
        notes += [n for n in said if n not in notes]
    return rows, notes
