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
at the cut and each side, a **regime**, exported on its own (`replay.pipeline.regimes`); a group
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

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from capture import compat, schema
from capture.errors import ReplayError
from capture.output_paths import check_file
from capture.pytree import nodes
from capture.pytree.cachespec import blocking_reason
from replay.check.checking import coverage_rows
from replay.check.payload_rows import payload_rows
from replay.inputs.builder import ExportGroup, inputs_for
from replay.inputs.options import ExportOptions
from replay.onnx.target import output_path, write_onnx
from replay.pipeline.binding import check_signature
from replay.pipeline.bounded import export_bounded, export_unbounded
from replay.pipeline.guard_sources import fix_guard_sources
from replay.pipeline.merging import merge
from replay.pipeline.model_match import eager_failure
from replay.pipeline.regimes import Exported, export_regimes
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
_TORCH_LOGS_HINT = 'For more information, run with TORCH_LOGS="+dynamic".'


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


def _export_group(
    model: Any, group: ExportGroup, strict: bool
) -> tuple[ExportedProgram | None, BaseException | None]:
    """(program, None) or (None, the error torch.export raised)."""
    try:
        with nodes.register_flattening_functions():
            program = torch.export.export(
                group.module(model),
                group.args,
                kwargs=group.kwargs,
                dynamic_shapes=group.dynamic_shapes,
                strict=strict,
            )
    except Exception as e:  # torch.export rejected this group: reported, the others go on
        return None, e
    fix_guard_sources(program)
    return program, None


def _summary(e: BaseException) -> str:
    """``Type: first line`` plus the first ``- ...`` detail line torch gives, if any."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    first = (lines[0] if lines else "").replace(_TORCH_LOGS_HINT, "").strip()
    text = f"{type(e).__name__}: {first}".rstrip(": ")
    detail = next((line for line in lines[1:] if line.startswith("- ")), None)
    return f"{text} {detail}" if detail else text


def _absent(group: ExportGroup) -> int:
    """How many inputs the group's calls leave out (missing or None)."""
    return sum(
        leaf.kind in (schema.KIND_MISSING, schema.KIND_NONE) for leaf in group.structure.leaves
    )


def export(
    module: Any,
    store: Any,
    model: str | None = None,
    *,
    groups: Iterable[str] | None = ExportOptions.groups,
    onnx: str | os.PathLike[str] | None = ExportOptions.onnx,
    modules: bool = ExportOptions.modules,
    strict: bool = ExportOptions.strict,
    atol: float = ExportOptions.atol,
    rtol: float = ExportOptions.rtol,
    set_batch_dimension_for: bool | Iterable[str | int] | None = (
        ExportOptions.set_batch_dimension_for
    ),
    named_dims: bool = ExportOptions.named_dims,
    keyword_only: bool = ExportOptions.keyword_only,
    value_if_missing: Mapping[str, torch.Tensor] | None = None,
    fill_missing: bool = ExportOptions.fill_missing,
    seed: int = ExportOptions.seed,
    device: str | None = ExportOptions.device,
    probes: int = ExportOptions.probes,
    max_payloads: int = ExportOptions.max_payloads,
    max_payload_bytes: int = ExportOptions.max_payload_bytes,
    max_regimes: int = ExportOptions.max_regimes,
    merge: bool = ExportOptions.merge,
    spec: str = ExportOptions.spec,
) -> ExportResult:
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
            per group (`replay.pipeline.regimes`); 1 never splits.
        merge: Serve a group that lacks an optional input (generate()'s batch-1 calls without
            ``attention_mask``) with the program of a group that passes it, the input
            filled, where the check proves it on the group's own signatures, probes and
            payloads (`replay.pipeline.merging`); False: one program per group.
        spec: ``"dims"`` (default): ``torch.export.Dim`` shapes, with the retries and regimes
            above; ``"shapes"``: torch's ``ShapesSpec`` learned from the store (torch >= 2.14,
            `replay.inputs.specs.shapesspec`): every dynamic size unbacked, so a group is never
            split and 0 or 1 is never specialized (the notes name the dims recorded there),
            trusted divisors as ``assumptions`` (checked by the program and by the router of
            a saved artifact). A group torch rejects in this form is reported, never retried
            in the ``Dim`` form.

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
    options = ExportOptions.of(
        groups=groups,
        onnx=onnx,
        modules=modules,
        strict=strict,
        atol=atol,
        rtol=rtol,
        set_batch_dimension_for=set_batch_dimension_for,
        named_dims=named_dims,
        keyword_only=keyword_only,
        value_if_missing=value_if_missing,
        fill_missing=fill_missing,
        seed=seed,
        device=device,
        probes=probes,
        max_payloads=max_payloads,
        max_payload_bytes=max_payload_bytes,
        max_regimes=max_regimes,
        merge=merge,
        spec=spec,
    )
    return export_with(module, store, model, options)


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
    if options.onnx is not None:
        require_onnx()
        check_file(options.onnx, what="ONNX set", example="model.onnx")  # before the export
    if options.device is None and isinstance(module, torch.nn.Module):
        first = next(iter(module.parameters()), None)
        if first is not None:
            options = dataclasses.replace(options, device=str(first.device))
    inputs = inputs_for(store, model, options, module=module)
    check_signature(module, inputs.groups)
    atol, rtol = options.atol, options.rtol
    programs: dict[str, ExportedProgram] = {}
    errors: dict[str, str] = {}
    notes: list[str] = []
    rows: list[CoverageRow] = []
    onnx_files: dict[str, str] = {}
    not_honoured: dict[str, str] = {}
    # Groups that pass more inputs first: a group lacking one may then be served by their
    # program, the input filled, where the check proves it (`replay.pipeline.merging`).
    groups = list(inputs.groups)
    order = sorted(range(len(groups)), key=lambda i: (_absent(groups[i]), i))
    made: dict[int, list[ExportGroup]] = {}
    served: list[tuple[ExportGroup, ExportedProgram]] = []
    for index in order:
        group = groups[index]
        blocked = blocking_reason(group.structure)
        if blocked is not None:
            # A class we cannot rebuild exactly is never called covered; the
            # reason names it (a refused cache layer, or any other opaque leaf).
            errors[group.name] = blocked
            rows.extend(coverage_rows(module, group, None, errors[group.name], atol, rtol, 0))
            made[index] = [group]
            continue
        merged = merge(module, group, served, options, store, inputs) if options.merge else []
        if isinstance(merged, tuple):
            group, proof = merged
            made[index] = [group]
            notes.extend(f"{group.name}: {note}" for note in group.notes)
            rows.extend(proof)
            continue
        failure = eager_failure(module, group)
        if failure is not None:  # not the recorded model: torch.export would fail deep inside
            errors[group.name] = failure
            logger.warning("group %s not exported: %s", group.name, failure)
            rows.extend(coverage_rows(module, group, None, failure, atol, rtol, options.probes))
            made[index] = [group]
            continue
        made[index] = []
        if options.spec == "shapes":  # unbacked sizes: torch cuts no range, nothing to retry
            program, failure = _export_group(module, group, options.strict)
            outcomes = [Exported(group, program, failure)]
        else:
            outcomes = export_regimes(
                group,
                options,
                inputs.analysed,
                lambda g: _export_group(module, g, options.strict),
                lambda g, e: _retry(module, g, e, options),
            )
        for done in outcomes:
            group = done.group
            group.notes.extend(merged)  # why no other group's program serves it
            made[index].append(group)
            if done.not_honoured is not None:
                not_honoured[group.name] = done.not_honoured
            notes.extend(f"{group.name}: {note}" for note in group.notes)
            if done.error is not None and done.program is None:
                errors[group.name] = f"torch.export failed: {_summary(done.error)}"
                logger.warning("export of group %s failed: %s", group.name, errors[group.name])
            if done.program is not None:
                programs[group.name] = done.program
                served.append((group, done.program))
            with nodes.register_flattening_functions():
                rows.extend(
                    coverage_rows(
                        module,
                        group,
                        done.program,
                        errors.get(group.name),
                        atol,
                        rtol,
                        options.probes,
                    )
                )
    inputs.groups[:] = [g for index in range(len(groups)) for g in made[index]]
    found, payload_notes = payload_rows(
        module,
        store,
        inputs,
        programs,
        errors,
        atol=atol,
        rtol=rtol,
        limit=options.max_payloads,
        max_bytes=options.max_payload_bytes,
        device=options.device,
    )
    rows.extend(found)
    notes.extend(payload_notes)
    complete = bool(rows) and all(r.covered for r in rows) and not not_honoured
    source = str(getattr(store, "path", store)) if store is not None else None
    if options.onnx is not None:
        # Every ONNX file is checked on the same rows; its rows count in `complete`.
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
        )
        onnx_files = outcome.files
        rows.extend(outcome.rows)
        notes.extend(outcome.notes)
        complete = complete and all(r.covered for r in outcome.rows)
    coverage = coverage_table(rows)
    result = ExportResult(
        programs,
        coverage,
        notes,
        complete,
        inputs,
        errors,
        onnx_files,
        not_honoured=not_honoured,
        source=source,
    )
    if options.modules:
        # Every group of each recorded sub-module, with the model's options; no ONNX.
        sub_options = dataclasses.replace(options, groups=None, onnx=None, modules=False)
        for name in recorded_submodules(store, inputs.model):
            result.modules[name] = export_with(
                submodule(module, name), store, f"{inputs.model}.{name}", sub_options
            )
        result.complete = complete and all(m.complete for m in result.modules.values())
    return result


def _retry(
    module: Any, group: ExportGroup, error: BaseException, options: ExportOptions
) -> tuple[ExportGroup, ExportedProgram | None, BaseException | None, str | None]:
    """The retries of a group whose named dims torch.export rejected (`replay.pipeline.bounded`).

    Returns:
        ``(group exported, program, error, why named dims are not honoured)``; the group and
        `error` unchanged without named dims.
    """

    def attempt(g: ExportGroup) -> tuple[ExportedProgram | None, BaseException | None]:
        return _export_group(module, g, options.strict)

    if not options.named_dims or group.analysis is None:
        return group, None, error, None
    # torch.export could not prove a guard within the named ranges (e.g. the Min(...) stride
    # guard of repeat_kv's reshape on torch 2.13): bounded hints keep the recorded ranges and
    # let torch check the guard at run time.
    bounded, program, failure = export_bounded(group, error, attempt, _summary)
    if program is None and failure is not None and compat.is_constraint_violation(failure):
        # No bounded form was accepted: reported as not honoured, never silently.
        return export_unbounded(bounded, failure, attempt, _summary)
    return bounded, program, failure, None
