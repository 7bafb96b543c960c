"""Coverage rows of kind ``payload``: the exported programs run on sampled *real* calls.

A store recorded with ``Recorder(..., payloads=RATE)`` holds the real tensors of a sampled few calls
(`capture.store.payload_files`). For each such call (the newest `limit` files), `payload_rows`:

1. finds the exported group whose input structure is the call's (``in_structure``); a call whose
   structure matches no exported group is a not-covered row saying so (a call of a group left out
   with ``groups=`` is skipped);
2. rebuilds the call's ``(args, kwargs)`` from the group's structure rows: tensors from the file
   (``in/<leaf>``), scalars and Nones from the structure, the treespec (transformers caches
   included, through `capture.pytree.nodes`) around them; no pickle, nothing evaluated;
3. runs it through eager (``model``) and through the group's program (fresh copies each: a
   forward may change its inputs), and compares every output tensor;
4. when the file also holds the outputs the model returned in production, compares the
   program's outputs with *those* too: a program (and an eager replay) that both lose something
   the real call carried, such as cache state our flattening drops, agree with each other but
   not with production.

One row per sampled call (``calls`` = 1, ``kind`` = ``payload``); it is covered when the program
ran and agreed with eager and, where kept, with the recorded outputs, within
``atol + rtol * max|expected|``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from capture import schema
from capture.errors import CaptureError, ReplayError
from capture.pytree import nodes
from capture.record.flatten import dtype_name
from capture.store.payload_files import Payload, iter_payloads, list_payloads
from replay.check.checking import compare_outputs, first_line
from replay.inputs import rebuild as rb
from replay.inputs import shapes
from replay.inputs.options import ExportOptions
from replay.runtime.coverage import KIND_PAYLOAD, TARGET_TORCH, CheckOutcome, CoverageRow

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from capture.pytree.recorded_structure import RecordedStructure
    from capture.store.reader import StoreReader
    from replay.inputs.builder import ExportGroup, ExportInputs

__all__ = ["payload_rows", "real_call", "Serve"]

logger = logging.getLogger(__name__)

Serve = Callable[[tuple[Any, ...], dict[str, Any], list[int]], Any]
"""How a target runs one call, given ``(args, kwargs)`` as the recorded call passed them and
its sizes (every input tensor size, in leaf order)."""


def real_call(
    structure: RecordedStructure, payload: Payload, device: str | torch.device | None = None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The ``(args, kwargs)`` of a sampled call: its tensors in the recorded structure.

    Args:
        structure: The call's recorded input structure
        (`replay.inputs.builder.ExportGroup.structure`). payload: The call's payload file.
        device: Where to put the tensors (default: the recorded device when available, else CPU).

    Returns:
        ``(args, kwargs)`` as the model received them (fresh tensors on every call).

    Raises:
        ReplayError: The file lacks a tensor of the structure, or holds one of another dtype or
            rank, or the structure cannot be rebuilt (opaque leaf, no treespec).
    """
    if not structure.treespec:
        raise ReplayError("the recorded structure has no treespec; the call cannot be rebuilt")
    tensors = payload.inputs()
    values: list[Any] = []
    for leaf in structure.leaves:
        if leaf.kind == schema.KIND_MISSING:
            continue
        if leaf.kind == schema.KIND_TENSOR:
            t = tensors.get(leaf.leaf)
            if t is None:
                raise ReplayError(f"{leaf.path}: the payload {payload.path} has no tensor for it")
            if dtype_name(t.dtype) != leaf.dtype or t.dim() != leaf.ndim:
                raise ReplayError(
                    f"{leaf.path}: the payload holds a {dtype_name(t.dtype)} tensor of rank "
                    f"{t.dim()}, the structure a {leaf.dtype} of rank {leaf.rank}"
                )
            values.append(t.clone().to(rb.resolve_device(leaf.device, device)))
        elif leaf.kind == schema.KIND_OPAQUE:
            raise ReplayError(f"{leaf.path} is an opaque {leaf.type}; it cannot be rebuilt")
        else:
            values.append(rb.scalar(leaf))
    return rb.unflatten(structure, values)


def _sizes(structure: RecordedStructure, payload: Payload) -> list[int]:
    tensors = payload.inputs()
    out: list[int] = []
    for leaf in structure.tensors:
        if leaf.leaf in tensors:
            out.extend(int(s) for s in tensors[leaf.leaf].shape)
    return out


def _row(
    group: str | None,
    signature: str,
    sizes: list[int] | None = None,
    *,
    error: str | None = None,
    target: str = TARGET_TORCH,
) -> CoverageRow:
    return CoverageRow(
        group=group,
        kind=KIND_PAYLOAD,
        signature=signature,
        calls=1,
        error=error,
        target=target,
        sizes=tuple(sizes) if sizes is not None else None,
    )


def _program_call(group: ExportGroup, runnable: Any) -> Serve:
    """A torch program (``program.module()``) called as the recorded calls pass their
    arguments: the group's substitutes and fills added, in the program's call form."""

    def call(args: tuple[Any, ...], kwargs: dict[str, Any], sizes: list[int]) -> Any:
        call_args, call_kwargs = group.to_program(args, kwargs, sizes)
        return runnable(*call_args, **call_kwargs)

    return call


def _check(
    model: Any,
    group: ExportGroup,
    serve: Serve,
    payload: Payload,
    device: str | None,
    atol: float,
    rtol: float,
) -> CheckOutcome:
    with torch.no_grad():
        try:
            args, kwargs = real_call(group.structure, payload, device)
            expected = model(*args, **kwargs)
        except ReplayError as e:
            return CheckOutcome.failed(str(e))
        except Exception as e:  # eager fails on the real call: reported
            return CheckOutcome.failed(f"eager forward failed: {type(e).__name__}: {first_line(e)}")
        try:
            args, kwargs = real_call(group.structure, payload, device)
            got = serve(args, kwargs, _sizes(group.structure, payload))
        except Exception as e:  # the program rejects the real call (a guard): not covered
            return CheckOutcome.failed(f"program failed: {type(e).__name__}: {first_line(e)}")
    diff, bad = compare_outputs(expected, got, atol, rtol)
    if bad is not None:
        return CheckOutcome.failed(f"program vs eager on the real call: {bad}", diff)
    recorded = payload.outputs()
    if recorded is not None:
        rdiff, rbad = compare_outputs(recorded, got, atol, rtol)
        if rbad is not None:
            ediff, _ = compare_outputs(recorded, expected, atol, rtol)
            return CheckOutcome.failed(
                f"program vs the output production returned: {rbad} (eager on the "
                f"rebuilt call differs from it by {ediff:.3g}: the call carried something "
                "the recording does not keep, or the model is not the recorded one)",
                max(diff, rdiff),
            )
        diff = max(diff, rdiff)
    return CheckOutcome(True, diff, None)


def _listed(
    store: StoreReader, model_name: str, limit: int
) -> tuple[Any, list[Any], list[str]] | CoverageRow:
    """The store's filesystem, the model's newest `limit` payload files and a note when there
    are more; or the row saying they cannot be listed (an unreachable store, a folder that
    cannot be listed)."""
    try:
        files = list_payloads((store.fs, store.root), model_name)
    except (CaptureError, OSError) as e:
        why = " ".join(str(e).split())
        return _row(None, "payloads", error=f"the payloads cannot be listed ({why})")
    if len(files) <= limit:
        return store.fs, files, []
    note = f"payloads: checked the newest {limit} of {len(files)} sampled calls"
    return store.fs, files[-limit:], [note]


def payload_rows(
    model: Any,
    store: StoreReader,
    inputs: ExportInputs,
    programs: Mapping[str, ExportedProgram],
    errors: Mapping[str, str],
    *,
    atol: float = ExportOptions.atol,
    rtol: float = ExportOptions.rtol,
    limit: int = ExportOptions.max_payloads,
    max_bytes: int = ExportOptions.max_payload_bytes,
    device: str | None = None,
    target: str = TARGET_TORCH,
    serve: Mapping[str, Serve] | None = None,
    state: str | None = None,
) -> tuple[list[CoverageRow], list[str]]:
    """Coverage rows of kind ``payload`` (module docstring) and notes about them.

    Args:
        model: The model (``nn.Module``).
        store: The open store.
        inputs: What the programs were exported from.
        programs: Group name -> exported program.
        errors: Group name -> why it has no program.
        atol: Absolute tolerance.
        rtol: Relative tolerance (times the largest expected magnitude).
        limit: Check at most this many sampled calls, the newest ones.
        max_bytes: Most bytes of tensors a payload file may hold (bigger: not covered, unread).
        device: Device of the rebuilt tensors.
        target: The rows' target (`replay.runtime.coverage.TARGET_TORCH`, ``onnx``).
        serve: Group name -> how that target runs a call given as recorded (default: the
            torch program serving the group, in its call form, fills added). A group with a
            program but no entry here is not covered (its target was not produced).
        state: Only the sampled calls of this state key (`capture.state`; the file's
            ``state``), checked with `model` in that state (the caller puts it there); None:
            every sampled call.

    Returns:
        (rows, notes); no rows when the store holds no payloads of the model. A payload that
        cannot be read (malformed, over a cap, a link) is one not-covered row (or, for a
        link, which is never followed, one warning), never an exception.
    """
    if limit <= 0:
        return [], []
    listed = _listed(store, inputs.model_name, limit)
    if isinstance(listed, CoverageRow):
        return [listed], []
    fs, files, notes = listed
    exported = {s for g in inputs.groups for s in g.structure_ids}
    analysed = {s for g in inputs.analysed for s in g.structure_ids}
    rows: list[CoverageRow] = []
    runnables: dict[str, Serve] = dict(serve or {})  # group name -> how its calls run
    graphs: dict[str, Any] = {}  # program name -> program.module(), shared by merged groups
    with nodes.register_flattening_functions():
        for item in iter_payloads(files, fs, max_bytes):
            if isinstance(item, str):
                rows.append(_row(None, "unreadable payload", error=item, target=target))
                continue
            if state is not None and item.state != state:
                continue  # checked with the model in its own state
            if item.in_structure not in exported and item.in_structure in analysed:
                continue  # its group was left out with groups=
            found = _matched(inputs, exported, item, target)
            if isinstance(found, CoverageRow):
                rows.append(found)
                continue
            group, sizes, signature = found
            name = group.program_name  # a merged group runs the program serving it
            program = programs.get(name)
            if program is None or (serve is not None and group.name not in runnables):
                why = errors.get(group.name) or f"group {group.name} has no program"
                rows.append(_row(group.name, signature, sizes, error=why, target=target))
                continue
            if group.name not in runnables:
                if name not in graphs:
                    graphs[name] = program.module()
                runnables[group.name] = _program_call(group, graphs[name])
            outcome = _check(model, group, runnables[group.name], item, device, atol, rtol)
            rows.append(_row(group.name, signature, sizes, target=target).checked(outcome))
    return rows, notes


def _matched(
    inputs: ExportInputs, exported: set[str], item: Payload, target: str
) -> tuple[ExportGroup, list[int], str] | CoverageRow:
    """The exported group (the regime, for a group split into regimes) whose structure and
    range hold the sampled call, with its sizes and signature; else the not-covered row
    saying why none does."""
    label = f"call {item.call_id}"
    if item.in_structure not in exported:
        why = (
            f"its input structure {item.in_structure} matches no exported group (its calls "
            "are not in the store's calls, or were analysed away)"
        )
        return _row(None, label, error=why, target=target)
    first = next(g for g in inputs.groups if item.in_structure in g.structure_ids)
    sizes = _sizes(first.structure, item)
    group = inputs.group_for(item.in_structure, sizes)
    if group is None:
        signature = f"{shapes.describe_sizes(first.structure.leaves, sizes)} [{label}]"
        why = "outside the recorded range of every regime of its group"
        return _row(first.name, signature, sizes, error=why, target=target)
    return group, sizes, f"{shapes.describe_sizes(group.structure.leaves, sizes)} [{label}]"
