"""One coverage row, typed: what one check of a program against eager found (issue 20).

A coverage row checks one size vector of a group against eager. Its ``kind`` says where the
vector comes from, so a user knows what a covered row promises:

- ``recorded``: a distinct recorded signature, rebuilt from its metadata;
- ``probe``: an unseen size vector inside the recorded ranges (`replay.select.probes`): the
  program generalizes between and at the ends of the recorded points;
- ``payload``: a sampled real call, run as it was (opt-in payloads).

Its ``target`` says what was checked (``torch``: the exported program). `CoverageRow` is the one
definition of a row: `replay.checking` and `replay.payload_rows` make them, `COVERAGE_SCHEMA` is
built from its fields, and readers (the artifact's refusal list, the CLI) read rows back with
`CoverageRow.from_table` rather than by position or by dict keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = [
    "CoverageRow",
    "COVERAGE_SCHEMA",
    "KIND_RECORDED",
    "KIND_PROBE",
    "KIND_PAYLOAD",
    "TARGET_TORCH",
    "coverage_table",
    "coverage_counts",
]

KIND_RECORDED = "recorded"
"""Coverage row kind: a distinct recorded signature, rebuilt from its metadata."""
KIND_PROBE = "probe"
"""Coverage row kind: an unseen size vector inside the recorded ranges."""
KIND_PAYLOAD = "payload"
"""Coverage row kind: a sampled real call (payloads)."""
TARGET_TORCH = "torch"
"""Coverage row target: the exported ``torch.export`` program."""

_LABELS = {KIND_RECORDED: "recorded signatures", KIND_PROBE: "probes", KIND_PAYLOAD: "payloads"}


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
        target: What was checked (`TARGET_TORCH`).
        sizes: The size vector checked, every input tensor size in leaf order (None for a
            payload that could not be read): what the refusal list matches on.
    """

    group: str | None
    kind: str
    signature: str
    calls: int
    covered: bool = False
    max_abs_diff: float | None = None
    error: str | None = None
    target: str = TARGET_TORCH
    sizes: tuple[int, ...] | None = None

    def checked(
        self, *, covered: bool, max_abs_diff: float | None, error: str | None
    ) -> CoverageRow:
        """This row with the outcome of its check."""
        return dataclasses.replace(self, covered=covered, max_abs_diff=max_abs_diff, error=error)

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
``payload``, `replay.payload_rows`)."""


def coverage_table(rows: Iterable[CoverageRow]) -> pa.Table:
    """Rows as a `COVERAGE_SCHEMA` table."""
    return pa.Table.from_pylist([r.as_dict() for r in rows], schema=COVERAGE_SCHEMA)


def coverage_counts(coverage: pa.Table) -> str:
    """Covered rows per kind, as text.

    Args:
        coverage: A coverage table (`COVERAGE_SCHEMA`).

    Returns:
        E.g. ``'9 of 9 recorded signatures, 3 of 4 probes covered'``.
    """
    counts: dict[str, list[int]] = {}
    kinds = coverage.column("kind").to_pylist()
    for kind, covered in zip(kinds, coverage.column("covered").to_pylist(), strict=True):
        counts.setdefault(kind, [0, 0])[0] += bool(covered)
        counts[kind][1] += 1
    parts = [f"{c} of {n} {_LABELS.get(k, f'{k} rows')}" for k, (c, n) in counts.items()]
    return ", ".join(parts) + " covered" if parts else "nothing checked"
