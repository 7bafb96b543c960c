"""One call group through the export strategies, within its time budget.

`exported_with_fallback` runs a group through, in order: the plain torch.export of its example
and dynamic shapes; the bounded named-dims retries (`replay.pipeline.bounded`); the split into
regimes where torch.export cuts its recorded range (`replay.pipeline.regimes`); then, for the
recorded signatures no dynamic program serves (past the time budget, or cut where regimes cannot
serve), one static program per signature (`replay.pipeline.budget.static`). Every torch.export
runs under the group's deadline (`replay.pipeline.budget.child`). Each part comes back with its
coverage rows, checked on the recorded signatures and probes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from capture import compat
from capture.pytree import nodes
from replay.check.checking import coverage_rows
from replay.inputs.options import ExportOptions
from replay.pipeline.bounded import export_bounded, export_unbounded
from replay.pipeline.budget.child import (
    BudgetSpent,
    Deadline,
    export_bounded_in_time,
    in_process_reason,
)
from replay.pipeline.budget.static import export_static
from replay.pipeline.guard_sources import fix_guard_sources
from replay.pipeline.regimes import Exported, export_regimes
from replay.runtime.coverage import KIND_RECORDED, CoverageRow

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from replay.inputs.exportgroup import ExportGroup

__all__ = ["Budget", "DYNAMIC_SHARE", "exported_with_fallback", "failure", "summary"]

_TORCH_LOGS_HINT = 'For more information, run with TORCH_LOGS="+dynamic".'


def _export_group(
    model: Any, group: ExportGroup, strict: bool, deadline: Deadline
) -> tuple[ExportedProgram | None, BaseException | None]:
    """(program, None) or (None, the error torch.export raised), within `deadline` when it
    has one and this process can fork (`replay.pipeline.budget.child`)."""
    if deadline.end is not None and in_process_reason() is None:
        left = deadline.left() or 0.0
        if left <= 0:
            return None, BudgetSpent("the group's time budget was spent before this export")
        program, error = export_bounded_in_time(
            group.module(model), group.args, group.kwargs, group.dynamic_shapes, strict, left
        )
        if program is not None:
            fix_guard_sources(program)
        return program, error
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
    return f"torch.export failed: {summary(error)}"


def _checked(module: Any, done: Exported, options: ExportOptions) -> list[CoverageRow]:
    """The coverage rows of one exported group (its error when it has no program)."""
    error = failure(done.error) if done.error is not None and done.program is None else None
    with nodes.register_flattening_functions():
        return coverage_rows(
            module, done.group, done.program, error, options.atol, options.rtol, options.probes
        )


def _dynamic(
    module: Any,
    group: ExportGroup,
    options: ExportOptions,
    analysed: list[Any],
    budget: Budget,
) -> list[Exported]:
    """The group's dynamic exports: plain, then its retries and regimes (``spec="dims"``)."""
    if options.spec == "shapes":  # unbacked sizes: torch cuts no range, nothing to retry
        program, error = _export_group(module, group, options.strict, budget.dynamic)
        return [Exported(group, program, error)]
    return export_regimes(
        group,
        options,
        analysed,
        lambda g: _export_group(module, g, options.strict, budget.dynamic),
        lambda g, e: _retry(module, g, e, options, budget.dynamic),
    )


def exported_with_fallback(
    module: Any,
    group: ExportGroup,
    options: ExportOptions,
    analysed: list[Any],
    budget: Budget,
) -> list[tuple[Exported, list[CoverageRow]]]:
    """The group exported (regimes, retries) within its budget, each part with its coverage
    rows; the recorded signatures no dynamic program serves get static programs
    (`replay.pipeline.budget.static`), standing before the part they fell out of."""
    out: list[tuple[Exported, list[CoverageRow]]] = []
    why_in_process = in_process_reason() if budget.seconds is not None else None
    for done in _dynamic(module, group, options, analysed, budget):
        if why_in_process is not None:
            done.group.notes.append(f"time budget not enforced: {why_in_process}")
        rows = _checked(module, done, options)
        unserved = [r.sizes for r in rows if r.kind == KIND_RECORDED and not r.covered and r.sizes]
        if not unserved or options.max_static <= 0:
            out.append((done, rows))
            continue
        why = (
            failure(done.error)
            if done.program is None and done.error is not None
            else "its program does not serve them"
        )
        fallback = export_static(
            done.group,
            unserved,
            why,
            options,
            analysed,
            lambda g: _export_group(module, g, options.strict, budget.static),
        )
        done.group.notes.extend(fallback.notes)
        covered: set[tuple[int, ...]] = set()
        for static in fallback.exported:
            static_rows = _checked(module, static, options)
            failed = next((r for r in static_rows if not r.covered), None)
            if failed is not None:
                done.group.notes.append(
                    f"the static program {static.group.name} is not kept: it does not reproduce "
                    f"{failed.signature} ({failed.error})"
                )
                continue
            static.group.notes.append(
                f"a static program for one recorded signature of {done.group.name} ({why})"
            )
            covered |= {r.sizes for r in static_rows if r.kind == KIND_RECORDED and r.sizes}
            out.append((static, static_rows))
        kept = [r for r in rows if not (r.kind == KIND_RECORDED and r.sizes in covered)]
        out.append((done, kept))
    return out


def _retry(
    module: Any,
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
        return _export_group(module, g, options.strict, deadline)

    if not options.named_dims or group.analysis is None:
        return group, None, error, None
    # torch.export could not prove a guard within the named ranges (e.g. the Min(...) stride
    # guard of repeat_kv's reshape on torch 2.13): bounded hints keep the recorded ranges and
    # let torch check the guard at run time.
    bounded, program, failed = export_bounded(group, error, attempt, summary)
    if program is None and failed is not None and compat.is_constraint_violation(failed):
        # No bounded form was accepted: reported as not honoured, never silently.
        return export_unbounded(bounded, failed, attempt, summary)
    return bounded, program, failed, None
