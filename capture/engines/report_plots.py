"""The figures of `capture report`, drawn with matplotlib and inlined as SVG ``<img>`` tags.

matplotlib (the ``report`` extra) is imported inside the functions that draw, and nowhere else:
``import capture`` and ``capture query`` never load it. Every count axis has integer ticks and
every size axis is numeric (sizes 1, 3 and 8 are drawn at 1, 3 and 8: the gaps between them
decide ranges and buckets). Data comes from `capture.engines.report_data`.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from capture.analysis.summary import OptionalInput
    from capture.engines.report_data import SymbolView, Timeline

__all__ = [
    "COLORS",
    "figure_html",
    "timeline_plot",
    "drift_plot",
    "symbol_plot",
    "optional_plot",
    "per_bin",
]

COLORS = (
    "#0969da",
    "#bf8700",
    "#1a7f37",
    "#cf222e",
    "#8250df",
    "#1b7c83",
    "#9a6700",
    "#57606a",
    "#bc4c00",
    "#4d2d8f",
)
"""One colour per call group (in the model's group order), the same in every figure."""

_DPI = 96
_INK = "#1d232a"
_MUTED = "#57606a"
_BUCKET = "#cf222e"
_PROBE = "#bf8700"


def figure_html(
    draw: Callable[[Any], None],
    alt: str,
    size: tuple[float, float],
    left: float = 0.8,
    top: float = 0.4,
    right: float = 0.25,
) -> str:
    """Draws with ``draw(figure)`` and returns an ``<img>`` with the SVG inlined.

    Margins are fixed (`left` inches for the y labels) rather than computed by a layout
    engine: laying text out twice doubled the time of a report.

    Args:
        draw: Fills a matplotlib `Figure`.
        alt: The image's alternative text.
        size: Width and height in inches.
        left: Left margin in inches (y labels); `top`, `right`: the other margins.

    Returns:
        ``<img alt=... src="data:image/svg+xml;base64,...">``.

    Example:
        >>> figure_html(lambda fig: fig.subplots().plot([1, 2]), "a line", (4, 3))[:9]
        '<img alt='
    """
    import matplotlib
    from matplotlib.figure import Figure

    width, height = size
    fig = Figure(figsize=size, dpi=_DPI)
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
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
    return f'<img alt="{html.escape(alt, quote=True)}" src="data:image/svg+xml;base64,{data}">'


def _integer_counts(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


_UNITS = (("days", 86_400.0), ("hours", 3_600.0), ("minutes", 60.0), ("seconds", 1.0))


def _unit(tl: Timeline) -> tuple[str, float]:
    """The time unit for the x axis: the largest one the whole span covers twice."""
    span = tl.bin_us * tl.calls.shape[1] / 1e6
    for name, seconds in _UNITS:
        if span >= 2 * seconds:
            return name, seconds
    return "milliseconds", 1e-3


def per_bin(tl: Timeline) -> str:
    """The width of one time bin, for people (``1.2 second(s)``, ``89.4 ms``).

    Args:
        tl: A `Timeline`.

    Returns:
        The width with its unit.
    """
    seconds = tl.bin_us / 1e6
    for name, unit in _UNITS:
        if seconds >= unit:
            return f"{seconds / unit:.3g} {name.rstrip('s')}(s)"
    return f"{seconds * 1e3:.3g} ms"


def _edges(tl: Timeline) -> tuple[np.ndarray[Any, Any], str]:
    name, seconds = _unit(tl)
    edges = np.arange(tl.calls.shape[1] + 1) * (tl.bin_us / 1e6 / seconds)
    start = datetime.fromtimestamp(tl.start_us / 1e6, tz=timezone.utc)
    return edges, f"{name} since {start:%Y-%m-%d %H:%M:%S} UTC"


def _over_time(
    tl: Timeline,
    body: Callable[[Any, Any, Any, str], None],
    alt: str,
    size: tuple[float, float],
    left: float = 0.8,
    top: float = 0.4,
) -> str:
    """A figure of one axes over the timeline's bins: ``body(figure, axes, bin edges, x
    label)`` draws on it (`figure_html` makes the ``<img>``)."""

    def draw(fig: Any) -> None:
        edges, label = _edges(tl)
        body(fig, fig.subplots(), edges, label)

    return figure_html(draw, alt, size, left, top)


def timeline_plot(tl: Timeline) -> str:
    """Stacked whole calls per time bin, one colour per group.

    Args:
        tl: The model's `Timeline`.

    Returns:
        The figure as an ``<img>`` (`figure_html`).
    """

    def draw(fig: Any, ax: Any, edges: Any, label: str) -> None:
        bottom = np.zeros(tl.calls.shape[1])
        for i, (name, row) in enumerate(zip(tl.groups, tl.calls, strict=True)):
            color = COLORS[i % len(COLORS)]
            top = bottom + row
            ax.stairs(top, edges, baseline=bottom.copy(), fill=True, label=name, color=color)
            bottom = top
        ax.set_xlim(edges[0], edges[-1])
        ax.set_ylim(0, max(1.0, float(bottom.max()) * 1.05))
        _integer_counts(ax)
        ax.set_xlabel(label)
        ax.set_ylabel(f"calls per {per_bin(tl)}")
        columns = min(4, len(tl.groups)) or 1
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.0), ncols=columns, fontsize="small")
        ax.grid(alpha=0.3)

    rows = -(-len(tl.groups) // 4)
    size = (10, 3.4 + 0.25 * rows)
    return _over_time(tl, draw, "calls over time per call group", size, top=0.15 + 0.25 * rows)


def drift_plot(tl: Timeline) -> str:
    """One row per group, one column per time bin, coloured by calls, with a colour bar.

    Args:
        tl: The model's `Timeline`: its groups are the heatmap's rows, its time bins the
            columns.

    Returns:
        The figure as an ``<img>`` (`figure_html`).
    """

    def draw(fig: Any, ax: Any, edges: Any, label: str) -> None:
        shown = np.where(tl.calls > 0, tl.calls, np.nan)
        image = ax.imshow(
            shown,
            aspect="auto",
            cmap="viridis",
            interpolation="nearest",
            extent=(edges[0], edges[-1], len(tl.groups) - 0.5, -0.5),
            vmin=1,
            vmax=max(1, int(tl.calls.max(initial=0))),
        )
        ax.set_yticks(range(len(tl.groups)), tl.groups)
        ax.set_xlabel(label)
        ax.set_title("Input structures over time: when each call group was seen")
        bar = fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
        bar.set_label(f"calls per {per_bin(tl)}")
        _integer_counts(bar.ax)

    longest = max((len(g) for g in tl.groups), default=4)
    height = 1.6 + 0.35 * len(tl.groups)
    return _over_time(tl, draw, "input structures over time", (10, height), 0.3 + 0.075 * longest)


def symbol_plot(view: SymbolView) -> str:
    """One symbol's sizes over every group that has it (stacked, numeric axis), with what
    decides an export drawn on it: the recorded range, p50/p90/p99, each group's exported range,
    the probes and the chosen buckets.

    Args:
        view: The symbol's `SymbolView`.

    Returns:
        The figure as an ``<img>`` (`figure_html`).
    """

    def draw(fig: Any) -> None:
        from matplotlib.ticker import MaxNLocator

        ax = fig.subplots()
        sizes = view.sizes.sizes
        low, high = sizes[0], sizes[-1]
        wide = high - low > 120  # too many sizes for one bar each: bins over the range
        peak = _stacked_sizes(ax, view, wide)
        _decisions(ax, view, peak)
        ax.set_xlim(low - 0.02 * (high - low) - 0.8, high + 0.25 * (high - low) + 2.5)
        if not wide:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=16))
        _integer_counts(ax)
        ax.set_xlabel(f"{view.symbol} ({view.sizes.kind})")
        ax.set_ylabel("calls")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="x-small")

    return figure_html(draw, f"distribution of {view.symbol}", (10.5, 3.6), top=0.2, right=2.4)


def _stacked_sizes(ax: Any, view: SymbolView, wide: bool) -> float:
    """The symbol's calls per size, one bar colour per group, stacked (binned when `wide`);
    returns the highest stack."""
    dist = view.sizes
    low, high = dist.sizes[0], dist.sizes[-1]
    bins = np.histogram_bin_edges(dist.sizes, bins=60, range=(low, high + 1)) if wide else None
    bottom: dict[float, float] = {}
    width: Any
    for name, values, calls in dist.groups:
        color = view.colors[name]
        if bins is not None:
            counts, edges = np.histogram(values, bins=bins, weights=calls)
            x, heights, width = edges[:-1], counts, np.diff(edges)
            align = "edge"
        else:
            x, heights, width, align = np.array(values), np.array(calls), 0.8, "center"
        base = np.array([bottom.get(float(v), 0.0) for v in x])
        ax.bar(x, heights, bottom=base, width=width, align=align, color=color, label=name)
        for v, b, h in zip(x, base, heights, strict=True):
            bottom[float(v)] = float(b + h)
    return max(bottom.values(), default=1.0)


def _decisions(ax: Any, view: SymbolView, peak: float) -> None:
    """What decides an export, over bars `peak` high: p50/p90/p99, the recorded and each
    group's exported range (one lane each), the chosen buckets and the probes."""
    low, high = view.sizes.sizes[0], view.sizes.sizes[-1]
    lanes = 2 + len(view.exported)
    ax.set_ylim(0, peak * (1.15 + 0.13 * lanes))
    for q, value in view.percentiles.items():
        ax.axvline(value, color=_MUTED, linestyle=":", linewidth=1.2)
        ax.text(value, peak * 1.06, f"p{q}", ha="center", fontsize="x-small", color=_MUTED)
    lane = peak * 1.18

    def bracket(lo: float, hi: float, text: str, color: str) -> None:
        nonlocal lane
        ax.plot([lo, hi], [lane, lane], color=color, linewidth=2.2, marker="|", markersize=9)
        ax.text(hi + 0.02 * (high - low + 1), lane, text, va="center", fontsize="x-small")
        lane += peak * 0.13

    bracket(low, high, f"recorded {low}–{high}", _INK)
    for name, (lo, hi) in view.exported.items():
        top = hi if hi is not None else high
        bracket(lo, top, f"exported ({name}) {lo}–{hi if hi is not None else '∞'}", _MUTED)
    if view.buckets:
        ax.vlines(
            view.buckets,
            0,
            peak,
            colors=_BUCKET,
            linestyles="--",
            linewidth=1.2,
            label=f"buckets ({len(view.buckets)})",
        )
    if view.probes:
        ax.plot(
            view.probes,
            [0] * len(view.probes),
            linestyle="none",
            marker="^",
            markersize=9,
            color=_PROBE,
            clip_on=False,
            zorder=5,
            label="probes",
        )


def optional_plot(rows: Sequence[OptionalInput]) -> str:
    """Calls per optional input: passed, missing, None.

    Args:
        rows: A model's `capture.analysis.summary.OptionalInput` rows.

    Returns:
        The figure as an ``<img>`` (`figure_html`).
    """

    def draw(fig: Any) -> None:
        ax = fig.subplots()
        names = [r.argument for r in rows]
        left = np.zeros(len(rows))
        for key, color in (("present", "#1a7f37"), ("missing", "#bf8700"), ("none", "#8c959f")):
            values = np.array([getattr(r, key) for r in rows], dtype=float)
            ax.barh(names, values, left=left, label=key, color=color)
            left += values
        ax.invert_yaxis()
        ax.set_xlabel("calls")
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=3, fontsize="small")

    longest = max((len(r.argument) for r in rows), default=4)
    height = 1.4 + 0.4 * len(rows)
    return figure_html(draw, "optional inputs", (8, height), 0.3 + 0.075 * longest)
