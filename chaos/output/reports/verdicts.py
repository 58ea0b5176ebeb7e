"""The verdict table: each verdict's figure and budget with units, its confidence interval, the
samples it used (and the effective sample size where the verifier states one), for an undecided
verdict the samples that would decide it, why it was decided, and its whole evidence. Pure.

Everything shown is the verdict's own (``Verdict.evidence``): nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chaos.model.verdict import NOT_OBSERVABLE, counts_as
from chaos.output.render import format_value
from chaos.output.render import why_text as render_why_text
from chaos.output.reports.html import esc, kv_table

__all__ = ["interval_text", "render_unobservable", "render_verdicts", "samples_text", "status_cell", "to_decide_text",
           "why_text"]

_SHOWN_APART = ("lower", "upper", "samples_needed", "n_eff", "reason", "decided_by", "inconclusive_cause")


def interval_text(v: Mapping[str, Any]) -> str:
    """``[12.1ms, 15.3ms] @95%`` from a quantile verdict's order-statistic bounds; ``-`` when none."""
    ev = v.get("evidence") or {}
    if "lower" not in ev and "upper" not in ev:
        return "-"
    lower, upper = ev.get("lower"), ev.get("upper")
    conf = ev.get("confidence")
    level = f" @{conf:.0%}" if isinstance(conf, (int, float)) else ""
    q = ev.get("quantile")
    what = f"p{round(q * 100, 4):g} " if isinstance(q, (int, float)) else ""
    return f"{what}[{format_value(lower, v['unit'])}, {format_value(upper, v['unit'])}]{level}"


def samples_text(v: Mapping[str, Any]) -> str:
    """``n=1921`` and, where the evidence carries one, ``n_eff=340`` (correlated samples count less)."""
    ev = v.get("evidence") or {}
    text = f"{v.get('samples', 0):,}"
    n_eff = ev.get("n_eff")
    if isinstance(n_eff, (int, float)):
        text += f" (n_eff {n_eff:,.0f})"
    return text


def to_decide_text(v: Mapping[str, Any]) -> str:
    """For an inconclusive verdict: how many samples would decide it (the verdict's own projection)."""
    if v.get("status") != "inconclusive":
        return ""
    ev = v.get("evidence") or {}
    needed = ev.get("samples_needed")
    if isinstance(needed, (int, float)):
        return f"about {needed:,.0f}"
    if "samples_needed" in ev:
        return "no sample size: the budget sits on the estimate"
    return "-"


def why_text(v: Mapping[str, Any]) -> str:
    """The verdict's why, worded as on the console (``chaos.output.render.why_text``)."""
    return render_why_text(v.get("evidence") or {}, str(v.get("status") or ""))


def status_cell(v: Mapping[str, Any]) -> str:
    """The status cell's HTML: the status, what was expected, and for an ``unobservable`` verdict a badge
    and how it counts (``when_unobservable``; report.json from before it reads as tolerated)."""
    status = str(v["status"])
    expect = "" if v.get("expect", "pass") == "pass" else f" (expect {esc(v['expect'])})"
    if status != "unobservable":
        return f'<td class="{esc(status)}">{esc(status)}{expect}</td>'
    counted = counts_as(status, str(v.get("expect", "pass")), str(v.get("when_unobservable", "tolerate")))
    how = "tolerated" if counted is None else f"counts as {counted}"
    return (f'<td class="unobservable"><span class="badge unobservable" title="{esc(NOT_OBSERVABLE)}">unobservable'
            f'</span>{expect} <span class="muted">{esc(how)}</span></td>')


def render_unobservable(verdicts: list[Mapping[str, Any]]) -> str:
    """A block naming every unobservable verdict and why (empty when none): above the table, so a check the
    target could not show is never read as a pass."""
    rows = [f"<li><b>{esc(v.get('name') or v['sla'])}</b> ({esc(v.get('phase') or 'run')}): "
            f"{esc((v.get('evidence') or {}).get('reason') or 'no reason given')}</li>"
            for v in verdicts if v.get("status") == "unobservable"]
    if not rows:
        return ""
    return (f'<div class="unobservable-block"><p><span class="badge unobservable">{esc(NOT_OBSERVABLE)}</span> '
            f'these checks could not be made against this target:</p><ul>{"".join(rows)}</ul></div>')


def _ok_cell(v: Mapping[str, Any]) -> str:
    """✔ as expected, ✘ not, – for a tolerated unobservable verdict (as expected, but nothing was seen)."""
    if v.get("status") == "unobservable" and v.get("ok"):
        return '<td class="unobservable" title="tolerated: not observable on this engine">–</td>'
    return f'<td class="{"pass" if v.get("ok") else "fail"}">{"✔" if v.get("ok") else "✘"}</td>'


def render_verdicts(verdicts: list[Mapping[str, Any]]) -> str:
    if not verdicts:
        return '<p class="muted">No verdicts: the run did not complete, or the experiment has no SLA entries.</p>'
    rows = []
    for v in verdicts:
        kind = "" if (v.get("name") or v["sla"]) == v["sla"] else f' <span class="muted">{esc(v["sla"])}</span>'
        evidence = v.get("evidence") or {}
        rows.append(
            f'<tr class="verdict" data-sla="{esc(v.get("name") or v["sla"])}" '
            f'data-phase="{esc(v.get("phase") or "run")}">'
            f"{_ok_cell(v)}"
            f"<td>{esc(v.get('name') or v['sla'])}{kind}</td><td>{esc(v.get('phase') or 'run')}</td>"
            f"{status_cell(v)}"
            f'<td class="num">{esc(format_value(v.get("figure"), v["unit"]))}</td>'
            f'<td class="num">{esc(format_value(v.get("budget"), v["unit"]))}</td>'
            f'<td class="num">{esc(interval_text(v))}</td><td class="num">{esc(samples_text(v))}</td>'
            f"<td>{esc(to_decide_text(v))}</td><td>{esc(why_text(v))}</td>"
            "<td><details><summary>evidence</summary>"
            f"{kv_table(evidence, unit=v['unit'], skip=_SHOWN_APART)}</details></td></tr>"
        )
    head = ("<tr><th></th><th>SLA</th><th>phase</th><th>status</th><th>figure</th><th>budget</th>"
            "<th>confidence interval</th><th>samples</th><th>samples to decide</th><th>why</th><th></th></tr>")
    return f'{render_unobservable(verdicts)}<table class="verdicts">{head}{"".join(rows)}</table>'
