"""Each phase's planned vs real duration (its whole window, its injects and reverts included), how
long its faults were in force on its clock, and how long its injects and reverts took. Pure: report
dict in, HTML out. A phase that runs until decided (``duration: {min, max}``) shows its range and
how its looks ended it (``until_text``, the console's words too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaos.output.render import format_value
from chaos.output.reports.html import esc

__all__ = ["render_phases", "until_text"]

# what ended a phase that runs until decided (``PhaseWindow.stopped_by``)
_STOPPED = {"decided": "stopped at look {n}, decided", "max": "stopped at its max (look {n}), undecided"}


def _s(value: Any) -> str:
    return "-" if value is None else esc(format_value(value, "s"))


def until_text(p: Mapping[str, Any]) -> str | None:
    """How a phase that runs until decided ended, in words (``until decided: stopped at look 3,
    decided``); None for a phase of fixed length. Pure."""
    if p.get("planned_max_s") is None:
        return None
    looks, stopped = int(p.get("looks") or 0), p.get("stopped_by")
    if stopped in _STOPPED:
        return "until decided: " + _STOPPED[stopped].format(n=looks)
    if looks:
        return f"until decided: cut short after look {looks}"
    ran, planned = p.get("in_force_duration_s"), p.get("planned_duration_s")
    if ran is not None and planned is not None and ran >= planned - 0.05:  # no verdict could decide inside it
        return "until decided: no verdict judged on it can decide inside it, ran its min"
    return "until decided: cut short before its first look"


def _planned(p: Mapping[str, Any]) -> str:
    """Its planned length: ``20.00s``, or ``20.00s–100.00s (until decided: ...)``."""
    top, until = p.get("planned_max_s"), until_text(p)
    text = _s(p.get("planned_duration_s")) + ("" if top is None else f"–{_s(top)}")
    return text + ("" if until is None else f" ({esc(until)})")


def render_phases(phases: Sequence[Mapping[str, Any]]) -> str:
    if not phases:
        return '<p class="muted">No phases ran.</p>'
    rows = []
    for p in phases:
        start, in_force = p.get("start_s"), p.get("in_force_at_s")
        injects = None if start is None or in_force is None else in_force - start
        rows.append(f'<tr data-phase="{esc(p["name"])}"><td>{esc(p["name"])}</td>'
                    f'<td>{_planned(p)}</td><td>{_s(p.get("actual_duration_s"))}</td>'
                    f'<td>{_s(p.get("in_force_duration_s"))}</td><td>{_s(injects)}</td>'
                    f'<td>{_s(p.get("reverts_took_s"))}</td><td>{_s(start)}</td><td>{_s(p.get("end_s"))}</td></tr>')
    return ("<table><thead><tr><th>phase</th><th>planned</th><th>actual (began → ended, reverts included)</th>"
            "<th>faults in force → revert began</th><th>injects took</th><th>reverts took</th><th>began at</th>"
            "<th>ended at</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
