"""`capture report`: one self-contained HTML page about a store's traffic, with plots.

The page answers "what shapes do I export?". Its first screen shows each model's
call groups and their input shapes, with the symbols' recorded ranges. Then, per symbol, one
distribution over every group that has it (batch 1 included), with the recorded range,
p50/p90/p99, each group's exported range, the probes and the chosen buckets drawn on it; per
group, the ``dynamic_shapes`` to paste; then calls over time, optional inputs, the input
structures over time (drift, with a colour scale) and, given an artifact's manifest, which
recorded calls the artifact serves.

The page needs no network when viewed: plots are SVG images inlined as ``data:`` URIs, the
style is inline, there is no script. Figures are drawn by `capture.engines.report_plots`
(matplotlib, imported only there); data comes from `capture.engines.report_data` (the ``stats``
rows, not the raw calls). What ``capture export`` does with a group comes from `replay`, which
this package does not import: the caller passes ``plan`` (the CLI passes
`replay.inputs.source.export_plan`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from capture import __version__
from capture.analysis.summary import (
    ModelSummary,
    Summary,
    blocked_rows,
    drift_rows,
    group_table_rows,
    state_rows,
)
from capture.analysis.symbol_sizes import symbol_kind
from capture.engines.report_data import (
    ExportPlan,
    ServedGroup,
    ServedRow,
    SymbolView,
    served_calls,
    symbol_views,
    timeline,
)
from capture.engines.report_plots import (
    COLORS,
    drift_plot,
    optional_plot,
    per_bin,
    symbol_plot,
    timeline_plot,
)

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.store.reader import StoreReader

__all__ = ["build_report", "require_matplotlib"]

_CELL = 60  # characters: longer cell texts are cut, the whole text stays in the tooltip
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1100px;color:#1d232a;line-height:1.4;padding:0 16px}
h1{font-size:1.6em;margin-bottom:0}h2{margin-top:2em;border-bottom:2px solid #d0d7de}
h3{margin-top:1.6em}h4{margin:1.2em 0 0.3em}.meta{color:#57606a}
table{border-collapse:collapse;margin:8px 0 16px;font-size:0.92em}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;max-width:34em;
overflow-wrap:break-word;vertical-align:top}th{background:#f6f8fa;white-space:nowrap}
td.n{text-align:right;white-space:nowrap}td.id{white-space:nowrap;font-weight:600}
td.lines{white-space:pre-line;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;
font-size:0.9em}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:4px;padding:8px 12px;
overflow-x:auto;font-size:0.85em;line-height:1.35}
img{max-width:100%;height:auto;display:block;margin:8px 0}
.swatch{display:inline-block;width:0.8em;height:0.8em;border-radius:2px;margin-right:0.4em;
vertical-align:-0.05em}
.note{background:#fff8c5;border:1px solid #d4a72c;padding:6px 10px;border-radius:4px}
"""


def require_matplotlib() -> None:
    """Raises a clear error when matplotlib (the ``report`` extra) is not installed.

    Raises:
        CaptureError: matplotlib cannot be imported.
    """
    from capture.errors import CaptureError

    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise CaptureError(
            "capture report draws with matplotlib, which is not installed; "
            "pip install 'capture[report]' (or pip install matplotlib)"
        ) from e


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


_NUMBER = re.compile(r"^-?[0-9][0-9,.]*%?$")


def _cell(value: Any, numeric: bool = False) -> str:
    text = "" if value is None else str(value)
    numeric = numeric or bool(_NUMBER.match(text))
    if len(text) > _CELL:
        shown = text[: _CELL - 1] + "…"
        return f'<td title="{_esc(text)}">{_esc(shown)}</td>'
    return f'<td class="n">{_esc(text)}</td>' if numeric else f"<td>{_esc(text)}</td>"


def _table(rows: Sequence[Mapping[str, Any]], ids: Sequence[str] = ("group",)) -> str:
    """Rows as a table; the `ids` columns (names) never wrap, so no name breaks mid-word."""
    if not rows:
        return "<p>none</p>"
    names = list(rows[0])
    head = "".join(f"<th>{_esc(n)}</th>" for n in names)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="id">{_esc(r[n])}</td>' if n in ids else _cell(r[n]) for n in names)
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _join(values: Sequence[Any] | None) -> str:
    return ", ".join(str(v) for v in values or ())


def _span(low: int, high: int | None) -> str:
    return f"{low}–{high}" if high is not None else f"{low}–∞"


def _span_of(entry: Summary | ModelSummary) -> str:
    """``from 2026-11-24 08:40:46 to 08:41:02 UTC``: to the second."""
    first, last = entry.first_ts, entry.last_ts
    if first is None:
        return "no call recorded"

    def utc(value: Any) -> datetime:
        moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
        return moment.astimezone(timezone.utc) if moment.tzinfo else moment

    start, end = utc(first), utc(last if last is not None else first)
    until = f"{end:%H:%M:%S}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M:%S}"
    return f"from {start:%Y-%m-%d %H:%M:%S} to {until} UTC"


def _swatch(color: str) -> str:
    return f'<span class="swatch" style="background:{color}"></span>'


def _symbols_text(g: Group) -> str:
    """The symbols of a group with their recorded ranges: ``batch 2–4, attention_mask_1 6–23
    (= past_key_values_2 + 1)``."""
    seen: dict[str, str] = {}
    for d in g.dims:
        if d.symbol and d.dynamic and d.symbol not in seen:
            relation = f" (= {d.expr})" if d.expr else ""
            seen[d.symbol] = f"{d.symbol} {d.min}–{d.max}{relation}"
    return "\n".join(seen.values()) or "none: every size is the same in every call"


def _first_screen(groups: Sequence[Group], colors: Mapping[str, str], total: int) -> list[str]:
    """The groups and their shapes: what a user exports, before any plot."""
    from capture.engines.report_data import input_shapes

    rows = []
    for g in groups:
        share = f"{100 * g.calls / total:.1f}%" if total else "-"
        rows.append(
            "<tr>"
            f'<td class="id">{_swatch(colors[g.name])}{_esc(g.name)}</td>'
            f'<td class="n">{g.calls:,}</td><td class="n">{share}</td>'
            f'<td class="lines">{_esc(chr(10).join(input_shapes(g)))}</td>'
            f'<td class="lines">{_esc(_symbols_text(g))}</td></tr>'
        )
    head = "<tr><th>group</th><th>calls</th><th>share</th><th>input shapes</th>"
    head += "<th>symbols: recorded range</th></tr>"
    return [
        "<h3>Call groups and their shapes</h3>",
        "<p>Calls sharing one input structure form a group, exported as one program. A dynamic "
        "axis shows its symbol (equal axes share one); a static axis, its only size.</p>",
        f"<table>{head}{''.join(rows)}</table>",
    ]


def _symbol_rows(views: Sequence[SymbolView]) -> list[dict[str, Any]]:
    return [
        {
            "symbol": v.symbol,
            "measures": v.sizes.kind,
            "recorded": _span(v.sizes.sizes[0], v.sizes.sizes[-1]),
            "p50": v.percentiles[50],
            "p90": v.percentiles[90],
            "p99": v.percentiles[99],
            "exported": "; ".join(f"{g} {_span(*r)}" for g, r in v.exported.items()) or "-",
            "probes": _join(v.probes) or "-",
            "buckets": _join(v.buckets),
        }
        for v in views
    ]


def _symbols_section(views: Sequence[SymbolView], planned: bool) -> list[str]:
    if not views:
        return ["<h3>Sizes</h3>", "<p>No dim varies: every group has one shape.</p>"]
    parts = [
        "<h3>Sizes to export: one distribution per symbol</h3>",
        "<p>Each symbol's sizes over every group that has one of its axes, a static one "
        "included (a batch of 1 where batch never varies); colours are groups. Drawn on each: "
        "the recorded range; p50/p90/p99 (dotted: the size at or below which that share of the "
        "calls ran); "
        + (
            "each group's exported range (the bounded Dim of the dynamic_shapes below; "
            "torch.export keeps a dim dynamic from 2 up, so size-1 calls go to the groups where "
            "the axis is static); the probes (▲: unseen sizes the export is checked on besides "
            "every recorded signature); "
            if planned
            else ""
        )
        + "and the buckets (dashed: the sizes that pad the recorded calls least, as <code>"
        "capture buckets --symbol SYMBOL --budget 4</code> chooses them).</p>",
        _table(_symbol_rows(views), ids=("symbol",)),
    ]
    for v in views:
        parts.append(f"<h4>{_esc(v.symbol)} ({_esc(v.sizes.kind)})</h4>")
        parts.append(symbol_plot(v))
    return parts


def _group_section(g: Group, plan: ExportPlan | None) -> list[str]:
    parts = [f"<h4>Group {_esc(g.name)}: {g.calls:,} calls, {g.signatures:,} signatures</h4>"]
    rows: list[dict[str, Any]] = []
    for d in g.dims:
        if not (d.dynamic and d.symbol) or any(r["symbol"] == d.symbol for r in rows):
            continue
        covered = [x.path + f".shape[{x.axis}]" for x in g.dims if x.symbol == d.symbol]
        rows.append(
            {
                "symbol": d.symbol,
                "measures": symbol_kind(g, d.symbol),
                "min": d.min,
                "max": d.max,
                "distinct": d.distinct,
                "equals": d.expr or "",
                "dims": len(covered),
                "first dim": covered[0],
            }
        )
    if rows:
        parts.append(_table(rows, ids=("symbol",)))
    else:
        parts.append("<p>No dynamic dim: every call of this group has the same sizes.</p>")
    if plan is not None:
        parts.append(f"<pre>{_esc(plan.source)}</pre>")
    return parts


def _plans(
    groups: Sequence[Group], plan: Callable[[Group], ExportPlan] | None
) -> tuple[dict[str, ExportPlan], dict[str, str]]:
    """Each group's plan, and why a group has none (its structure cannot be rebuilt): the page
    says so for that group and draws no exported range for it, the rest of the report stands."""
    from capture.errors import CaptureError

    plans: dict[str, ExportPlan] = {}
    unplanned: dict[str, str] = {}
    if plan is None:
        return plans, unplanned
    for g in groups:
        try:
            plans[g.name] = plan(g)
        except CaptureError as e:
            unplanned[g.name] = str(e)
    return plans, unplanned


def _served_section(served: Sequence[ServedGroup], source: str) -> list[str]:
    rows = [
        {
            "group": s.group,
            "calls": s.calls,
            "served calls": s.served_calls,
            "served": f"{100 * s.served_calls / s.calls:.1f}%" if s.calls else "-",
            "signatures": s.signatures,
            "served signatures": s.served_signatures,
            "programs": _join(s.programs) or "none",
        }
        for s in served
    ]
    return [f"<h3>Served by the artifact {_esc(source)}</h3>", _table(rows)]


def _model_section(
    store: StoreReader,
    entry: ModelSummary,
    groups: Sequence[Group],
    served: tuple[str, Sequence[ServedRow]] | None,
    plan: Callable[[Group], ExportPlan] | None,
) -> list[str]:
    name = entry.model_name
    parts = [
        f"<h2>Model {_esc(name)}</h2>",
        f'<p class="meta">{entry.calls:,} calls ({entry.errors:,} raised), '
        f"{entry.signatures:,} distinct signatures, {_esc(_span_of(entry))}</p>",
    ]
    states = state_rows(entry.groups)
    if states:  # calls of two states are never one group: their names end with the state
        parts += ["<h3>States the calls ran under</h3>", _table(states, ids=("state",))]
    blocked = blocked_rows(entry.groups)
    if blocked:  # the calls are recorded; the class keeps them from export
        parts += ["<h3>Not exportable</h3>", _table(blocked)]
    if not groups:
        return [*parts, _table(group_table_rows(entry.groups))]
    colors = {g.name: COLORS[i % len(COLORS)] for i, g in enumerate(groups)}
    parts += _first_screen(groups, colors, entry.calls)
    plans, unplanned = _plans(groups, plan)
    parts += _symbols_section(symbol_views(groups, plans, colors), plan is not None)
    parts.append("<h3>Per group: its symbols and the dynamic_shapes to paste</h3>")
    if plan is not None:
        parts.append(
            "<p>As <code>capture dims --python</code> prints them; <code>capture export</code> "
            "exports and checks each group.</p>"
        )
    for g in groups:
        parts += _group_section(g, plans.get(g.name))
        if g.name in unplanned:
            parts.append(f'<p class="note">No dynamic_shapes: {_esc(unplanned[g.name])}</p>')
    tl = timeline(store, name, groups)
    parts += [
        "<h3>Calls over time</h3>",
        timeline_plot(tl),
        f'<p class="meta">Calls per {_esc(per_bin(tl))}, whole calls. The stats rows keep, per '
        "signature and minute, the number of calls and the first and last call's time: those "
        "two are placed exactly, the calls between them evenly in between (every exact time "
        'is in the calls view: <code>capture query "SELECT ts FROM calls"</code>).</p>',
    ]
    parts += _optional_section(entry)
    parts += [
        "<h3>Structures over time (drift)</h3>",
        "<p>One row per call group (input structure); colour: calls per time bin (scale on the "
        "right); blank: none. A row that starts late or stops early is a structure that "
        "appeared or disappeared.</p>",
        drift_plot(tl),
    ]
    drift = drift_rows(entry)
    if drift:
        parts += ["<p>Inputs seen with several kinds, dtypes or ranks:</p>", _table(drift)]
    else:
        parts.append("<p>No input changed kind, dtype or rank.</p>")
    if served is not None:
        source, rows = served
        parts += _served_section(served_calls(groups, rows), source)
    return parts


def _optional_section(entry: ModelSummary) -> list[str]:
    parts = ["<h3>Optional inputs</h3>"]
    optional = entry.optional_inputs
    if optional:
        keys = ("argument", "present", "missing", "none")
        rows = [{k: getattr(o, k) for k in keys} for o in optional]
        parts.append(_table(rows, ids=("argument",)))
        parts.append(optional_plot(optional))
    else:
        parts.append("<p>Every input was passed in every call, or in none.</p>")
    if entry.always_absent:
        parts.append(f"<p>Never passed (missing or None): {_esc(_join(entry.always_absent))}</p>")
    return parts


def build_report(
    store: StoreReader,
    model_name: str | None = None,
    *,
    served: tuple[str, Sequence[ServedRow]] | None = None,
    plan: Callable[[Group], ExportPlan] | None = None,
    progress: Callable[[str], None] | None = None,
) -> str:
    """The report page as one HTML string (module docstring).

    Args:
        store: An open store.
        model_name: One model, or None for every model in the store.
        served: ``(source, rows)`` for an artifact, the rows of `replay.check.drift.check_rows`:
            adds which recorded calls it serves (`capture.engines.report_data.served_calls`).
        plan: What ``capture export`` does with a group (`replay.inputs.source.export_plan`): adds
            the exported ranges, the probes and the ``dynamic_shapes`` to paste.
        progress: Called with a short message before each step (the CLI's progress line).

    Returns:
        The page, a complete ``<!DOCTYPE html>`` document.

    Raises:
        UnknownModel: `model_name` is not in the store.
        CaptureError: matplotlib is not installed.

    Example:
        >>> from replay.inputs.source import export_plan  # doctest: +SKIP
        >>> page = build_report(open_store("capture-store"), plan=export_plan)  # doctest: +SKIP
        >>> Path("report.html").write_text(page)  # doctest: +SKIP
    """
    from capture.analysis.groups import analyze
    from capture.analysis.summary import build_summary

    require_matplotlib()
    say = progress or (lambda message: None)
    say("reading the store")
    model_names = store.check_model(model_name)
    groups = analyze(store, model_name)
    summary = build_summary(store, model_names, groups)
    title = f"capture report: {store.path}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="meta">{summary.calls:,} calls ({summary.errors:,} raised), '
        f"{summary.signatures:,} distinct signatures, {_esc(_span_of(summary))}. "
        f"Written by capture {_esc(__version__)} on "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.</p>",
    ]
    for path in summary.skipped_files:
        parts.append(f'<p class="note">Skipped unreadable file: {_esc(path)}</p>')
    for i, entry in enumerate(summary.models):
        say(f"model {i + 1}/{len(summary.models)}: {entry.model_name}")
        mine = [g for g in groups if g.model_name == entry.model_name]
        parts += _model_section(store, entry, mine, served, plan)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
