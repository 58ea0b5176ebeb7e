"""Each phase's planned vs actual duration, and how long its injects took. Pure: report dict in, HTML out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaos.output.render import format_value
from chaos.output.reports.html import esc

__all__ = ["render_phases"]


def _s(value: Any) -> str:
    return "-" if value is None else esc(format_value(value, "s"))


def render_phases(phases: Sequence[Mapping[str, Any]]) -> str:
    if not phases:
        return '<p class="muted">No phases ran.</p>'
    rows = []
    for p in phases:
        start, in_force = p.get("start_s"), p.get("in_force_at_s")
        injects = None if start is None or in_force is None else in_force - start
        rows.append(f'<tr data-phase="{esc(p["name"])}"><td>{esc(p["name"])}</td>'
                    f'<td>{_s(p.get("planned_duration_s"))}</td><td>{_s(p.get("actual_duration_s"))}</td>'
                    f'<td>{_s(injects)}</td><td>{_s(start)}</td><td>{_s(p.get("end_s"))}</td></tr>')
    return ("<table><thead><tr><th>phase</th><th>planned</th><th>actual (faults in force → revert)</th>"
            "<th>injects took</th><th>began at</th><th>ended at</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")
