"""How a verdict reads, in one place: the terminal table, JUnit, the pytest failure message, `report`.

Pure functions of ``Verdict``s (or their report.json dicts through ``Verdict.from_dict``): figures
with their units (``212.4ms``, ``1.25%``, ``4,480 tokens/s``), the status with what was expected, and
a one-line account with the evidence that decided it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from sla.base import Verdict

__all__ = ["format_value", "from_report", "samples_text", "verdict_label", "verdict_line", "verdict_status", "verdict_table"]

_EVIDENCE_CHARS = 600


def format_value(value: float | None, unit: str) -> str:
    """A figure with its unit: seconds as ms below 1 s, fractions as percentages."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if unit == "s":
        return f"{value:.2f}s" if abs(value) >= 1 else f"{value * 1000:.1f}ms"
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
    """``PASS``, or ``FAIL (expect fail)`` for a regression check."""
    return v.status.upper() + ("" if v.expect == "pass" else f" (expect {v.expect})")


def verdict_line(v: Verdict, *, evidence: bool = True) -> str:
    """One line: label, status against expectation, figure vs budget, samples, and the evidence."""
    line = (
        f"{verdict_label(v)}: {v.status} (expected {v.expect}); "
        f"{format_value(v.figure, v.unit)} vs budget {format_value(v.budget, v.unit)}, n={samples_text(v)}"
    )
    if evidence and v.evidence:
        line += "; evidence: " + json.dumps(v.evidence, default=str)[:_EVIDENCE_CHARS]
    return line


def verdict_table(verdicts: Iterable[Verdict]) -> list[str]:
    """The terminal table's lines: a header, a rule, one row per verdict (ok / !! marks)."""
    rows = [("SLA", "PHASE", "STATUS", "FIGURE", "BUDGET", "N")]  # N: samples, and their effective size
    for v in verdicts:
        mark = "ok " if v.ok else "!! "
        rows.append((mark + (v.name or v.sla), v.phase or "run", verdict_status(v), format_value(v.figure, v.unit),
                     format_value(v.budget, v.unit), str(v.samples)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def from_report(verdicts: Iterable[dict[str, Any]]) -> list[Verdict]:
    """report.json's verdict dicts back to ``Verdict``s, to render them the same way."""
    return [Verdict.from_dict(v) for v in verdicts]
