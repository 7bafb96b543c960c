"""The coverage check: a group's program against the eager model, one size vector at a time.

For a size vector (a recorded signature or a probe, `replay.inputs.select.probes`) fresh inputs are
rebuilt twice (a forward may mutate its inputs: a DynamicCache grows in place), the program runs
on one copy in its call form and the eager model on the other as the recorded calls passed
them, and every output tensor is compared (`compare_outputs`). `replay.pipeline.exporting.export`
makes the coverage table from these rows; `replay.check.payload_rows` compares sampled real calls
the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from capture.pytree import nodes
from replay.inputs import select, shapes
from replay.runtime.coverage import KIND_PROBE, KIND_RECORDED, CheckOutcome, CoverageRow

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from replay.inputs.exportgroup import ExportGroup

__all__ = ["compare_outputs", "first_line", "coverage_rows", "check_call"]


def _tensors(value: Any) -> list[Any]:
    with nodes.register_flattening_functions():
        return list(pytree.tree_leaves(value))


def compare_outputs(expected: Any, got: Any, atol: float, rtol: float) -> tuple[float, str | None]:
    """(max abs diff, error or None) between eager and program outputs.

    Every tensor of the two outputs (flattened with torch's pytree, capture's registrations
    included) is compared; both NaN counts as equal. The outputs differ when their tensor
    counts or shapes differ, or when a difference exceeds ``atol + rtol * max|expected|``.

    Example:
        >>> compare_outputs(torch.ones(2), torch.ones(2) + 1e-6, 1e-4, 1e-4)[1] is None
        True
    """
    left, right = _tensors(expected), _tensors(got)
    left_t = [v for v in left if isinstance(v, torch.Tensor)]
    right_t = [v for v in right if isinstance(v, torch.Tensor)]
    if len(left_t) != len(right_t):
        return float("nan"), (f"the program returns {len(right_t)} tensors, eager {len(left_t)}")
    worst, bad = 0.0, None
    for i, (a, b) in enumerate(zip(left_t, right_t, strict=True)):
        if tuple(a.shape) != tuple(b.shape):
            return float("nan"), (
                f"output {i}: shape {tuple(b.shape)} from the program, {tuple(a.shape)} eager"
            )
        if a.numel() == 0:
            continue
        x, y = a.detach().cpu().double(), b.detach().cpu().double()
        both_nan = torch.isnan(x) & torch.isnan(y)
        diff = torch.where(both_nan, torch.zeros_like(x), (x - y).abs())
        diff = torch.nan_to_num(diff, nan=float("inf"))
        m = float(diff.max())
        worst = max(worst, m)
        limit = atol + rtol * float(torch.nan_to_num(x.abs(), nan=0.0).max())
        if m > limit and bad is None:
            bad = f"output {i} differs by {m:.3g} (tolerance {limit:.3g})"
    return worst, bad


def first_line(e: BaseException) -> str:
    """The first line of an error's text (its type name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _probes(group: ExportGroup, limit: int) -> list[tuple[int, ...]]:
    """The group's probes; for a ``ShapesSpec`` program moved onto its divisibility
    assumptions (a size its spec refuses is no probe of it: `divisible_probes`)."""
    if group.options.spec != "shapes":
        return select.probes(group.analysis, limit)
    from replay.inputs.specs.facts import divisible_probes

    return divisible_probes(group.analysis, select.probes(group.analysis, 4 * limit), limit)


def coverage_rows(
    model: Any,
    group: ExportGroup,
    program: ExportedProgram | None,
    error: str | None,
    atol: float,
    rtol: float,
    probes: int,
) -> list[CoverageRow]:
    """The coverage rows of one group: every recorded signature, then up to `probes` probes.

    Each row is checked (`runnable` on the program call vs `model` on the recorded call) when
    the group has a program; else it is uncovered with `error`.
    """
    rows = []
    runnable = program.module() if program is not None else None
    checks = [(sizes, calls, KIND_RECORDED) for sizes, calls in group.recorded()]
    checks += [(sizes, 0, KIND_PROBE) for sizes in _probes(group, probes)]
    for sizes, calls, kind in checks:
        row = CoverageRow(
            group=group.name,
            kind=kind,
            signature=shapes.describe_sizes(group.structure.leaves, sizes),
            calls=calls,
            error=error,
            sizes=tuple(int(s) for s in sizes),
        )
        if runnable is not None:
            row = row.checked(_check_one(model, group, runnable, sizes, atol, rtol))
        rows.append(row)
    return rows


def _check_one(
    model: Any, group: ExportGroup, runnable: Any, sizes: tuple[int, ...], atol: float, rtol: float
) -> CheckOutcome:
    """The outcome of one check of a group's program on one size vector."""

    def run() -> Any:
        args, kwargs = group.program_call(sizes)
        return runnable(*args, **kwargs)

    return check_call(model, lambda: group.recorded_call(sizes), run, atol, rtol)


def check_call(
    model: Any,
    recorded: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    run: Callable[[], Any],
    atol: float,
    rtol: float,
    target: str = "program",
) -> CheckOutcome:
    """One check of a target against eager.

    Args:
        model: The eager model, called on ``recorded()``.
        recorded: Fresh ``(args, kwargs)`` as the recorded calls passed them.
        run: Runs the target on fresh inputs of the same call and returns its output.
        atol: Absolute tolerance.
        rtol: Relative tolerance (times the largest eager magnitude).
        target: How errors name the target (``program``, ``ONNX runner``).

    Returns:
        Its `CheckOutcome`.
    """
    with torch.no_grad():
        try:
            args, kwargs = recorded()
            expected = model(*args, **kwargs)
        except Exception as e:  # the eager model itself fails on these inputs: report it
            return CheckOutcome.failed(f"eager forward failed: {type(e).__name__}: {first_line(e)}")
        try:
            got = run()
        except Exception as e:  # the target rejects these sizes (a guard): not covered
            return CheckOutcome.failed(f"{target} failed: {type(e).__name__}: {first_line(e)}")
    diff, bad = compare_outputs(expected, got, atol, rtol)
    return CheckOutcome(bad is None, diff, bad)
