"""The run's timeline, one panel per signal on a shared time axis, with phases and fault windows:
TTFT per request, tokens/s, errors / early closes / hang-ups, KV usage, running and waiting
requests, GPU SM clock and power where they were sampled. Pure: report + observations in, HTML out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from chaos.model.observations import NS, Observations
from chaos.output.reports.data import (
    GPU_CLOCK_SERIES,
    GPU_POWER_SERIES,
    KV_SERIES,
    RUNNING_SERIES,
    WAITING_SERIES,
    bin_width,
    fault_windows,
    first_series,
    phase_windows,
    run_end,
    run_start,
    stream_tokens,
)
from chaos.output.reports.html import plot_figure
from chaos.output.reports.plot import COLOURS, data_gid, decorate_time_axes, log_scale, new_figure, thin_scatter, to_svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["render_timeline"]

Panel = Callable[["Axes"], int]  # draws into the axes, returns the data points drawn


def _ttft_panel(obs: Observations) -> tuple[str, Panel] | None:
    sent, ttft = [], []
    for st in obs.population():
        if st.t_sent is not None and st.ttft_ns is not None:
            sent.append((st.t_sent - obs.t0) / NS)
            ttft.append(st.ttft_ns / 1e6)
    if not sent:
        return None

    def draw(ax: Axes) -> int:
        x, y = thin_scatter(sent, ttft)
        ax.scatter(x, y, s=4, color=COLOURS[0], alpha=0.6, lw=0, gid=data_gid("ttft-points"))
        ax.set_ylabel("TTFT (ms)")
        if max(ttft) / max(min(ttft), 1e-3) > 100:
            log_scale(ax, "y")
        return int(len(x))

    return "TTFT per request, at its send time", draw


def _bins(end: float) -> np.ndarray[Any, Any]:
    width = bin_width(end)
    return np.arange(0.0, end + width, width)


def _tokens_panel(obs: Observations, end: float) -> tuple[str, Panel] | None:
    stamps: list[float] = []
    weights: list[float] = []
    for st in obs.population():
        times, per = stream_tokens(st)
        stamps.extend((t - obs.t0) / NS for t in times)
        weights.extend([per] * len(times))
    if not stamps:
        return None
    edges = _bins(end)
    counts, _ = np.histogram(stamps, bins=edges, weights=weights)
    rate = counts / np.diff(edges)

    def draw(ax: Axes) -> int:
        ax.step(edges[:-1], rate, where="post", color=COLOURS[2], lw=1.1, gid=data_gid("tokens-rate"))
        ax.set_ylabel("tokens/s")
        return int(rate.size)

    return "tokens/s received by the clients", draw


def _errors_panel(obs: Observations, end: float) -> tuple[str, Panel] | None:
    population = obs.population()
    if not population:
        return None
    errored, early, hung = [], [], []
    for st in population:
        t = st.t_end or (st.hangup.t if st.hangup else None) or st.t_sent
        if t is None:
            continue
        at = (t - obs.t0) / NS
        if st.hangup is not None:
            hung.append(at)
        elif st.error is not None or st.in_band_error is not None or (st.status or 0) >= 400:
            errored.append(at)
        elif not obs.complete(st):
            early.append(at)
    edges = _bins(end)

    def draw(ax: Axes) -> int:
        drawn = 0
        for values, colour, label, key in ((errored, COLOURS[1], "errors", "errors"),
                                           (early, COLOURS[4], "early closes", "early"),
                                           (hung, COLOURS[5], "hung up by a client fault", "hangups")):
            counts, _ = np.histogram(values, bins=edges)
            ax.step(edges[:-1], counts, where="post", color=colour, lw=1.1, label=f"{label} ({len(values)})",
                    gid=data_gid(f"{key}-count"))
            drawn += int(counts.size)
        ax.set_ylabel(f"streams / {bin_width(end):.2g}s")
        ax.legend(loc="best", ncols=3)
        return drawn

    return "streams ending in an error, closing early, or hung up by a client fault, at their end", draw


def _series_panel(obs: Observations, groups: tuple[tuple[tuple[str, ...], str], ...],
                  ylabel: str | Callable[[str], str],
                  what: str, scale: Callable[[str], float] = lambda name: 1.0) -> tuple[str, Panel] | None:
    found = [(first_series(obs, names), colour) for names, colour in groups]
    found = [(s, colour) for s, colour in found if s[0]]
    if not found:
        return None

    def draw(ax: Axes) -> int:
        drawn = 0
        for (name, t, v), colour in found:
            ax.step(t, v * scale(name), where="post", color=colour, lw=1.1, label=name, gid=data_gid(f"series-{name}"))
            drawn += int(t.size)
        ax.set_ylabel(ylabel if isinstance(ylabel, str) else ylabel(found[0][0][0]))
        ax.legend(loc="best")
        return drawn

    return what, draw


def _kv_scale(name: str) -> float:
    return 100.0 if name.endswith(("_perc", "token_usage")) else 1.0


def kv_label(name: str) -> str:
    """The KV panel's axis label for the series it draws: a share in %, blocks, or tokens."""
    if _kv_scale(name) == 100.0:
        return "KV cache used (%)"
    if "blocks" in name:
        return "KV blocks used"
    return "KV tokens in use" if "tokens" in name else name


def _gpu_panel(obs: Observations) -> tuple[str, Panel] | None:
    clock, power = first_series(obs, GPU_CLOCK_SERIES), first_series(obs, GPU_POWER_SERIES)
    if not clock[0] and not power[0]:
        return None

    def draw(ax: Axes) -> int:
        drawn = 0
        if clock[0]:
            ax.step(clock[1], clock[2], where="post", color=COLOURS[3], lw=1.1, label="SM clock (MHz)",
                    gid=data_gid("gpu-clock"))
            drawn += int(clock[1].size)
        ax.set_ylabel("SM clock (MHz)")
        if power[0]:
            twin = ax.twinx()
            twin.step(power[1], power[2], where="post", color=COLOURS[6], lw=1.1, label="power (W)",
                      gid=data_gid("gpu-power"))
            twin.set_ylabel("power (W)")
            twin.grid(False)
            drawn += int(power[1].size)
        return drawn

    return "GPU SM clock (summed over GPUs) and power", draw


def render_timeline(report: Mapping[str, Any], obs: Observations) -> str:
    end = run_end(dict(report), obs)
    panels = [p for p in (
        _ttft_panel(obs),
        _tokens_panel(obs, end),
        _errors_panel(obs, end),
        _series_panel(obs, ((KV_SERIES, COLOURS[3]),), kv_label, "KV-cache usage", _kv_scale),
        _series_panel(obs, ((RUNNING_SERIES, COLOURS[4]), (WAITING_SERIES, COLOURS[1])), "requests",
                      "running and waiting requests at the engine"),
        _gpu_panel(obs),
        _series_panel(obs, ((("streamchaos_k8s_pods_ready",), COLOURS[2]),
                            (("streamchaos_k8s_pods_terminating",), COLOURS[1])),
                      "pods", "Kubernetes pods: ready (serving) and terminating"),
    ) if p is not None]
    if not panels:
        return '<p class="muted">Nothing was observed over time.</p>'
    fig, axes = new_figure(10.0, 1.2 + 1.55 * len(panels), len(panels), sharex=True, margins_in=(0.8, 0.65, 0.6, 0.5))
    points = sum(draw(ax) for (_, draw), ax in zip(panels, axes, strict=True))
    decorate_time_axes(axes, phase_windows(dict(report), end), fault_windows(dict(report), end), end,
                       run_start(dict(report), obs))
    caption = ("Top to bottom: " + "; ".join(what for what, _ in panels)
               + ". Shaded columns alternate phases; red bands are faults in force.")
    return plot_figure("timeline", to_svg(fig, label="run timeline"), caption, points)
