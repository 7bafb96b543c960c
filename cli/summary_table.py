"""The table format of `capture summary`: `Store.summary()` as a report for people.

Only text is built here; `cli.output` writes it. The json/jsonl formats print its JSON form
(`capture.analysis.summary.Summary.to_json`), so anything the report leaves out (structure
ids, per-group timestamps) is still there.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from capture.analysis import summary as summaries

from .fit import Fit
from .output import table_text

__all__ = ["summary_report"]

_INDENT = "  "


def _join(values: Iterable[Any] | None) -> str:
    return ", ".join(str(v) for v in values or ())


_CELL = 80
"""Widest list cell of the report; longer lists are cut (``capture dims`` lists every dim)."""


def _brief(values: Sequence[Any] | None) -> str:
    """The values joined, cut to about `_CELL` characters with a count of the rest."""
    items = [str(v) for v in values or ()]
    shown: list[str] = []
    for i, item in enumerate(items):
        rest = len(items) - i
        if shown and len(", ".join([*shown, item])) > _CELL - 12:
            return f"{', '.join(shown)}, +{rest} more"
        shown.append(item if len(item) <= _CELL else item[: _CELL - 3] + "...")
    return ", ".join(shown)


def _utc(timestamp: Any) -> datetime:
    moment = timestamp if isinstance(timestamp, datetime) else datetime.fromisoformat(timestamp)
    return moment.astimezone(timezone.utc) if moment.tzinfo else moment


def _span(entry: summaries.Summary | summaries.ModelSummary) -> str:
    """``from 2026-11-24 08:40:46 to 08:41:02 UTC``: to the second (json keeps microseconds)."""
    first, last = entry.first_ts, entry.last_ts
    if first is None:
        return "no call recorded"
    start, end = _utc(first), _utc(last if last is not None else first)
    until = f"{end:%H:%M:%S}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M:%S}"
    return f"from {start:%Y-%m-%d %H:%M:%S} to {until} UTC"


def _counts(entry: summaries.Summary | summaries.ModelSummary) -> str:
    return (
        f"{entry.calls} calls ({entry.errors} raised), "
        f"{entry.signatures} distinct signatures, {_span(entry)}"
    )


_PATHS = ("dims",)
"""Columns listing key paths: shortened on a terminal, they keep their end."""


def _section(title: str, rows: Sequence[dict[str, Any]], width: int | None) -> list[str]:
    """A titled table; nothing when there are no rows (the section is left out)."""
    if not rows:
        return []
    fit = Fit(width, keep_end=_PATHS)
    return ["", title, table_text(rows, indent=_INDENT, fit=fit)]


def _differing_scalars(groups: Sequence[summaries.GroupSummary]) -> list[str]:
    """Scalar paths whose recorded value is not the same in every group."""
    paths: list[str] = []
    for g in groups:
        paths.extend(p for p in g.scalars if p not in paths)
    return [p for p in paths if len({g.scalars.get(p) for g in groups}) > 1]


def _groups(groups: Sequence[summaries.GroupSummary], width: int | None) -> list[str]:
    differing = _differing_scalars(groups)
    rows = [
        {
            **row,
            **(
                {"scalars": _join(f"{p}={g.scalars.get(p, '-')}" for p in differing)}
                if differing
                else {}
            ),
        }
        for row, g in zip(summaries.group_table_rows(groups), groups, strict=True)
    ]
    return _section("Call groups (calls sharing one input structure), largest first", rows, width)


def _states(groups: Sequence[summaries.GroupSummary], width: int | None) -> list[str]:
    title = "States (what the calls ran under besides their arguments; never one group)"
    return _section(title, summaries.state_rows(groups), width)


def _symbols(groups: Sequence[summaries.GroupSummary], width: int | None) -> list[str]:
    rows = [
        {
            "group": g.name,
            "symbol": s.symbol,
            "min": s.min,
            "max": s.max,
            "distinct": s.distinct,
            **({"expr": s.expr} if any(x.expr for h in groups for x in h.symbols) else {}),
            "dims": _brief(s.dims),
        }
        for g in groups
        for s in g.symbols
    ]
    if not rows:
        return ["", "Dynamic dims: none, every recorded size is the same in all calls of a group"]
    return _section("Dynamic dims (dims sharing a symbol are equal in every call)", rows, width)


def _optional(model_summary: summaries.ModelSummary, width: int | None) -> list[str]:
    lines: list[str] = []
    rows = [
        {
            "argument": o.argument,
            "present": o.present,
            "missing": o.missing,
            "none": o.none,
            "absent in": _join(o.absent_in),
        }
        for o in model_summary.optional_inputs
    ]
    lines += _section("Optional inputs (passed in some calls only; counts are calls)", rows, width)
    if model_summary.always_absent:
        lines += [
            "",
            f"Never passed (missing or None in every call): {_join(model_summary.always_absent)}",
        ]
    return lines


def _drift(model_summary: summaries.ModelSummary, width: int | None) -> list[str]:
    rows = summaries.drift_rows(model_summary)
    return _section("Drift (inputs seen with several kinds, dtypes or ranks)", rows, width)


def _blocked(groups: Sequence[summaries.GroupSummary], width: int | None) -> list[str]:
    title = "Not exportable (a recorded class capture cannot rebuild; calls still recorded)"
    return _section(title, summaries.blocked_rows(groups), width)


def _relations(model_summary: summaries.ModelSummary, width: int | None) -> list[str]:
    rows = [{"group": r.group, "relation": r.relation} for r in model_summary.relations]
    return _section("Relations between dims (true in every recorded call)", rows, width)


def _programs(model_summary: summaries.ModelSummary, width: int | None) -> list[str]:
    rows = model_summary.programs
    if rows is None:
        return []
    if not rows:
        return ["", "Programs of the artifact: none serves this model"]
    return _section(
        "Programs of the artifact per call group (regimes: where torch.export cut a group; "
        "fills: inputs filled for a group served by another's program)",
        [{k: ("-" if v is None else v) for k, v in row.items()} for row in rows],
        width,
    )


def summary_report(summary: summaries.Summary, width: int | None = None) -> str:
    """Formats `Store.summary()` as sections of aligned tables.

    Args:
        summary: `Store.summary()`.
        width: The terminal's width to fit the tables to (`cli.fit`), or None for in full.

    Returns:
        The report, without a trailing newline.

    Example:
        >>> print(summary_report(summaries.Summary("s", 0, 0, 0, None, None, (), ())))
        Store s
        0 calls (0 raised), 0 distinct signatures, no call recorded
    """
    lines = [f"Store {summary.store}", _counts(summary)]
    for path in summary.skipped_files:
        lines.append(f"Skipped unreadable file: {path}")
    for model_summary in summary.models:
        lines += ["", f"== Model {model_summary.model_name} ==", _counts(model_summary)]
        groups = model_summary.groups
        if groups:
            lines += _states(groups, width)
            lines += _groups(groups, width)
            lines += _blocked(groups, width)
            lines += _symbols(groups, width)
        lines += _optional(model_summary, width)
        lines += _drift(model_summary, width)
        lines += _relations(model_summary, width)
        lines += _programs(model_summary, width)
    return "\n".join(lines)
