"""`capture report`: one self-contained HTML page about a store's traffic, with plots.

The page needs no network when viewed: plots are SVG images inlined as ``data:`` URIs, the
style is inline, there is no script. Per model it shows the call groups, calls over time per
group, the distribution of every shared dynamic symbol per group (batch size, sequence, cache
or image sizes), which optional inputs were passed, the input structures over time (drift),
and, given an artifact's manifest, which recorded calls the artifact serves.

matplotlib (the ``report`` extra) is imported here, inside the functions that draw, and nowhere
else: ``import capture`` and ``capture query`` never load it. Data comes from
`capture.engines.report_data` (the ``stats`` rows, not the raw calls).
"""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from capture import __version__
from capture.analysis.summary import drift_rows, group_rows
from capture.engines.report_data import ServedGroup, served_calls, symbol_kind, timeline

if TYPE_CHECKING:
    from capture.analysis.groups import Group
    from capture.engines.report_data import Timeline
    from capture.store.reader import StoreReader

__all__ = ["build_report", "require_matplotlib"]

_CELL = 60  # characters: longer cell texts are cut, the whole text stays in the tooltip
_DPI = 96
_BLUE = "#0969da"
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1100px;color:#1d232a;line-height:1.4;padding:0 16px}
h1{font-size:1.6em;margin-bottom:0}h2{margin-top:2em;border-bottom:2px solid #d0d7de}
h3{margin-top:1.5em}.meta{color:#57606a}
table{border-collapse:collapse;margin:8px 0 16px;font-size:0.92em}
th,td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;max-width:28em;
overflow-wrap:anywhere;vertical-align:top}th{background:#f6f8fa;white-space:nowrap}
td.n{text-align:right;white-space:nowrap}
img{max-width:100%;height:auto;display:block;margin:8px 0}
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


def _table(rows: Sequence[Mapping[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    names = list(rows[0])
    head = "".join(f"<th>{_esc(n)}</th>" for n in names)
    body = "".join("<tr>" + "".join(_cell(r[n]) for n in names) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _join(values: Sequence[Any] | None) -> str:
    return ", ".join(str(v) for v in values or ())


def _figure_html(
    draw: Callable[[Any], None],
    alt: str,
    size: tuple[float, float],
    left: float = 0.8,
    top: float = 0.4,
) -> str:
    """Draws with ``draw(figure)`` and returns an ``<img>`` with the PNG inlined.

    Margins are fixed (`left` inches for the y labels) rather than computed by a layout
    engine: laying text out twice doubled the time of a report.
    """
    import matplotlib
    from matplotlib.figure import Figure

    width, height = size
    fig = Figure(figsize=size, dpi=_DPI)
    fig.subplots_adjust(
        left=left / width,
        right=1 - 0.25 / width,
        bottom=0.62 / height,
        top=1 - top / height,
        wspace=0.3,
    )
    draw(fig)
    buf = io.BytesIO()
    # SVG with text as text: 40% faster to write than PNG, and sharp at any zoom.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "capture"}):
        fig.savefig(buf, format="svg")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="{_esc(alt)}" src="data:image/svg+xml;base64,{data}">'


_UNITS = (("days", 86_400.0), ("hours", 3_600.0), ("minutes", 60.0), ("seconds", 1.0))


def _unit(tl: Timeline) -> tuple[str, float]:
    """The time unit for the x axis: the largest one the whole span covers twice."""
    span = tl.bin_us * tl.calls.shape[1] / 1e6
    for name, seconds in _UNITS:
        if span >= 2 * seconds:
            return name, seconds
    return "milliseconds", 1e-3


def _per_bin(tl: Timeline) -> str:
    seconds = tl.bin_us / 1e6
    for name, unit in _UNITS:
        if seconds >= unit:
            return f"{seconds / unit:.3g} {name.rstrip('s')}(s)"
    return f"{seconds * 1e3:.3g} ms"


def _start(tl: Timeline) -> str:
    return f"{datetime.fromtimestamp(tl.start_us / 1e6, tz=timezone.utc):%Y-%m-%d %H:%M:%S} UTC"


def _edges(tl: Timeline) -> tuple[np.ndarray[Any, Any], str]:
    name, seconds = _unit(tl)
    edges = np.arange(tl.calls.shape[1] + 1) * (tl.bin_us / 1e6 / seconds)
    return edges, f"{name} since {_start(tl)}"


def _timeline_plot(tl: Timeline) -> str:
    def draw(fig: Any) -> None:
        ax = fig.subplots()
        edges, label = _edges(tl)
        bottom = np.zeros(tl.calls.shape[1])
        for name, row in zip(tl.groups, tl.calls, strict=True):
            ax.stairs(bottom + row, edges, baseline=bottom.copy(), fill=True, label=name)
            bottom += row
        ax.set_xlim(edges[0], edges[-1])
        ax.set_xlabel(label)
        ax.set_ylabel(f"calls per {_per_bin(tl)}")
        columns = min(4, len(tl.groups)) or 1
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=columns, fontsize="small")
        ax.grid(alpha=0.3)

    rows = -(-len(tl.groups) // 4)
    return _figure_html(
        draw, "calls over time per call group", (10, 3.4 + 0.25 * rows), top=0.15 + 0.25 * rows
    )


def _drift_plot(tl: Timeline) -> str:
    def draw(fig: Any) -> None:
        ax = fig.subplots()
        edges, label = _edges(tl)
        shown = np.where(tl.calls > 0, tl.calls, np.nan)
        ax.imshow(
            shown,
            aspect="auto",
            cmap="viridis",
            interpolation="nearest",
            extent=(edges[0], edges[-1], len(tl.groups) - 0.5, -0.5),
        )
        ax.set_yticks(range(len(tl.groups)), tl.groups)
        ax.set_xlabel(label)
        ax.set_title("Input structures over time: when each call group was seen")

    longest = max((len(g) for g in tl.groups), default=4)
    height = 1.4 + 0.35 * len(tl.groups)
    return _figure_html(draw, "input structures over time", (10, height), 0.3 + 0.075 * longest)


def _distribution(g: Group, column: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    if g.matrix is None or g.weights is None:
        raise ValueError(f"call group {g.name!r} carries no signatures; use analyze()")
    sizes, inverse = np.unique(g.matrix[:, column], return_inverse=True)
    return sizes, np.bincount(inverse, weights=g.weights)


def _symbols_plot(g: Group, symbols: Sequence[tuple[str, int]]) -> str:
    def draw(fig: Any) -> None:
        axes = fig.subplots(1, len(symbols), squeeze=False)[0]
        for ax, (symbol, column) in zip(axes, symbols, strict=True):
            sizes, calls = _distribution(g, column)
            if len(sizes) <= 32:  # one bar per recorded size
                positions = np.arange(len(sizes))
                ax.bar(positions, calls, color=_BLUE)
                step = max(1, -(-len(sizes) // 12))
                ax.set_xticks(positions[::step], [str(s) for s in sizes[::step]])
            else:  # too many sizes for bars: a histogram of 48 bins, one filled outline
                counts, edges = np.histogram(sizes, bins=48, weights=calls)
                ax.stairs(counts, edges, fill=True, color=_BLUE)
            ax.set_title(f"{symbol} ({symbol_kind(g, symbol)})", fontsize="medium")
            ax.set_xlabel("size")
            ax.set_ylabel("calls")
            ax.grid(axis="y", alpha=0.3)

    width = min(12.0, 3.2 + 3.4 * len(symbols))
    return _figure_html(draw, f"distribution of the dynamic sizes of {g.name}", (width, 3.0))


def _optional_plot(rows: Sequence[Mapping[str, Any]]) -> str:
    def draw(fig: Any) -> None:
        ax = fig.subplots()
        names = [r["argument"] for r in rows]
        left = np.zeros(len(rows))
        for key, color in (("present", "#1a7f37"), ("missing", "#bf8700"), ("none", "#8c959f")):
            values = np.array([r[key] for r in rows], dtype=float)
            ax.barh(names, values, left=left, label=key, color=color)
            left += values
        ax.invert_yaxis()
        ax.set_xlabel("calls")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, fontsize="small")

    longest = max((len(str(r["argument"])) for r in rows), default=4)
    height = 1.4 + 0.4 * len(rows)
    return _figure_html(draw, "optional inputs", (8, height), 0.3 + 0.075 * longest)


def _group_section(g: Group, entry: Mapping[str, Any]) -> list[str]:
    parts = [f"<h3>Group {_esc(g.name)}: {g.calls:,} calls, {g.signatures:,} signatures</h3>"]
    free: list[tuple[str, int]] = []
    rows = []
    for s in entry["symbols"]:
        column = next(j for j, d in enumerate(g.dims) if d.symbol == s["symbol"])
        if s["expr"] is None:
            free.append((s["symbol"], column))
        rows.append(
            {
                "symbol": s["symbol"],
                "measures": symbol_kind(g, s["symbol"]),
                "min": s["min"],
                "max": s["max"],
                "distinct": s["distinct"],
                "equals": s["expr"] or "",
                "dims": len(s["dims"]),
                "first dim": s["dims"][0] if s["dims"] else "",
            }
        )
    if not rows:
        parts.append("<p>No dynamic dim: every call of this group has the same sizes.</p>")
        return parts
    parts.append(_table(rows))
    if free:
        parts.append(_symbols_plot(g, free[:4]))
        if len(free) > 4:
            parts.append(f"<p>{len(free) - 4} more symbols are in the table above.</p>")
    return parts


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
    model: Mapping[str, Any],
    groups: Sequence[Group],
    served: tuple[str, Sequence[Mapping[str, Any]]] | None,
) -> list[str]:
    name = model["model"]
    parts = [
        f"<h2>Model {_esc(name)}</h2>",
        f'<p class="meta">{model["calls"]:,} calls ({model["errors"]:,} raised), '
        f"{model['signatures']:,} distinct signatures, from {_esc(model['first_ts'])} to "
        f"{_esc(model['last_ts'])}</p>",
    ]
    entries = {e["name"]: e for e in model["groups"]}
    parts.append(_table(group_rows(model["groups"])))
    if not groups:
        return parts
    tl = timeline(store, name, groups)
    parts += ["<h3>Calls over time</h3>", _timeline_plot(tl)]
    parts.append("<h3>Dynamic sizes per call group</h3>")
    for g in groups:
        parts += _group_section(g, entries[g.name])
    parts.append("<h3>Optional inputs</h3>")
    optional = model["optional_inputs"]
    if optional:
        parts.append(
            _table(
                [{k: o[k] for k in ("argument", "present", "missing", "none")} for o in optional]
            )
        )
        parts.append(_optional_plot(optional))
    else:
        parts.append("<p>Every input was passed in every call, or in none.</p>")
    if model["always_absent"]:
        parts.append(
            f"<p>Never passed (missing or None): {_esc(_join(model['always_absent']))}</p>"
        )
    parts += [
        "<h3>Structures over time (drift)</h3>",
        "<p>One row per call group (input structure); colour: calls per time bin, from dark "
        "(few) to yellow (most); blank: none. A row that starts late or stops early is a "
        "structure that appeared or disappeared.</p>",
        _drift_plot(tl),
    ]
    drift = drift_rows(model)
    if drift:
        parts += ["<p>Inputs seen with several kinds, dtypes or ranks:</p>", _table(drift)]
    else:
        parts.append("<p>No input changed kind, dtype or rank.</p>")
    if served is not None:
        source, rows = served
        parts += _served_section(served_calls(groups, rows), source)
    return parts


def build_report(
    store: StoreReader,
    model: str | None = None,
    *,
    served: tuple[str, Sequence[Mapping[str, Any]]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> str:
    """The report page as one HTML string (module docstring).

    Args:
        store: An open store.
        model: One model, or None for every model in the store.
        served: ``(source, rows)`` for an artifact, the rows of `replay.ship.drift.check_rows`:
            adds which recorded calls it serves (`capture.engines.report_data.served_calls`).
        progress: Called with a short message before each step (the CLI's progress line).

    Returns:
        The page, a complete ``<!DOCTYPE html>`` document.

    Raises:
        UnknownModel: `model` is not in the store.
        CaptureError: matplotlib is not installed.

    Example:
        >>> page = build_report(open_store("capture-store"))  # doctest: +SKIP
        >>> Path("report.html").write_text(page)  # doctest: +SKIP
    """
    from capture.analysis.groups import analyze
    from capture.analysis.summary import build_summary

    require_matplotlib()
    say = progress or (lambda message: None)
    say("reading the store")
    models = store.check_model(model)
    groups = analyze(store, model)
    summary = build_summary(store, models, groups)
    title = f"capture report: {store.path}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="meta">{summary["calls"]:,} calls ({summary["errors"]:,} raised), '
        f"{summary['signatures']:,} distinct signatures, from {_esc(summary['first_ts'])} to "
        f"{_esc(summary['last_ts'])}. Written by capture {_esc(__version__)} on "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC. Call groups are the calls sharing "
        "one input structure; dims that are always equal share a symbol.</p>",
    ]
    for path in summary["skipped_files"]:
        parts.append(f'<p class="note">Skipped unreadable file: {_esc(path)}</p>')
    for i, entry in enumerate(summary["models"]):
        say(f"model {i + 1}/{len(summary['models'])}: {entry['model']}")
        mine = [g for g in groups if g.model == entry["model"]]
        parts += _model_section(store, entry, mine, served)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
