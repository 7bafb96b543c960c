"""One call group through one chain of export strategies, to an immutable outcome.

`export_group` takes a group through, in order, stopping at the first that decides it:

1. **refused**: a recorded class that cannot be rebuilt exactly (`capture.pytree.cachespec`);
2. **merged**: served by another group's program with an input filled, where the check proves
   it (`replay.pipeline.merging`; the reasons it is not are kept for the notes);
3. **refused**: the model is not the recorded one (`replay.pipeline.model_match`);
4. **dynamic**: the plain torch.export of the group's example and dynamic shapes, its bounded
   named-dims retries (`replay.pipeline.bounded`) and its split into regimes where torch.export
   cuts its recorded range (`replay.pipeline.splitting`), within half the group's time budget;
5. **static**: the recorded signatures no dynamic program serves (past the budget, or cut
   where regimes cannot serve) get one static program each (`replay.pipeline.budget.static`),
   within the rest of the budget.

Every program goes through the loader's validation before its rows are checked
(`replay.artifact.loadable`, with the caller's ``allow_ops``): a program ``replay.load`` would
refuse has no program, its rows are not covered and carry the loader's reason, so what an
export claims is what its artifact serves.

Every torch.export runs under the group's deadline (`replay.pipeline.budget.deadline`). The outcome
is a tuple of frozen `Part`: a program or a refusal, its coverage rows (checked on the recorded
signatures and probes) and its group with every note; nothing given to the chain is changed.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from capture import compat
from capture.pytree import nodes
from capture.pytree.cachespec import blocking_reason
from capture.untrusted import printable
from replay.artifact.loadable import LoaderRefusal, refusal, refused_operators
from replay.check.checking import coverage_rows
from replay.inputs.options import ExportOptions
from replay.pipeline.bounded import export_bounded, export_unbounded
from replay.pipeline.budget.deadline import BudgetSpent, Deadline, call_within
from replay.pipeline.budget.static import export_static
from replay.pipeline.guard_sources import fix_guard_sources
from replay.pipeline.merging import Merged, merge
from replay.pipeline.model_match import eager_failure
from replay.pipeline.splitting import Exported, export_regimes
from replay.runtime.allowed import allow_ops
from replay.runtime.coverage import KIND_RECORDED, CoverageRow

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from capture.store.reader import StoreReader
    from replay.inputs.exportgroup import ExportGroup, ExportInputs

__all__ = [
    "Budget",
    "DYNAMIC_SHARE",
    "Job",
    "Part",
    "export_group",
    "failure",
    "refused",
    "summary",
]

logger = logging.getLogger(__name__)

_TORCH_LOGS_HINT = 'For more information, run with TORCH_LOGS="+dynamic".'


def _export_group(
    model: Any, group: ExportGroup, strict: bool, deadline: Deadline
) -> tuple[ExportedProgram | None, BaseException | None]:
    """(program, None) or (None, the error torch.export raised, or `BudgetSpent`), stopped at
    `deadline` when it has one (`replay.pipeline.budget.deadline`)."""
    module = group.module(model)

    def export() -> ExportedProgram:
        return torch.export.export(
            module,
            group.args,
            kwargs=group.kwargs,
            dynamic_shapes=group.dynamic_shapes,
            strict=strict,
        )

    try:
        with nodes.register_flattening_functions():
            program = call_within(deadline.left(), export, module)
    except Exception as e:  # rejected by torch.export, or past the deadline: the others go on
        return None, e
    fix_guard_sources(program)
    return program, None


def summary(e: BaseException) -> str:
    """``Type: first line`` plus the first ``- ...`` detail line torch gives, if any."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    first = (lines[0] if lines else "").replace(_TORCH_LOGS_HINT, "").strip()
    text = f"{getattr(e, 'kind', type(e).__name__)}: {first}".rstrip(": ")
    detail = next((line for line in lines[1:] if line.startswith("- ")), None)
    return f"{text} {detail}" if detail else text


class Budget:
    """A group's time budget (`ExportOptions.time_budget`): the dynamic exports (plain,
    retries, regimes) end by half of it, the static fallback by its end."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.dynamic = Deadline.after(None if seconds is None else seconds * DYNAMIC_SHARE)
        self.static = Deadline.after(seconds)


DYNAMIC_SHARE = 0.5
"""The part of a group's time budget its dynamic exports may use (the rest is the fallback's)."""


def failure(error: BaseException) -> str:
    if isinstance(error, BudgetSpent):
        return str(error)
    if isinstance(error, LoaderRefusal):
        return f"replay.load would refuse its program: {error}"
    return f"torch.export failed: {summary(error)}"


@dataclass(frozen=True)
class Part:
    """One program of a group's outcome, or one refusal.

    Attributes:
        group: The group (or regime, or static signature) it serves, with every note.
        program: Its `torch.export.ExportedProgram`; None for a refusal, and for a group
            served by another group's program (``group.served_by``).
        error: Why it has no program (a refusal), or None.
        rows: Its coverage rows.
        not_honoured: An option asked for that its program does not honour, and why.
    """

    group: ExportGroup
    program: ExportedProgram | None
    error: str | None
    rows: tuple[CoverageRow, ...]
    not_honoured: str | None = None


@dataclass(frozen=True)
class Job:
    """What every group of one export shares: the model, the open store, its inputs, the
    options."""

    model: Any
    store: StoreReader
    inputs: ExportInputs
    options: ExportOptions


Served = Sequence[tuple["ExportGroup", "ExportedProgram"]]
"""``(group, program)`` of every program made so far (the candidates of `merge`)."""


def export_group(job: Job, group: ExportGroup, served: Served) -> tuple[Part, ...]:
    """One group through the chain (module docstring): its parts, static programs first.

    Example:
        >>> parts = export_group(job, inputs.group("prefill"), served=())  # doctest: +SKIP
        >>> [(p.group.name, p.program is not None) for p in parts]  # doctest: +SKIP
        [('prefill[input_ids_1<=4]', True), ('prefill[input_ids_1>=5]', True)]
    """
    blocked = blocking_reason(group.structure)
    if blocked is not None:  # a class we cannot rebuild exactly is never called covered
        return (_refused(job, group, blocked, probes=0),)
    merged = (
        merge(job.model, group, served, job.options, job.store, job.inputs)
        if job.options.merge
        else Merged(None)
    )
    if merged.group is not None:
        return (Part(merged.group, None, None, merged.rows),)
    mismatch = eager_failure(job.model, group)
    if mismatch is not None:  # not the recorded model: torch.export would fail deep inside
        return (_refused(job, group, mismatch, probes=job.options.probes),)
    budget = Budget(job.options.time_budget)
    return tuple(
        part
        for done in _dynamic(job, group, budget)
        for part in _with_fallback(job, _noted(done, merged.reasons), budget)
    )


def refused(job: Job, group: ExportGroup, why: str) -> Part:
    """The group not exported, for `why` (its recorded signatures not covered, no probes)."""
    return _refused(job, group, why, probes=0)


def _refused(job: Job, group: ExportGroup, why: str, probes: int) -> Part:
    logger.warning("group %s not exported: %s", printable(group.name), printable(why))
    options = job.options
    rows = coverage_rows(job.model, group, None, why, options.atol, options.rtol, probes)
    return Part(group, None, why, tuple(rows))


def _noted(done: Exported, reasons: Sequence[str]) -> Exported:
    """`done` with why no other group's program serves it."""
    if not reasons:
        return done
    return dataclasses.replace(done, group=done.group.noted(*reasons))


def _part(job: Job, done: Exported, notes: Sequence[str] = ()) -> Part:
    """`done` checked: its coverage rows, its error when it has no program (`_loadable` has
    taken away a program the loader would refuse)."""
    error = failure(done.error) if done.error is not None and done.program is None else None
    if error is not None:
        logger.warning(
            "export of group %s failed: %s", printable(done.group.name), printable(error)
        )
    group = done.group.noted(*notes)
    options = job.options
    with nodes.register_flattening_functions():
        rows = coverage_rows(
            job.model, group, done.program, error, options.atol, options.rtol, options.probes
        )
    return Part(group, done.program, error, tuple(rows), done.not_honoured)


def _loadable(job: Job, done: Exported) -> Exported:
    """`done` without its program when ``replay.load`` would refuse it."""
    if done.program is None:
        return done
    why = refusal(done.group.name, done.program, allow_ops(job.options.allow_ops))
    if why is None:
        return done
    by_operator = bool(refused_operators(done.program, allow_ops(job.options.allow_ops)))
    return dataclasses.replace(done, program=None, error=LoaderRefusal(why, by_operator))


def _dynamic(job: Job, group: ExportGroup, budget: Budget) -> list[Exported]:
    """The group's dynamic exports: plain, then its retries and regimes (``spec="dims"``)."""
    model, options = job.model, job.options
    if options.spec == "shapes":  # unbacked sizes: torch cuts no range, nothing to retry
        program, error = _export_group(model, group, options.strict, budget.dynamic)
        return [Exported(group, program, error)]
    return export_regimes(
        group,
        options,
        job.inputs.analysed,
        lambda g: _export_group(model, g, options.strict, budget.dynamic),
        lambda g, e: _retry(model, g, e, options, budget.dynamic),
    )


def _unserved(part: Part) -> list[tuple[int, ...]]:
    return [r.sizes for r in part.rows if r.kind == KIND_RECORDED and not r.covered and r.sizes]


def _with_fallback(job: Job, done: Exported, budget: Budget) -> list[Part]:
    """`done` checked; the recorded signatures its program does not serve get static
    programs (`replay.pipeline.budget.static`), standing before it. A program the loader
    refuses for an operator it calls gets none: a static program calls it too."""
    done = _loadable(job, done)
    part = _part(job, done)
    unserved = _unserved(part)
    if not unserved or job.options.max_static <= 0:
        return [part]
    if isinstance(done.error, LoaderRefusal) and done.error.by_operator:
        return [part]
    why = part.error or "its program does not serve them"
    fallback = export_static(
        done.group,
        unserved,
        why,
        job.options,
        job.inputs.analysed,
        lambda g: _export_group(job.model, g, job.options.strict, budget.static),
    )
    statics, dropped = [], []
    for static in fallback.exported:
        note = f"a static program for one recorded signature of {done.group.name} ({why})"
        checked = _part(job, _loadable(job, static), [note])
        failed = next((r for r in checked.rows if not r.covered), None)
        if failed is None:
            statics.append(checked)
            continue
        dropped.append(
            f"the static program {static.group.name} is not kept: it does not reproduce "
            f"{failed.signature} ({failed.error})"
        )
    covered = {r.sizes for p in statics for r in p.rows if r.kind == KIND_RECORDED}
    kept = tuple(r for r in part.rows if not (r.kind == KIND_RECORDED and r.sizes in covered))
    group = part.group.noted(*fallback.notes, *dropped)
    return [*statics, dataclasses.replace(part, group=group, rows=kept)]


def _retry(
    model: Any,
    group: ExportGroup,
    error: BaseException,
    options: ExportOptions,
    deadline: Deadline,
) -> tuple[ExportGroup, ExportedProgram | None, BaseException | None, str | None]:
    """The retries of a group whose named dims torch.export rejected (`replay.pipeline.bounded`).

    Returns:
        ``(group exported, program, error, why named dims are not honoured)``; the group and
        `error` unchanged without named dims.
    """

    def attempt(g: ExportGroup) -> tuple[ExportedProgram | None, BaseException | None]:
        return _export_group(model, g, options.strict, deadline)

    if not options.named_dims:
        return group, None, error, None
    # torch.export could not prove a guard within the named ranges (e.g. the Min(...) stride
    # guard of repeat_kv's reshape on torch 2.13): bounded hints keep the recorded ranges and
    # let torch check the guard at run time.
    bounded, program, failed = export_bounded(group, error, attempt, summary)
    if program is None and failed is not None and compat.is_constraint_violation(failed):
        # No bounded form was accepted: reported as not honoured, never silently.
        return export_unbounded(bounded, failed, attempt, summary)
    return bounded, program, failed, None
