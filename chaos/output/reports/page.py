"""report.html: one self-contained, offline page per run, assembled from the views.

Verdicts (units, intervals, samples, samples to decide), the judged distributions, the timeline
with fault windows, a token waterfall, each fault's plan / evidence / undo, the environment. No
script, no stylesheet or font or image fetched: open it from a CI artifact or an air-gapped laptop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.model.observations import Observations
from chaos.output.reports.html import esc, page, section

__all__ = ["next_steps_html", "render_html", "summary_line"]


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
        section("faults", "Faults", render_faults(report.get("faults") or [])),
        section("environment", "Environment", render_environment(report)),
    ])
    return page(f"streamchaos: {report['experiment']}", body)
