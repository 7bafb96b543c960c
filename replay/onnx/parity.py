"""ONNX parity: every ONNX file run on the rows its torch program was checked on.

For each coverage row of the torch check (a recorded signature or a probe of a group,
`replay.check.checking`), one row of target ``onnx``: fresh inputs of exactly those sizes are
rebuilt twice as the recorded calls passed them
(`replay.inputs.exportgroup.ExportGroup.recorded_call`), eager runs on one copy, and the group's
ONNX file runs on the other **through the runner**
(`replay.runtime.ort.runner.OnnxRunner.run_group`: the file's guard, the feeds built from the call's
leaves, the outputs put back into eager's types), so what is checked is what ``replay.load`` serves.
Every output tensor is compared (`replay.check.checking.compare_outputs`: the same rule, ``atol +
rtol * max|eager|``, over every position).

No position is exempt: an ONNX file that differs from eager anywhere, even at cache entries
that later calls mask, is not covered. Where a conversion disagrees with torch (attention on
fully masked rows), the translation is made right in `replay.onnx.translation`, never excused
here.

Sampled real calls (payloads) are checked by `replay.check.payload_rows` with the runner as target,
against eager and against the outputs production got.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from replay.check.checking import check_call
from replay.runtime.coverage import (
    KIND_PAYLOAD,
    TARGET_ONNX,
    TARGET_TORCH,
    CheckOutcome,
    CoverageRow,
)

if TYPE_CHECKING:
    from replay.inputs.exportgroup import ExportGroup
    from replay.runtime.ort.runner import OnnxRunner

__all__ = ["onnx_rows"]


def onnx_rows(
    model: Any,
    group: ExportGroup,
    torch_rows: Sequence[CoverageRow],
    runner: OnnxRunner | None,
    error: str | None,
    atol: float,
    rtol: float,
) -> list[CoverageRow]:
    """The ONNX rows of one group: one per torch row of the group (recorded and probes).

    Args:
        model: The eager model.
        group: The call group.
        torch_rows: The export's torch rows (rows of other groups, and payloads, are skipped).
        runner: A runner over the written ONNX files (None: the group has no file).
        error: Why the group has no ONNX file (when `runner` is None or lacks the group).
        atol: Absolute tolerance.
        rtol: Relative tolerance (times the largest eager magnitude).

    Returns:
        Rows of target ``onnx``, in the order of `torch_rows`.
    """
    rows = []
    served = runner is not None and group.name in runner.groups
    if not served and error is None:  # never a row without a verdict or a reason
        error = f"no ONNX file serves group {group.name}"
    for row in torch_rows:
        if row.group != group.name or row.kind == KIND_PAYLOAD or row.target != TARGET_TORCH:
            continue
        onnx_row = CoverageRow(
            group=row.group,
            kind=row.kind,
            signature=row.signature,
            calls=row.calls,
            error=error,
            target=TARGET_ONNX,
            sizes=row.sizes,
        )
        if served and runner is not None and row.sizes is not None:
            onnx_row = onnx_row.checked(_check_one(model, group, runner, row.sizes, atol, rtol))
        rows.append(onnx_row)
    return rows


def _check_one(
    model: Any,
    group: ExportGroup,
    runner: OnnxRunner,
    sizes: tuple[int, ...],
    atol: float,
    rtol: float,
) -> CheckOutcome:
    """The outcome of one check of a group's ONNX file on one size vector."""

    def run() -> Any:
        args, kwargs = group.recorded_call(sizes)
        return runner.run_group(group.name, args, kwargs)

    return check_call(model, lambda: group.recorded_call(sizes), run, atol, rtol, "ONNX runner")
