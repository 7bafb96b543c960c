"""Kinds of coverage rows and their counts (the rows are made by `replay.exporting.export`).

A coverage row checks one size vector of a group against eager. Its ``kind`` says where the
vector comes from, so a user knows what a covered row promises:

- ``recorded``: a distinct recorded signature, rebuilt from its metadata;
- ``probe``: an unseen size vector inside the recorded ranges (`replay.select.probes`): the
  program generalizes between and at the ends of the recorded points;
- ``payload``: a sampled real call, run as it was (opt-in payloads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KIND_RECORDED", "KIND_PROBE", "KIND_PAYLOAD", "coverage_counts"]

KIND_RECORDED = "recorded"
"""Coverage row kind: a distinct recorded signature, rebuilt from its metadata."""
KIND_PROBE = "probe"
"""Coverage row kind: an unseen size vector inside the recorded ranges."""
KIND_PAYLOAD = "payload"
"""Coverage row kind: a sampled real call (payloads)."""

_LABELS = {KIND_RECORDED: "recorded signatures", KIND_PROBE: "probes", KIND_PAYLOAD: "payloads"}


def coverage_counts(coverage: pa.Table) -> str:
    """Covered rows per kind, as text.

    Args:
        coverage: A coverage table (`replay.exporting.COVERAGE_SCHEMA`).

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
