"""A token waterfall for a sample of streams: one row per stream from its send to its end, a tick
per content event, and its ending marked — hung up by a client fault, timed out, cut (an error or no
terminal event). Pure: observations in, HTML out.

The sample: every abnormal stream first (up to half the rows), then evenly spaced by send time, so
a 10,000-stream run still shows both what went wrong and what normal looked like.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from chaos.model.observations import NS, STRICT_END, EndRule, Observations, StreamRecord
from chaos.output.reports.data import fault_windows, phase_windows, run_end, run_start
from chaos.output.reports.html import plot_figure
from chaos.output.reports.plot import COLOURS, data_gid, decorate_time_axes, new_figure, to_svg

__all__ = ["ROWS", "ending", "render_waterfall", "sample_streams"]

ROWS = 40
# ticks drawn per row at most: a 10-inch row shows no more apart, and a stream's events cannot grow the
# report (a target streaming 751,554 tiny events into one request made a 55 MB report.html)
TICKS_PER_ROW = 500
ENDINGS = {  # how a stream ended → (marker, colour, legend)
    "hangup": ("x", COLOURS[5], "hung up by a client fault"),
    "timeout": ("s", COLOURS[3], "timed out"),
    "cut": ("X", COLOURS[1], "cut: an error or no terminal event"),
}


def ending(stream: StreamRecord, rule: EndRule = STRICT_END) -> str:
    """``complete``, ``hangup``, ``timeout`` or ``cut``."""
    if stream.hangup is not None:
        return "hangup"
    if stream.error is not None and stream.error.kind == "timeout":
        return "timeout"
    return "complete" if stream.is_complete(rule) else "cut"


def sample_streams(streams: list[StreamRecord], rows: int = ROWS, rule: EndRule = STRICT_END) -> list[StreamRecord]:
    sent = sorted((s for s in streams if s.t_sent is not None), key=lambda s: s.t_sent or 0)
    if len(sent) <= rows:
        return sent
    odd = [s for s in sent if ending(s, rule) != "complete"][: rows // 2]
    rest = [s for s in sent if ending(s, rule) == "complete"]
    picks: list[int] = np.linspace(0, len(rest) - 1, rows - len(odd)).round().astype(int).tolist() if rest else []
    chosen = odd + [rest[i] for i in sorted(set(picks))]
    return sorted(chosen, key=lambda s: s.t_sent or 0)


def _thinned(stamps: list[int]) -> list[int]:
    """At most ``TICKS_PER_ROW`` of a stream's content stamps, evenly by count, first and last kept. Pure."""
    if len(stamps) <= TICKS_PER_ROW:
        return stamps
    picks = np.linspace(0, len(stamps) - 1, TICKS_PER_ROW).round().astype(int)
    return [stamps[i] for i in picks]


def render_waterfall(report: Mapping[str, Any], obs: Observations) -> str:
    rule = obs.end_rule
    streams = sample_streams(obs.population(), rule=rule)
    if not streams:
        return '<p class="muted">No streams were sent.</p>'
    end = run_end(dict(report), obs)
    fig, (ax,) = new_figure(10.0, 1.1 + 0.16 * len(streams), margins_in=(1.2, 0.65, 0.6, 0.5))
    spans_x: list[float] = []
    spans_y: list[float] = []
    ticks_x: list[float] = []
    ticks_y: list[float] = []
    ends: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in ENDINGS}
    for row, st in enumerate(streams):
        start = ((st.t_sent or 0) - obs.t0) / NS
        stop_ns = st.t_end or (st.hangup.t if st.hangup else None) or (st.t_content[-1] if st.t_content else st.t_sent)
        stop = ((stop_ns or 0) - obs.t0) / NS
        spans_x += [start, stop, np.nan]
        spans_y += [row, row, np.nan]
        for t in _thinned(st.t_content):  # one vertical tick per content event, all in one path
            at = (t - obs.t0) / NS
            ticks_x += [at, at, np.nan]
            ticks_y += [row - 0.35, row + 0.35, np.nan]
        kind = ending(st, rule)
        if kind in ends:
            ends[kind][0].append(stop)
            ends[kind][1].append(row)
    ax.plot(spans_x, spans_y, color="#d0d7de", lw=1.0, gid=data_gid("waterfall-spans"))
    ax.plot(ticks_x, ticks_y, color=COLOURS[0], lw=0.6, gid=data_gid("waterfall-ticks"))
    for kind, (xs, ys) in ends.items():
        if xs:
            marker, colour, label = ENDINGS[kind]
            ax.scatter(xs, ys, marker=marker, s=22, color=colour, label=f"{label} ({len(xs)})", zorder=3,
                       gid=data_gid(f"waterfall-{kind}"))
    ax.set_yticks(range(len(streams)), [f"{st.id} · {st.phase}" for st in streams], fontsize=6)
    ax.set_ylim(len(streams) - 0.5, -0.5)
    ax.grid(axis="y", visible=False)
    decorate_time_axes([ax], phase_windows(dict(report), end), fault_windows(dict(report), end), end,
                       run_start(dict(report), obs))
    if any(xs for xs, _ in ends.values()):
        ax.legend(loc="best", fontsize=7)
    points = len(ticks_x) // 3 + len(streams)
    shown = len(streams)
    total = len([s for s in obs.population() if s.t_sent is not None])
    caption = (f"{shown} of {total} streams (abnormal ones first, the rest evenly by send time): a grey line from "
               f"send to end, a blue tick per content event (at most {TICKS_PER_ROW} a row, evenly spaced by "
               "count), the ending marked when it was not a clean finish.")
    return plot_figure("waterfall", to_svg(fig, label="token waterfall"), caption, points)
