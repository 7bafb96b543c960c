"""Kinds of coverage rows and their counts (the rows are made by `replay.exporting.export`).

A coverage row checks one size vector of a group against eager. Its ``kind`` says where the
vector comes from, so a user knows what a covered row promises:

- ``recorded``: a distinct recorded signature, rebuilt from its metadata;
- ``probe``: an unseen size vector inside the recorded ranges (`replay.select.probes`): the
  program generalizes between and at the ends of the recorded points;
- ``payload``: a sampled real call, run as it was (opt-in payloads).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "KIND_RECORDED",
    "KIND_PROBE",
    "KIND_PAYLOAD",
    "coverage_total",
    "group_coverage",
]

KIND_RECORDED = "recorded"
"""Coverage row kind: a distinct recorded signature, rebuilt from its metadata."""
KIND_PROBE = "probe"
"""Coverage row kind: an unseen size vector inside the recorded ranges."""
KIND_PAYLOAD = "payload"
"""Coverage row kind: a sampled real call (payloads)."""

_LABELS = {KIND_RECORDED: "recorded signatures", KIND_PROBE: "probes", KIND_PAYLOAD: "payloads"}


def _diff(value: float | None) -> str:
    """A max abs diff in 3 significant digits (``1.79e-07``); ``-`` when nothing was compared."""
    return "-" if value is None else f"{value:.3g}"


def _worst(rows: list[dict[str, Any]]) -> float | None:
    diffs = [r["max_abs_diff"] for r in rows if r["max_abs_diff"] is not None]
    return max(diffs) if diffs else None


def _share(rows: list[dict[str, Any]]) -> str:
    return f"{sum(1 for r in rows if r['covered'])}/{len(rows)}" if rows else "-"


def group_coverage(coverage: pa.Table) -> list[dict[str, Any]]:
    """One row per group of a coverage table: what ``capture export`` and ``capture demo``
    print for people (the full table stays in ``-f json`` and behind ``--signatures``).

    Args:
        coverage: A coverage table (`replay.exporting.COVERAGE_SCHEMA`).

    Returns:
        Rows in the order the groups first appear: ``group``; ``signatures``, ``calls``,
        ``probes`` (and ``payloads`` when there are any) as ``covered/total``; ``worst diff``,
        the largest max abs diff of the group in 3 significant digits; ``error``, the first
        error of the group (empty when none).

    Example:
        >>> import pyarrow as pa
        >>> table = pa.Table.from_pylist([
        ...     {"group": "g0", "kind": "recorded", "calls": 3, "covered": True,
        ...      "max_abs_diff": 1.7881393e-07, "error": None},
        ...     {"group": "g0", "kind": "probe", "calls": 0, "covered": True,
        ...      "max_abs_diff": 0.0, "error": None}])
        >>> group_coverage(table)
        [{'group': 'g0', 'signatures': '1/1', 'calls': '3/3', 'probes': '1/1', \
'worst diff': '1.79e-07', 'error': ''}]
    """
    rows = coverage.to_pylist()
    payloads = any(r["kind"] == KIND_PAYLOAD for r in rows)
    out = []
    for group in dict.fromkeys(r["group"] for r in rows):
        mine = [r for r in rows if r["group"] == group]
        recorded = [r for r in mine if r["kind"] == KIND_RECORDED]
        calls = sum(r["calls"] for r in recorded)
        covered_calls = sum(r["calls"] for r in recorded if r["covered"])
        row: dict[str, Any] = {
            "group": group,
            "signatures": _share(recorded),
            "calls": f"{covered_calls}/{calls}" if recorded else "-",
            "probes": _share([r for r in mine if r["kind"] == KIND_PROBE]),
        }
        if payloads:
            row["payloads"] = _share([r for r in mine if r["kind"] == KIND_PAYLOAD])
        row["worst diff"] = _diff(_worst(mine))
        row["error"] = next((r["error"] for r in mine if r["error"]), "")
        out.append(row)
    return out


def coverage_total(coverage: pa.Table) -> str:
    """The total line under a coverage table: signatures, calls, probes, worst difference.

    Args:
        coverage: A coverage table (`replay.exporting.COVERAGE_SCHEMA`).

    Returns:
        E.g. ``'35 of 35 recorded signatures covered (35 of 35 calls), 3 of 3 probes
        covered, max abs diff 1.79e-07'``.

    Example:
        >>> import pyarrow as pa
        >>> coverage_total(pa.Table.from_pylist([
        ...     {"group": "g0", "kind": "recorded", "calls": 2, "covered": False,
        ...      "max_abs_diff": None, "error": "Guard failed"}]))
        '0 of 1 recorded signatures covered (0 of 2 calls), max abs diff -'
    """
    rows = coverage.to_pylist()
    recorded = [r for r in rows if r["kind"] == KIND_RECORDED]
    parts = [
        f"{sum(1 for r in recorded if r['covered'])} of {len(recorded)} recorded signatures "
        f"covered ({sum(r['calls'] for r in recorded if r['covered'])} of "
        f"{sum(r['calls'] for r in recorded)} calls)"
    ]
    for kind in (KIND_PROBE, KIND_PAYLOAD):
        mine = [r for r in rows if r["kind"] == kind]
        if mine:
            parts.append(
                f"{sum(1 for r in mine if r['covered'])} of {len(mine)} {_LABELS[kind]} covered"
            )
    return ", ".join(parts) + f", max abs diff {_diff(_worst(rows))}"
