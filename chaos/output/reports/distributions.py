"""Per SLA entry, the distribution that was judged, as a CDF per phase, with the budget, the quantile
level, the verdict's own confidence interval on it, and the baseline phase overlaid: every kind that
names what its samples are (``SlaSpec.sample_label``: TTFT, inter-token gaps, ``recovery``'s two TTFT
samples). Pure: report + observations in, HTML out.

The samples drawn are the verifier's own: ``spec.samples(obs, phase)`` of the entry's spec, rebuilt
from the report's ``sla`` section, the very values the verdict was judged on and the budget proposer
reads; the interval, figure and counts drawn are read from the verdict's evidence, never recomputed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sla
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import Observations
from chaos.model.turns import parse_turns, turn_view
from chaos.output.render import format_value
from chaos.output.reports.html import esc, plot_figure
from chaos.output.reports.plot import BUDGET_COLOUR, cdf_points, data_gid, log_scale, new_figure, phase_colour, to_svg
from sla.base import SlaSpec

__all__ = ["drawn_specs", "render_distributions"]


def drawn_specs(report: Mapping[str, Any]) -> dict[str, SlaSpec]:
    """Entry name → spec, for the report's SLA entries whose kind has a distribution to draw."""
    specs: dict[str, SlaSpec] = {}
    for entry in report.get("sla") or []:
        try:
            spec = sla.spec_for(str(entry["kind"]), entry.get("params") or {}, parsed=True)
        except (ExperimentInvalid, KeyError, TypeError):
            continue  # a kind or parameters this install does not know: nothing it can draw
        if spec.sample_label is not None:
            specs[str(entry.get("name") or entry["kind"])] = spec
    return specs


def _baseline(report: Mapping[str, Any], verdicts: Sequence[Mapping[str, Any]]) -> str | None:
    for v in verdicts:
        base = (v.get("evidence") or {}).get("baseline_phase")
        if base:
            return str(base)
    phases = report.get("phases") or []
    return phases[0]["name"] if phases else None


def _judged_phase(verdict: Mapping[str, Any]) -> str | None:
    """The phase whose samples a verdict judged: its own, or the one its evidence names (``recovery``)."""
    phase = (verdict.get("evidence") or {}).get("judged_phase") or verdict.get("phase")
    return None if phase is None else str(phase)


def _figure(obs: Observations, report: Mapping[str, Any], name: str, spec: SlaSpec,
            verdicts: Sequence[Mapping[str, Any]]) -> str:
    kind, unit = verdicts[0]["sla"], verdicts[0]["unit"]
    baseline = _baseline(report, verdicts)
    judged = [(_judged_phase(v), v) for v in verdicts]
    curves: list[tuple[str | None, Mapping[str, Any] | None]] = list(judged)
    several_phases = len(report.get("phases") or []) > 1
    if baseline is not None and several_phases and baseline not in [p for p, _ in judged]:
        curves.insert(0, (baseline, None))  # the reference, drawn dashed

    fig, (ax,) = new_figure(6.6, 3.3, margins_in=(0.65, 0.15, 0.1, 0.5))
    k = 1000.0 if unit == "s" else 1.0  # every budget is written in ms: the axis is in ms too
    points, lowest, highest = 0, float("inf"), 0.0
    order = [p["name"] for p in report.get("phases") or []]
    for phase, verdict in curves:
        values = spec.samples(obs, phase) or []
        if not values:
            continue
        x, y = cdf_points(values)
        x = x * k
        points += len(x)
        lowest, highest = min(lowest, float(x[0])), max(highest, float(x[-1]))
        colour = phase_colour(order.index(phase)) if phase in order else "#57606a"
        dashed = verdict is None
        label = f"{phase or 'whole run'} (n={len(values):,})" + (" — the baseline phase" if dashed else "")
        (line,) = ax.step(x, y, where="post", color="#8c959f" if dashed else colour, lw=1.2,
                          ls="--" if dashed else "-", label=label)
        line.set_gid(data_gid(f"cdf-{name}"))
        if verdict is not None:
            _mark_quantile(ax, verdict, colour, k, (float(x[0]), float(x[-1])))
    if points == 0:
        return ""
    highest = _budget_lines(ax, unit, verdicts[0], k, highest)
    if lowest > 0 and highest / lowest > 50:
        log_scale(ax, "x")
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("share of samples ≤ x")
    axis_unit = "ms" if unit == "s" else unit
    ax.set_xlabel(f"{spec.sample_label} ({axis_unit})")
    ax.legend(loc="best")
    title = f"{name} ({kind})" if name != kind else kind
    svg = to_svg(fig, label=f"CDF of {title}")
    caption = _caption(str(spec.sample_label), verdicts, several_phases and baseline is not None)
    return f"<h3>{esc(title)}</h3>" + plot_figure(f"cdf-{name}", svg, caption, points)


def _mark_quantile(ax: Any, verdict: Mapping[str, Any], colour: str, k: float, span: tuple[float, float]) -> None:
    """The verdict's own interval on its quantile (a bar) and its figure (a dot), on its curve."""
    ev = verdict.get("evidence") or {}
    if not isinstance(ev.get("quantile"), (int, float)):
        return
    q = float(ev["quantile"])
    lo, hi = ev.get("lower"), ev.get("upper")
    if lo is not None or hi is not None:
        left = float(lo) * k if lo is not None else span[0]
        right = float(hi) * k if hi is not None else span[1]
        ax.plot([left, right], [q, q], color=colour, lw=4, alpha=0.35, solid_capstyle="butt")
    if verdict.get("figure") is not None and ev.get("decided_by", "quantile") == "quantile":
        ax.plot([verdict["figure"] * k], [q], marker="o", ms=4, color=colour)


def _budget_lines(ax: Any, unit: str, verdict: Mapping[str, Any], k: float, highest: float) -> float:
    """The budget when it is a time on the samples' axis (a ratio is not), its quantile level, and a
    stall limit the evidence names (``itl``'s ``max_stall_s``) as lines; the x extent they need."""
    evidence = verdict.get("evidence") or {}
    budget = verdict.get("budget")
    if unit == "s" and budget is not None:
        ax.axvline(budget * k, color=BUDGET_COLOUR, lw=1, ls="-", label=f"budget {format_value(budget, unit)}")
        highest = max(highest, float(budget) * k)
        level = evidence.get("quantile")
        if isinstance(level, (int, float)):
            ax.axhline(level, color="#57606a", lw=0.6, ls=":",
                       label=f"p{round(level * 100, 4):g} level (bar: its interval)")
    stall = evidence.get("max_stall_s")
    if isinstance(stall, (int, float)):
        ax.axvline(stall * k, color=BUDGET_COLOUR, lw=1, ls="-.", label=f"max stall {format_value(stall, 's')}")
    return highest


def _caption(label: str, verdicts: Sequence[Mapping[str, Any]], with_baseline: bool) -> str:
    parts = []
    for v in verdicts:
        ev = v.get("evidence") or {}
        text = f"{esc(v.get('phase') or 'run')}: <b class=\"{esc(v['status'])}\">{esc(v['status'])}</b>, " \
               f"{esc(format_value(v.get('figure'), v['unit']))} vs {esc(format_value(v.get('budget'), v['unit']))}"
        if ev.get("p_value") is not None:  # a rank test's (recovery): its p-value and both medians
            text += f" (Mann-Whitney p={ev['p_value']:.3g}, " \
                    f"medians {esc(format_value(ev.get('baseline_p50_s'), 's'))}" \
                    f" → {esc(format_value(ev.get('judged_p50_s'), 's'))})"
        if ev.get("censored_over_budget"):
            text += f"; {ev['censored_over_budget']} streams waited past the budget without content (counted over it)"
        parts.append(text)
    what = label[:1].upper() + label[1:] + (", the baseline phase dashed" if with_baseline else "")
    return f"{what}, cumulative. " + "; ".join(parts)


def _turns_judged(obs: Observations, verdicts: Sequence[Mapping[str, Any]]) -> Observations:
    """The streams an entry with ``turns:`` judged (its verdicts' evidence says which turns), else all."""
    written = (verdicts[0].get("evidence") or {}).get("turns")
    if not isinstance(written, str):
        return obs
    try:
        return turn_view(obs, parse_turns([part.strip() for part in written.split(",")]))
    except ValueError:
        return obs


def render_distributions(report: Mapping[str, Any], obs: Observations) -> str:
    specs = drawn_specs(report)
    by_entry: dict[str, list[Mapping[str, Any]]] = {}
    for v in report.get("verdicts") or []:
        if (v.get("name") or v["sla"]) in specs:
            by_entry.setdefault(v.get("name") or v["sla"], []).append(v)
    figures = [_figure(_turns_judged(obs, verdicts), report, name, specs[name], verdicts)
               for name, verdicts in by_entry.items()]
    figures = [f for f in figures if f]
    if not figures:
        return '<p class="muted">No verdicts with a sample to draw (TTFT, token gaps, recovery).</p>'
    return '<div class="grid">' + "".join(f"<div>{f}</div>" for f in figures) + "</div>"
