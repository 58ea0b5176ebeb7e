"""report.html: one self-contained, offline page per run, assembled from the views.

Verdicts (units, intervals, samples, samples to decide), the judged distributions, the timeline
with fault windows, a token waterfall, each fault's plan / evidence / undo, the environment. No
script, no stylesheet or font or image fetched: open it from a CI artifact or an air-gapped laptop.

A view beyond the built-in ones is a panel: a pure ``render(report, observations) -> str`` decorated
with ``@panel(ident, title)``, drawn as its own section before the environment (docs/dev/report-panel.md).
An in-tree panel's module is named in ``PANEL_MODULES``, which the page imports before it draws.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from chaos.model.observations import Observations
from chaos.output.reports.html import esc, page, section

__all__ = ["PANELS", "PANEL_MODULES", "Panel", "next_steps_html", "panel", "render_html", "summary_line"]

Render = Callable[[Mapping[str, Any], Observations], str]

# the built-in views' section ids, in page order (a panel may not take one)
BUILTIN_SECTIONS = ("verdicts", "distributions", "timeline", "waterfall", "phases", "faults", "environment")
PANEL_MODULES: tuple[str, ...] = ()  # in-tree panel modules: importing one registers its panels


@dataclass(frozen=True)
class Panel:
    """A view beyond the built-in ones: its section id (the page's anchor), its heading, its render."""

    ident: str
    title: str
    render: Render


PANELS: dict[str, Panel] = {}  # registered panels, drawn in registration order before the environment


def panel(ident: str, title: str) -> Callable[[Render], Render]:
    """Decorator: draw ``render(report, observations)`` as section ``ident`` of every report.html.

    ``render`` is pure (the report dict and the observations in, an HTML fragment out) and must escape
    what it prints (``chaos.output.reports.html.esc``)."""

    def add(render: Render) -> Render:
        known = PANELS.get(ident)
        if ident in BUILTIN_SECTIONS or (known is not None and known.render is not render):
            raise AssertionError(f"report panel {ident!r} registered twice")
        PANELS[ident] = Panel(ident, title, render)
        return render

    return add


def summary_line(report: Mapping[str, Any]) -> str:
    """The page's one-line outcome: a run's error first and in red; green only for a run that completed
    with every verdict as expected (a run that judged nothing or ended in error never reads as a pass)."""
    from chaos.model.outcome import ended, judged_nothing

    load = report.get("load") or {}
    verdicts = report.get("verdicts") or []
    bad = [v for v in verdicts if not v.get("ok")]
    text = f'<b class="fail">error: {esc(report["error"])}</b>; ' if report.get("error") else ""
    text += (f"status <b>{esc(report.get('status'))}</b>, exit {esc(report.get('exit_code'))}, "
             f"{esc(report.get('duration_s'))}s; {esc(load.get('streams', 0))} streams "
             f"({esc(load.get('complete', 0))} complete, {esc(load.get('hung_up_on_purpose', 0))} hung up by client "
             "faults); ")
    if judged_nothing(report):
        return text + (f'<b class="fail">nothing judged: the run {esc(ended(report.get("status")))} before any '
                       'verdict</b>')
    text += f"{len(verdicts)} verdicts, "
    if bad:
        return text + f'<b class="fail">{len(bad)} not as expected</b>'
    if report.get("exit_code") != 0:
        return text + (f'<b class="fail">as expected, but the run {esc(ended(report.get("status")))} (exit '
                       f'{esc(report.get("exit_code"))})</b>')
    return text + '<b class="pass">all as expected</b>'


def next_steps_html(report: Mapping[str, Any]) -> str:
    """For a run that judged nothing: what to check, as a list; empty otherwise."""
    from chaos.model.outcome import judged_nothing, next_steps

    if not judged_nothing(report):
        return ""
    steps = next_steps(report.get("error"), str(report.get("status")))
    return ('<p class="fail">What to check:</p><ul class="next-steps">' + "".join(f"<li>{esc(s)}</li>" for s in steps)
            + "</ul>" if steps else "")


def render_html(report: dict[str, Any], obs: Observations) -> str:
    """The page for one run, from its report.json dict and its observations. Pure."""
    from chaos.output.reports.distributions import render_distributions
    from chaos.output.reports.environment import render_environment
    from chaos.output.reports.faults import render_faults
    from chaos.output.reports.phases import render_phases
    from chaos.output.reports.timeline import render_timeline
    from chaos.output.reports.verdicts import render_verdicts
    from chaos.output.reports.waterfall import render_waterfall
    from chaos.output.turn_table import render_turn_table

    body = "\n".join([
        f"<h1>{esc(report['experiment'])}</h1>",
        f"<p>{esc(report.get('description') or '')}</p>",
        f'<p class="summary">{summary_line(report)}</p>',
        next_steps_html(report),
        section("verdicts", "Verdicts", render_verdicts(report.get("verdicts") or [])),
        section("distributions", "What was judged", render_distributions(report, obs)),
        section("timeline", "Timeline", render_timeline(report, obs)),
        section("waterfall", "Token waterfall", render_waterfall(report, obs)),
        section("phases", "Phases", render_phases(report.get("phases") or [])),
        *([section("turns", "Per turn", turns)] if (turns := render_turn_table(report.get("turns"))) else []),
        section("faults", "Faults", render_faults(report.get("faults") or [])),
        *_panels(report, obs),
        section("environment", "Environment", render_environment(report)),
    ])
    return page(f"streamchaos: {report['experiment']}", body)


def _panels(report: dict[str, Any], obs: Observations) -> list[str]:
    """The registered panels' sections (their in-tree modules imported first, which registers them)."""
    for name in PANEL_MODULES:
        importlib.import_module(name)
    return [section(p.ident, p.title, p.render(report, obs)) for p in PANELS.values()]
