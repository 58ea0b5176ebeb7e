"""report.html: one self-contained, offline page per run, assembled from the views.

Verdicts (units, intervals, samples, samples to decide), the judged distributions, the timeline
with fault windows, a token waterfall, each fault's plan / evidence / undo, the environment. No
script, no stylesheet or font or image fetched: open it from a CI artifact or an air-gapped laptop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.observations import Observations
from chaos.reports.html import esc, page, section

__all__ = ["render_html", "summary_line"]


def summary_line(report: Mapping[str, Any]) -> str:
    load = report.get("load") or {}
    verdicts = report.get("verdicts") or []
    bad = [v for v in verdicts if not v.get("ok")]
    text = (f"status <b>{esc(report.get('status'))}</b>, exit {esc(report.get('exit_code'))}, "
            f"{esc(report.get('duration_s'))}s; {esc(load.get('streams', 0))} streams "
            f"({esc(load.get('complete', 0))} complete, {esc(load.get('hung_up_on_purpose', 0))} hung up by client faults); "
            f"{len(verdicts)} verdicts, " + (f'<b class="fail">{len(bad)} not as expected</b>' if bad else '<b class="pass">all as expected</b>'))
    if report.get("error"):
        text += f'; <b class="fail">error: {esc(report["error"])}</b>'
    return text


def render_html(report: dict[str, Any], obs: Observations) -> str:
    """The page for one run, from its report.json dict and its observations. Pure."""
    from chaos.reports.distributions import render_distributions
    from chaos.reports.environment import render_environment
    from chaos.reports.faults import render_faults
    from chaos.reports.timeline import render_timeline
    from chaos.reports.verdicts import render_verdicts
    from chaos.reports.waterfall import render_waterfall

    body = "\n".join([
        f"<h1>{esc(report['experiment'])}</h1>",
        f"<p>{esc(report.get('description') or '')}</p>",
        f'<p class="summary">{summary_line(report)}</p>',
        section("verdicts", "Verdicts", render_verdicts(report.get("verdicts") or [])),
        section("distributions", "What was judged", render_distributions(report, obs)),
        section("timeline", "Timeline", render_timeline(report, obs)),
        section("waterfall", "Token waterfall", render_waterfall(report, obs)),
        section("faults", "Faults", render_faults(report.get("faults") or [])),
        section("environment", "Environment", render_environment(report)),
    ])
    return page(f"streamchaos: {report['experiment']}", body)
