"""Figures as inline SVG markup, drawn by matplotlib's SVG backend; the shared plotting helpers.

Why static SVG from matplotlib rather than an embedded JS bundle (e.g. uPlot or Plotly from npm):
- a report is brought to a postmortem, pasted into a doc, printed to PDF, opened from a CI artifact
  viewer that runs no scripts: inline SVG shows in all of them; a canvas drawn by JS shows nothing
  where scripts are off;
- every mark is a DOM element, so the tests assert on what a reader sees (each plot has its data
  paths and markers) rather than on a bundle's internal state;
- size stays bounded by thinning what is drawn, not by what was observed: CDFs are drawn at most at
  ``CDF_POINTS`` quantile levels (exact there), scatters keep at most ``SCATTER_POINTS`` points (the
  slowest always kept), the waterfall samples streams, rates are binned. A 10,000-stream run stays
  well under 3 MB (``benchmarks/report_size.py`` prints the figures);
- matplotlib is well kept and already what people reach for; its import (~0.5 s) happens only when a
  page is rendered, never on ``import chaos``.
Everything here is pure: data in, markup out. ``Figure`` objects are used directly (no pyplot, no
global backend switch), so rendering is safe in a thread and leaves the caller's matplotlib alone.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "CDF_POINTS",
    "COLOURS",
    "PHASE_COLOURS",
    "SCATTER_POINTS",
    "Window",
    "cdf_points",
    "data_gid",
    "decorate_time_axes",
    "log_scale",
    "new_figure",
    "phase_colour",
    "thin_scatter",
    "to_svg",
]

CDF_POINTS = 400  # quantile levels a CDF is drawn at
SCATTER_POINTS = 4000  # most points of one scatter
COLOURS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#57606a", "#e16f24", "#1b7c83")
FAULT_COLOUR = "#cf222e"
BUDGET_COLOUR = "#cf222e"
_RC: dict[str, Any] = {
    "svg.fonttype": "none",  # text stays text: small, searchable, selectable
    "svg.hashsalt": "streamchaos",  # deterministic ids: the same run renders the same page
    "font.size": 9.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#d0d7de",
    "grid.linewidth": 0.5,
    "legend.fontsize": 8.0,
    "legend.frameon": False,
    "text.parse_math": False,  # names are the experiment's: a phase or SLA called `$x^$` is text, not mathtext
}
_ID = re.compile(r'\bid="([^"]+)"')
_counter = itertools.count(1)


@dataclass(frozen=True)
class Window:
    """A span on the run's time axis, in seconds from its start: a phase or a fault."""

    label: str
    start: float
    end: float


def data_gid(name: str) -> str:
    """A page-unique id for an artist that draws data: tests find every plot's data by ``sc-data-``."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    return f"sc-data-{safe}-{next(_counter)}"


PHASE_COLOURS = tuple(c for c in COLOURS if c != BUDGET_COLOUR)  # a curve never shares the budget line's colour


def phase_colour(i: int) -> str:
    return PHASE_COLOURS[i % len(PHASE_COLOURS)]


def new_figure(width_in: float, height_in: float, rows: int = 1, *, sharex: bool = False,
               margins_in: tuple[float, float, float, float] = (0.75, 0.2, 0.2, 0.55),
               hspace_in: float = 0.12) -> tuple[Figure, list[Axes]]:
    """A matplotlib ``Figure`` (not pyplot's) with ``rows`` axes stacked vertically.

    Margins (left, right, top, bottom) and the gap between rows are fixed in inches: a layout engine
    (constrained / tight) would measure every label first and take a third of the render time.
    """
    import matplotlib

    left, right, top, bottom = margins_in
    with matplotlib.rc_context(_RC):
        from matplotlib.figure import Figure

        fig = Figure(figsize=(width_in, height_in))
        axes = fig.subplots(rows, 1, sharex=sharex, squeeze=False)
        panel = (height_in - top - bottom - hspace_in * (rows - 1)) / rows
        fig.subplots_adjust(left=left / width_in, right=1 - right / width_in, top=1 - top / height_in,
                            bottom=bottom / height_in, hspace=hspace_in / max(panel, 0.1))
    return fig, [row[0] for row in axes]


def log_scale(ax: Axes, axis: str) -> None:
    """A log ``axis`` (``"x"`` or ``"y"``) whose tick labels are plain numbers (``10``, ``100``, ``0.5``).

    matplotlib's log formatter writes mathtext (``$\\mathdefault{10^{1}}$``), and `to_svg` turns
    mathtext off for every text (an experiment's names are text), so its labels would show raw.
    """
    from matplotlib.ticker import FuncFormatter, NullFormatter

    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def to_svg(fig: Figure, *, label: str) -> str:
    """The figure as an ``<svg>`` element to inline in HTML: no XML prolog, no date, ids made unique
    on the page (several figures share one document), sized by CSS, labelled for screen readers."""
    import matplotlib
    from matplotlib.text import Text

    for artist in fig.findobj(Text):  # every label, title, annotation and legend entry: `$` is a dollar sign
        artist.set_parse_math(False)
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, count=1, flags=re.S)
    prefix = f"f{next(_counter)}-"
    ours = {m for m in _ID.findall(text) if not m.startswith("sc-")}  # our own gids are unique already
    text = _ID.sub(lambda m: f'id="{prefix}{m.group(1)}"' if m.group(1) in ours else m.group(0), text)
    text = re.sub(r'(href="#|url\(#)([^")]+)',
                  lambda m: m.group(1) + (prefix + m.group(2) if m.group(2) in ours else m.group(2)), text)
    text = re.sub(r'<svg ([^>]*?)width="([\d.]+)pt" height="([\d.]+)pt"',
                  lambda m: f'<svg {m.group(1)}role="img" aria-label="{_attr(label)}" class="chart" '
                            f'style="max-width:{float(m.group(2)) * 4 / 3:.0f}px"', text, count=1)
    return text


def _attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


def cdf_points(values: Sequence[float] | np.ndarray[Any, Any],
               max_points: int = CDF_POINTS) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(x, F(x)) of the empirical CDF, drawn as steps; exact at the points kept.

    Up to ``max_points`` values every sample is a step; above, the sorted sample is read at evenly
    spaced ranks, always keeping the last (the maximum) so the tail a p99 budget is about is drawn.
    """
    ordered = np.sort(np.asarray(values, dtype=float))
    n = ordered.size
    if n == 0:
        return ordered, ordered
    if n <= max_points:
        ranks = np.arange(1, n + 1)
    else:
        ranks = np.unique(np.linspace(1, n, max_points).round().astype(int))
    return ordered[ranks - 1], ranks / n


def thin_scatter(x: Sequence[float], y: Sequence[float], max_points: int = SCATTER_POINTS,
                 keep_top: int = 200) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """At most ``max_points`` of (x, y): the ``keep_top`` largest y always, the rest evenly strided."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.size <= max_points:
        return xs, ys
    top = np.argsort(ys)[-keep_top:]
    rest = np.setdiff1d(np.arange(xs.size), top)
    stride = rest[np.linspace(0, rest.size - 1, max_points - keep_top).round().astype(int)]
    keep = np.union1d(top, stride)
    return xs[keep], ys[keep]


def decorate_time_axes(axes: Iterable[Axes], phases: Sequence[Window], faults: Sequence[Window], end: float,
                       start: float = 0.0) -> None:
    """Phase bands (alternating shade, names on the top axes) and fault windows on shared time axes,
    from ``start`` (the pre-load baseline, not the stack's start-up) to ``end``."""
    axes = list(axes)
    for ax in axes:
        for i, phase in enumerate(phases):
            if i % 2:
                ax.axvspan(phase.start, phase.end, color="#eaeef2", alpha=0.6, lw=0, zorder=0)
            ax.axvline(phase.start, color="#8c959f", lw=0.6, zorder=1)
        for fault in faults:
            ax.axvspan(fault.start, fault.end, color=FAULT_COLOUR, alpha=0.10, lw=0, zorder=0)
        ax.set_xlim(start, max(end, start + 1e-3))
    top = axes[0]
    for phase in phases:
        top.annotate(phase.label, xy=(phase.start, 1.0), xycoords=("data", "axes fraction"), xytext=(2, 2),
                     textcoords="offset points", fontsize=8, color="#57606a", va="bottom")
    for row, fault in enumerate(faults):
        top.annotate(f"▲ {fault.label}", xy=(fault.start, 1.0), xycoords=("data", "axes fraction"),
                     xytext=(2, 12 + 10 * (row % 3)), textcoords="offset points", fontsize=8, color=FAULT_COLOUR,
                     va="bottom")
    axes[-1].set_xlabel("seconds since the run started (red bands: faults in force)")
