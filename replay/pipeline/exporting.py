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
uncovered, with the error. With ``onnx=PATH`` every program is also converted to ONNX and every
row is checked again on its ONNX file with onnxruntime (rows of target ``onnx``,
`replay.onnx.target`). `ExportResult.complete` is true when every row (every kind, every
target) is covered and every option asked for was honoured.

Nothing is printed: the CLI (`cli.export`) renders the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
from typing import TYPE_CHECKING, Any

import torch

from capture import schema
from capture.errors import ReplayError
from capture.output_paths import check_file
from capture.state import state_label
from capture.state.entering import StateNotEntered, entered, own_weights
from replay.check.payload_rows import payload_rows
from replay.inputs.builder import ExportGroup, inputs_for
from replay.inputs.options import ExportOptions, takes_options
from replay.onnx.target import OnnxPart, output_path, write_onnx
from replay.pipeline.binding import check_signature
from replay.pipeline.chain import Job, Part, export_group, refused
from replay.pipeline.result import ExportResult
from replay.pipeline.submodules import recorded_submodules, submodule
from replay.runtime.coverage import (
    COVERAGE_SCHEMA,
    KIND_PROBE,
    KIND_RECORDED,
    CoverageRow,
    coverage_table,
)

if TYPE_CHECKING:
    from torch.export import ExportedProgram

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

ONNX_HINT = "pip install capture[onnx]"


def require_onnx() -> None:
    """Checks that the optional ONNX dependencies are installed.

    Raises:
        ReplayError: onnx, onnxscript or onnxruntime is missing; the message names the extra
            to install.
    """
    import importlib.util

    missing = [
        m for m in ("onnx", "onnxscript", "onnxruntime") if importlib.util.find_spec(m) is None
    ]
    if missing:
        raise ReplayError(
            f"ONNX export needs {' and '.join(missing)}, which are not installed; run `{ONNX_HINT}`"
        )


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
                done = stack.enter_context(entered(job.module, state, job.options.set_state))
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
def export(module: Any, store: Any, model: str | None = None, **options: Any) -> ExportResult:
    """Exports `module` once per recorded call group and checks every recorded signature.

    Besides the recorded signatures, up to `probes` unseen size vectors per group inside the
    recorded ranges (`replay.inputs.select.probes`: the ends of every dynamic dim together, a value
    between recorded ones) are checked the same way: coverage rows of kind ``probe`` tell
    whether the program generalizes inside the range it claims.

    Args:
        module: The model (a `torch.nn.Module`) whose calls were recorded.
        store: A store path (or URI) or an open `capture.Store`.
        model: Its name in the store; default: the only model, or the module's class name.
        groups: Export only these call groups (default: all of them).
        onnx: Also write ONNX (``torch.onnx.export(..., dynamo=True)``): this path for one
            group, ``<stem>.<group>.onnx`` for several, their shared weights ``PATH.data`` and
            a manifest ``PATH.json``; every file is checked with onnxruntime on the same rows
            (coverage rows of target ``onnx``) and ``replay.load(PATH)`` serves the set
            (`replay.onnx`). Needs ``capture[onnx]``.
        modules: Also export every sub-module recorded with ``Recorder(modules=...)`` (store
            models ``<model>.<name>``; the sub-module is ``module.get_<name>()`` or
            ``module.get_submodule(name)``), with the same options for all its groups and no
            ONNX, into ``ExportResult.modules``; ``complete`` then covers them too, and
            ``save`` stores them in the same artifact.
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
        max_payloads: Check at most this many sampled real calls (`replay.check.payload_rows`;
        stores
            recorded with ``payloads=``), the newest ones; 0 skips them.
        max_payload_bytes: Most bytes of tensors a sampled call's file may hold; a bigger one
            is a not-covered row, never read (default 16 MiB, the recorder's default
            ``Payloads.max_call_bytes``; pass what the store was recorded with).
        max_regimes: Where torch.export cuts a group's recorded range (a sliding window, a
            branch on a size), export each side as a regime of its own, at most this many
            per group (`replay.pipeline.splitting`); 1 never splits.
        merge: Serve a group that lacks an optional input (generate()'s batch-1 calls without
            ``attention_mask``) with the program of a group that passes it, the input
            filled, where the check proves it on the group's own signatures, probes and
            payloads (`replay.pipeline.merging`); False: one program per group.
        time_budget: Seconds of torch.export per call group (default 300; None: no bound).
            Each export is stopped at the deadline, in this process
            (`replay.pipeline.budget.deadline`): the dynamic exports (plain, bounded retries,
            regimes) may use half of the budget, the static fallback the rest. A group past
            it has the error ``torch.export ran past the time budget`` and its notes say
            what served its signatures instead.
        max_static: Most static programs per group, one per recorded signature its dynamic
            program does not serve (past the budget, or cut where regimes cannot serve),
            most calls first (`replay.pipeline.budget.static`); 0: no static fallback.
        set_state: For a store recorded with ``Recorder(..., state=fn)``: ``set_state(items)``
            puts the model in the state whose declared items are ``items`` (a dict), and
            ``set_state(None)`` back, around the export of that state's groups. peft adapters
            (``set_adapter``, ``disable_adapter``) and ``training`` are entered without it.
            Each recorded state's groups are exported and checked with the model in that
            state (`capture.state.entering`); a state it cannot be put in has its groups not
            covered, with the reason.
        spec: ``"dims"`` (default): ``torch.export.Dim`` shapes, with the retries and regimes
            above; ``"shapes"``: torch's ``ShapesSpec`` learned from the store (torch >= 2.14,
            `replay.inputs.specs.shapesspec`): every dynamic size unbacked, so a group is never
            split and 0 or 1 is never specialized (the notes name the dims recorded there),
            trusted divisors as ``assumptions`` (checked by the program and by the router of
            a saved artifact). A group torch rejects in this form is reported, never retried
            in the ``Dim`` form.
        allow_ops: Operator namespaces, operators or overloads the programs may call beyond
            the allow-list (`replay.runtime.pt2.operators`), as the artifact will be loaded
            with (``replay.load(path, allow_ops=...)``). Every program goes through the
            loader's validation before its rows are claimed (`replay.artifact.loadable`): one
            it would refuse is not covered, with the loader's reason.

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
    return export_with(module, store, model, ExportOptions.of(**options))


def export_with(module: Any, store: Any, model: str | None, options: ExportOptions) -> ExportResult:
    """`export` with its options already built (``capture export`` builds them itself).

    Args:
        module: The model whose calls were recorded.
        store: A store path (or URI) or an open `capture.Store`.
        model: Its name in the store; default: the only model, or the module's class name.
        options: The replay's options.

    Returns:
        An `ExportResult`.

    Raises:
        StoreNotFound, EmptyStore, UnknownModel: The store or model cannot be found.
        ReplayError: See `export`.
    """
    options = _prepared(module, options)
    inputs = inputs_for(store, model, options, module=module)
    states = sorted({g.state for g in inputs.groups})
    if options.onnx is not None and len(states) > 1:
        raise ReplayError(
            f"onnx= is not available for calls of several states "
            f"({', '.join(state_label(s or None) for s in states)}): export the .pt2 "
            "artifact, which serves each state, or pass groups= of one state"
        )
    check_signature(module, inputs.groups)
    parts = _export_groups(Job(module, store, inputs, options))
    # The groups as exported: regimes and static programs in their group's place.
    inputs = dataclasses.replace(inputs, groups=[p.group for _, p in sorted(parts, key=_place)])
    return _result(Job(module, store, inputs, options), [p for _, p in parts])


def _submodules(job: Job) -> dict[str, ExportResult]:
    """Every group of each recorded sub-module (``modules=True``), with the model's options;
    their ONNX files (with ``onnx=``) join the model's set."""
    if not job.options.modules:
        return {}
    sub_options = dataclasses.replace(job.options, groups=None, onnx=None, modules=False)
    model = job.inputs.model
    return {
        name: export_with(submodule(job.module, name), job.store, f"{model}.{name}", sub_options)
        for name in recorded_submodules(job.store, model)
    }


def _prepared(module: Any, options: ExportOptions) -> ExportOptions:
    """The options checked before any work (the ONNX extra and path), with the model's device
    when none is given."""
    if options.onnx is not None:
        require_onnx()
        check_file(options.onnx, what="ONNX set", example="model.onnx")  # before the export
    if options.device is None and isinstance(module, torch.nn.Module):
        first = next(iter(module.parameters()), None)
        if first is not None:
            return dataclasses.replace(options, device=str(first.device))
    return options


def _result(job: Job, parts: list[Part]) -> ExportResult:
    """The result of the exported parts: their programs, errors and notes, their rows and
    those of the sampled real calls (and of the ONNX files, with ``onnx=``)."""
    store, inputs, options = job.store, job.inputs, job.options
    programs = {p.group.name: p.program for p in parts if p.program is not None}
    errors = {p.group.name: p.error for p in parts if p.error is not None}
    not_honoured = {p.group.name: p.not_honoured for p in parts if p.not_honoured is not None}
    notes = [f"{p.group.name}: {note}" for p in parts for note in p.group.notes]
    rows = [row for p in parts for row in p.rows]
    found, payload_notes = _payload_rows(job, programs, errors)
    rows += found
    notes += payload_notes
    complete = bool(rows) and all(r.covered for r in rows) and not not_honoured
    source = str(getattr(store, "path", store)) if store is not None else None
    modules = _submodules(job)
    onnx_files: dict[str, str] = {}
    if options.onnx is not None:
        # Every ONNX file is checked on the same rows; its rows count in `complete`.
        onnx_files, onnx_rows, onnx_notes = _onnx(job, programs, errors, rows, complete, modules)
        rows += onnx_rows
        notes += onnx_notes
        complete = complete and all(r.covered for r in onnx_rows)
    return ExportResult(
        programs,
        coverage_table(rows),
        notes,
        complete and all(m.complete for m in modules.values()),
        inputs,
        errors,
        onnx_files,
        not_honoured=not_honoured,
        source=source,
        modules=modules,
    )


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
            with entered(job.module, state, options.set_state):
                found, said = payload_rows(
                    job.module,
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


def _onnx(
    job: Job,
    programs: dict[str, ExportedProgram],
    errors: dict[str, str],
    rows: list[CoverageRow],
    complete: bool,
    modules: dict[str, ExportResult],
) -> tuple[dict[str, str], list[CoverageRow], list[str]]:
    """The ONNX set of the model and its sub-modules: files, rows and notes; each sub-module's
    result gains its files, rows and notes."""
    module, store, inputs, options = job.module, job.store, job.inputs, job.options
    parts = [
        OnnxPart(
            name,
            submodule(module, name),
            sub.inputs,
            sub.programs,
            sub.errors,
            CoverageRow.from_table(sub.coverage),
            sub.complete,
        )
        for name, sub in modules.items()
    ]
    source = str(getattr(store, "path", store)) if store is not None else None
    with entered(module, next(iter({g.state for g in inputs.groups}), ""), options.set_state):
        outcome = write_onnx(
            module,
            store,
            inputs,
            programs,
            errors,
            rows,
            options,
            complete_torch=complete,
            source=source,
            submodules=parts,
        )
    for part in parts:
        sub = modules[part.name]
        written = part.outcome
        sub.coverage = coverage_table([*part.torch_rows, *written.rows])
        sub.onnx = written.files
        sub.notes.extend(written.notes)
        sub.complete = sub.complete and all(r.covered for r in written.rows)
    return outcome.files, list(outcome.rows), list(outcome.notes)
