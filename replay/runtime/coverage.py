"""One coverage row, typed: what one check of a program against eager found.

A coverage row checks one size vector of a group against eager. Its ``kind`` says where the
vector comes from, so a user knows what a covered row promises:

- ``recorded``: a distinct recorded signature, rebuilt from its metadata;
- ``probe``: an unseen size vector inside the recorded ranges (`replay.inputs.select.probes`): the
  program generalizes between and at the ends of the recorded points;
- ``payload``: a sampled real call, run as it was (opt-in payloads).

Its ``target`` says what was checked: ``torch`` (the exported program) or ``onnx`` (the ONNX
file converted from it, run with onnxruntime by the runner ``replay.load`` returns for it,
`replay.onnx`); with ``onnx=`` every row is checked for both. `CoverageRow` is the one
definition of a row: `replay.check.checking` and `replay.check.payload_rows` make them,
`COVERAGE_SCHEMA` is built from its fields, and readers (the artifact's refusal list, the CLI) read
rows back with `CoverageRow.from_table` rather than by position or by dict keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

__all__ = [
    "CoverageRow",
    "COVERAGE_SCHEMA",
    "KIND_RECORDED",
    "KIND_PROBE",
    "KIND_PAYLOAD",
    "TARGET_TORCH",
    "TARGET_ONNX",
    "coverage_table",
    "coverage_total",
    "group_coverage",
]

KIND_RECORDED = "recorded"
"""Coverage row kind: a distinct recorded signature, rebuilt from its metadata."""
KIND_PROBE = "probe"
"""Coverage row kind: an unseen size vector inside the recorded ranges."""
KIND_PAYLOAD = "payload"
"""Coverage row kind: a sampled real call (payloads)."""
TARGET_TORCH = "torch"
"""Coverage row target: the exported ``torch.export`` program."""
TARGET_ONNX = "onnx"
"""Coverage row target: the group's ONNX file, run with onnxruntime (`replay.onnx`)."""

_LABELS = {KIND_RECORDED: "recorded signatures", KIND_PROBE: "probes", KIND_PAYLOAD: "payloads"}


@dataclass(frozen=True)
class CheckOutcome:
    """What one check of a target against eager found.

    Attributes:
        covered: The target ran and agreed with eager within the tolerance.
        max_abs_diff: The largest difference seen (None when nothing ran).
        error: Why it is not covered (None when covered).
    """

    covered: bool
    max_abs_diff: float | None
    error: str | None

    @classmethod
    def failed(cls, error: str, max_abs_diff: float | None = None) -> CheckOutcome:
        """A check that failed, and why."""
        return cls(False, max_abs_diff, error)


@dataclass(frozen=True)
class CoverageRow:
    """One check of one target on one size vector of a group.

    Attributes:
        group: The call group (None for a payload that matches no group).
        kind: `KIND_RECORDED`, `KIND_PROBE` or `KIND_PAYLOAD`.
        signature: The sizes in the seeds' notation (``T7s2x5,T7s2x5``), for people.
        calls: The recorded calls the row stands for (0 for a probe, 1 for a payload).
        covered: The target ran and agreed with eager within the tolerance.
        max_abs_diff: The largest difference seen (None when nothing ran).
        error: Why the row is not covered (None when covered).
        target: What was checked (`TARGET_TORCH`, `TARGET_ONNX`).
        sizes: The size vector checked, every input tensor size in leaf order (None for a
            payload that could not be read): what the refusal list matches on.
    """

    group: str | None
    kind: str = field(metadata={"max_len": 64})
    signature: str = field(metadata={"max_len": 1_000_000})
    calls: int = field(metadata={"low": 0})
    covered: bool = False
    max_abs_diff: float | None = None
    error: str | None = field(default=None, metadata={"max_len": 1_000_000})
    target: str = field(default=TARGET_TORCH, metadata={"max_len": 64})
    sizes: tuple[int, ...] | None = field(default=None, metadata={"low": 0})

    def checked(self, outcome: CheckOutcome) -> CoverageRow:
        """This row with the outcome of its check."""
        return dataclasses.replace(
            self, covered=outcome.covered, max_abs_diff=outcome.max_abs_diff, error=outcome.error
        )

    def as_dict(self) -> dict[str, Any]:
        """The row as one JSON-serializable dict (``sizes`` a list)."""
        out = dataclasses.asdict(self)
        out["sizes"] = list(self.sizes) if self.sizes is not None else None
        return out

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> CoverageRow:
        """A row from `as_dict`'s form (or a table row); unknown keys are refused."""
        sizes = row.get("sizes")
        return cls(**{**row, "sizes": tuple(int(s) for s in sizes) if sizes is not None else None})

    @classmethod
    def from_table(cls, table: pa.Table) -> list[CoverageRow]:
        """The rows of a coverage table (`COVERAGE_SCHEMA`)."""
        return [cls.from_dict(row) for row in table.to_pylist()]


_ARROW_TYPES = {
    "group": pa.string(),
    "kind": pa.string(),
    "signature": pa.string(),
    "calls": pa.int64(),
    "covered": pa.bool_(),
    "max_abs_diff": pa.float64(),
    "error": pa.string(),
    "target": pa.string(),
    "sizes": pa.list_(pa.int64()),
}

COVERAGE_SCHEMA = pa.schema(
    [pa.field(f.name, _ARROW_TYPES[f.name]) for f in dataclasses.fields(CoverageRow)]
)
"""Columns of `ExportResult.coverage`, one per `CoverageRow` field, in its order: one row per
distinct recorded signature (``kind`` ``recorded``, ``calls`` the calls it stands for), then the
group's probes (``kind`` ``probe``, ``calls`` 0), then one row per sampled real call (``kind``
``payload``, `replay.check.payload_rows`)."""


def coverage_table(rows: Iterable[CoverageRow]) -> pa.Table:
    """Rows as a `COVERAGE_SCHEMA` table."""
    return pa.Table.from_pylist([r.as_dict() for r in rows], schema=COVERAGE_SCHEMA)


def _diff(value: float | None) -> str:
    """A max abs diff in 3 significant digits (``1.79e-07``); ``-`` when nothing was compared."""
    return "-" if value is None else f"{value:.3g}"


def _worst(rows: Iterable[CoverageRow]) -> float | None:
    diffs = [r.max_abs_diff for r in rows if r.max_abs_diff is not None]
    return max(diffs) if diffs else None


def _share(rows: list[CoverageRow]) -> str:
    return f"{sum(1 for r in rows if r.covered)}/{len(rows)}" if rows else "-"


def _typed(coverage: pa.Table | Iterable[CoverageRow]) -> list[CoverageRow]:
    """The rows of a coverage table, or the typed rows as they are."""
    return CoverageRow.from_table(coverage) if isinstance(coverage, pa.Table) else list(coverage)


def group_coverage(coverage: pa.Table | Iterable[CoverageRow]) -> list[dict[str, Any]]:
    """One row per group of a coverage table: what ``capture export`` and ``capture demo``
    print for people (the full table stays in ``-f json`` and behind ``--signatures``).

    Args:
        coverage: A coverage table (`COVERAGE_SCHEMA`), or its typed rows
            (``ExportResult.rows``).

    Returns:
        Rows in the order the groups first appear (one per group and target, with a
        ``target`` column, when the table checks ONNX files too): ``group``; ``signatures``,
        ``calls``,
        ``probes`` (and ``payloads`` when there are any) as ``covered/total``; ``worst diff``,
        the largest max abs diff of the group in 3 significant digits; ``error``, the first
        error of the group (empty when none).

    Example:
        >>> group_coverage(coverage_table([
        ...     CoverageRow("g0", KIND_RECORDED, "x=2", 3, True, 1.7881393e-07),
        ...     CoverageRow("g0", KIND_PROBE, "x=3", 0, True, 0.0)]))
        [{'group': 'g0', 'signatures': '1/1', 'calls': '3/3', 'probes': '1/1', \
'worst diff': '1.79e-07', 'error': ''}]
    """
    rows = _typed(coverage)
    payloads = any(r.kind == KIND_PAYLOAD for r in rows)
    targets = len({r.target for r in rows}) > 1
    out = []
    groups = list(dict.fromkeys(r.group for r in rows))
    kinds = list(dict.fromkeys(r.target for r in rows))
    keys = sorted(
        dict.fromkeys((r.group, r.target) for r in rows),
        key=lambda k: (groups.index(k[0]), kinds.index(k[1])),
    )
    for group, target in keys:
        mine = [r for r in rows if r.group == group and r.target == target]
        recorded = [r for r in mine if r.kind == KIND_RECORDED]
        calls = sum(r.calls for r in recorded)
        covered_calls = sum(r.calls for r in recorded if r.covered)
        row: dict[str, Any] = {"group": group, **({"target": target} if targets else {})}
        row |= {
            "signatures": _share(recorded),
            "calls": f"{covered_calls}/{calls}" if recorded else "-",
            "probes": _share([r for r in mine if r.kind == KIND_PROBE]),
        }
        if payloads:
            row["payloads"] = _share([r for r in mine if r.kind == KIND_PAYLOAD])
        row["worst diff"] = _diff(_worst(mine))
        row["error"] = next((r.error for r in mine if r.error), "")
        out.append(row)
    return out


def coverage_total(coverage: pa.Table | Iterable[CoverageRow]) -> str:
    """The total line under a coverage table: signatures, calls, probes, worst difference.

    Args:
        coverage: A coverage table (`COVERAGE_SCHEMA`), or its typed rows
            (``ExportResult.rows``).

    Returns:
        E.g. ``'35 of 35 recorded signatures covered (35 of 35 calls), 3 of 3 probes
        covered, max abs diff 1.79e-07'``; with ONNX rows, the same for them after
        ``; onnx:``.

    Example:
        >>> coverage_total(coverage_table([
        ...     CoverageRow("g0", KIND_RECORDED, "x=2", 2, error="Guard failed")]))
        '0 of 1 recorded signatures covered (0 of 2 calls), max abs diff -'
    """
    rows = _typed(coverage)
    texts = []
    for target in dict.fromkeys(r.target for r in rows) or [TARGET_TORCH]:
        mine = [r for r in rows if r.target == target]
        prefix = "" if target == TARGET_TORCH else f"{target}: "
        texts.append(prefix + _total(mine))
    return "; ".join(texts)


def _total(rows: list[CoverageRow]) -> str:
    recorded = [r for r in rows if r.kind == KIND_RECORDED]
    parts = [
        f"{sum(1 for r in recorded if r.covered)} of {len(recorded)} recorded signatures "
        f"covered ({sum(r.calls for r in recorded if r.covered)} of "
        f"{sum(r.calls for r in recorded)} calls)"
    ]
    for kind in (KIND_PROBE, KIND_PAYLOAD):
        mine = [r for r in rows if r.kind == kind]
        if mine:
            parts.append(
                f"{sum(1 for r in mine if r.covered)} of {len(mine)} {_LABELS[kind]} covered"
            )
    return ", ".join(parts) + f", max abs diff {_diff(_worst(rows))}"
