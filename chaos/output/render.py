"""How a verdict reads, in one place: the terminal table, JUnit, the pytest failure message, `report`.

Pure functions of ``Verdict``s (or their report.json dicts through ``Verdict.from_dict``): figures
with their units (``212.4ms``, ``1.25%``, ``4,480 tokens/s``), the status with what was expected, and
a one-line account with the evidence that decided it.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from chaos.model.verdict import NOT_OBSERVABLE, Verdict

__all__ = ["budget_text", "figure_text", "format_value", "from_report", "samples_text", "unobservable_lines",
           "unobservable_note", "verdict_label", "verdict_line", "verdict_status", "verdict_table", "verdict_why",
           "why_lines", "why_text"]

_EVIDENCE_CHARS = 600
_WHY_LINES = 4  # a reason with its fix (the streaming verifier's names the proxy setting) fits; more is the page's


def format_value(value: float | None, unit: str) -> str:
    """A figure with its unit: seconds as s, ms, us or ns (whichever keeps it readable: a ``1us``
    budget reads ``1.0us``, never ``0.0ms``), fractions as percentages, counts as whole numbers."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if unit == "s":
        size = abs(value)
        if size >= 1:
            return f"{value:.2f}s"
        if size >= 1e-3 or size == 0:
            return f"{value * 1e3:.1f}ms"
        return f"{value * 1e6:.1f}us" if size >= 1e-6 else f"{value * 1e9:.1f}ns"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "fraction":
        return f"{value * 100:.2f}%"
    if unit == "ratio":
        return f"{value:.3g}x"
    if abs(value) >= 1000:
        return f"{value:,.0f} {unit}".strip()
    return f"{value:.4g} {unit}".strip()


def samples_text(v: Verdict) -> str:
    """``n``, or ``n (n_eff 41)`` when correlation made the samples worth fewer independent ones."""
    n_eff = v.evidence.get("n_eff") if isinstance(v.evidence, dict) else None
    if isinstance(n_eff, (int, float)) and n_eff < v.samples:
        return f"{v.samples} (n_eff {n_eff:.0f})"
    return str(v.samples)


def verdict_label(v: Verdict) -> str:
    """``ttft [baseline]``: the entry's name and the phase it judged."""
    return f"{v.name or v.sla} [{v.phase or 'run'}]"


def verdict_status(v: Verdict) -> str:
    """``PASS``, or ``FAIL (expect fail)`` for a regression check; ``UNOBSERVABLE (tolerated)`` or
    ``UNOBSERVABLE (counts as inconclusive)`` for evidence the target cannot show."""
    text = v.status.upper() + ("" if v.expect == "pass" else f" (expect {v.expect})")
    if v.status == "unobservable":
        text += " (tolerated)" if v.tolerated else f" (counts as {v.counts_as})"
    return text


def unobservable_note(v: Verdict) -> str:
    """``tolerated``, or ``counts as inconclusive (when_unobservable: inconclusive)``: how it counts."""
    if v.tolerated:
        return "tolerated"
    why = f"when_unobservable: {v.when_unobservable}" if v.when_unobservable != "tolerate" else "expect: fail"
    return f"counts as {v.counts_as} ({why})"


def unobservable_lines(verdicts: Iterable[Verdict]) -> list[str]:
    """One line per unobservable verdict: ``not observable on this engine: kv_cleanup (baseline): <reason>
    [tolerated]``, for the console's own block under the table."""
    return [f"{NOT_OBSERVABLE}: {v.name or v.sla} ({v.phase or 'run'}): "
            f"{(v.evidence or {}).get('reason') or 'no reason given'} [{unobservable_note(v)}]"
            for v in verdicts if v.status == "unobservable"]


def verdict_line(v: Verdict, *, evidence: bool = True) -> str:
    """One line: label, status against expectation, figure vs budget, samples, and the evidence."""
    line = (
        f"{verdict_label(v)}: {v.status} (expected {v.expect}); "
        f"{figure_text(v)} vs budget {budget_text(v)}, n={samples_text(v)}"
    )
    if evidence and v.evidence:
        line += "; evidence: " + json.dumps(v.evidence, default=str)[:_EVIDENCE_CHARS]
    return line


def figure_text(v: Verdict) -> str:
    """The figure as judged: ``p75 20.4ms`` for a quantile, ``0 of 120 bad`` for a count of streams."""
    if v.unit == "count":
        return "-" if v.figure is None else f"{format_value(v.figure, v.unit)} of {v.samples:,} bad"
    q = v.evidence.get("quantile") if isinstance(v.evidence, dict) else None
    text = format_value(v.figure, v.unit)
    if isinstance(q, (int, float)) and not isinstance(q, bool) and v.figure is not None:
        return f"p{round(q * 100, 4):g} {text}"
    return text


def budget_text(v: Verdict) -> str:
    """The budget: ``none allowed`` for a count whose budget is zero, else the value with its unit."""
    if v.unit == "count" and v.budget == 0:
        return "none allowed"
    return format_value(v.budget, v.unit)


def verdict_table(verdicts: Iterable[Verdict], *, width: int = 100) -> list[str]:
    """The terminal table's lines: a header, a rule, one row per verdict (ok / !! marks), and under each
    failed or inconclusive row why (``why_lines``, wrapped to ``width`` columns)."""
    verdicts = list(verdicts)
    rows = [("SLA", "PHASE", "STATUS", "FIGURE", "BUDGET", "N")]  # N: samples (n_eff: the evidence, report.html)
    for v in verdicts:
        mark = "-- " if v.tolerated else "ok " if v.ok else "!! "
        rows.append((mark + (v.name or v.sla), v.phase or "run", verdict_status(v), figure_text(v),
                     budget_text(v), str(v.samples)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows[:1]]
    lines.append("  ".join("-" * w for w in widths))
    for row, v in zip(rows[1:], verdicts, strict=True):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        lines.extend(why_lines(v, width))
    return lines


def why_text(evidence: Mapping[str, Any], status: str = "") -> str:
    """Why a verdict was decided, in the verifier's own words: what decided it (when not its quantile),
    why it is undecided, its reason (``not observable on this engine: <reason>`` for an ``unobservable``
    ``status``). The console and report.html's verdict table both show this."""
    if status == "unobservable":
        return f"{NOT_OBSERVABLE}: {evidence.get('reason') or 'no reason given'}"
    parts = [str(evidence[k]) for k in ("inconclusive_cause", "reason") if evidence.get(k)]
    if evidence.get("decided_by") and evidence["decided_by"] != "quantile":
        parts.insert(0, f"decided by {evidence['decided_by']}")
    return "; ".join(parts)


def verdict_why(v: Verdict) -> str:
    """``why_text``; for a verdict whose verifier gave no words, its interval against the budget."""
    evidence = v.evidence if isinstance(v.evidence, dict) else {}
    text = why_text(evidence, v.status)
    lower, upper = evidence.get("lower"), evidence.get("upper")
    if text or lower is None or upper is None:
        return text
    conf = evidence.get("confidence")
    level = f"{conf:.0%} " if isinstance(conf, (int, float)) else ""
    q = evidence.get("quantile")
    of = f" of the p{round(q * 100, 4):g}" if isinstance(q, (int, float)) and not isinstance(q, bool) else ""
    inside = "contains" if v.status == "inconclusive" else "does not contain"
    return (f"the {level}interval [{format_value(lower, v.unit)}, {format_value(upper, v.unit)}]{of} {inside} "
            f"the budget {budget_text(v)}")


def why_lines(v: Verdict, width: int = 100) -> list[str]:
    """``   why: ...`` under a failed, inconclusive or unobservable verdict's row, wrapped to ``width`` columns (at most
    a few lines: report.html has the whole evidence); nothing for a pass."""
    text = verdict_why(v) if v.status != "pass" else ""
    if not text:
        return []
    return textwrap.wrap(text, width=max(40, width), initial_indent="   why: ", subsequent_indent="        ",
                         max_lines=_WHY_LINES, placeholder=" … (report.html has the rest)", break_on_hyphens=False)


def from_report(verdicts: Iterable[dict[str, Any]]) -> list[Verdict]:
    """report.json's verdict dicts back to ``Verdict``s, to render them the same way."""
    return [Verdict.from_dict(v) for v in verdicts]
