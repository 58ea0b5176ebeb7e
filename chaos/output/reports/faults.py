"""Each fault as the journal recorded it: its plan (what would change and how to undo it, written
before the inject), the evidence that it took effect, the undo kept after it, and what its revert
undid, with any errors. Pure: the report dict in, HTML out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chaos.output.render import format_value
from chaos.output.reports.html import esc, kv_table

__all__ = ["render_faults"]

_STEPS = (("plan", "plan (journaled before the inject)"), ("evidence", "evidence after the inject"),
          ("undo", "undo kept"), ("revert_evidence", "what the revert undid"))


def _when(fault: Mapping[str, Any]) -> str:
    start, end = fault.get("injected_at"), fault.get("reverted_at")
    if start is None:
        return "never injected"
    text = f"injected at {format_value(start, 's')}"
    if end is None:
        return text + ", <b class=\"fail\">never reverted</b>"
    actual, planned = fault.get("actual_in_force_s"), fault.get("planned_in_force_s")
    if actual is None:
        actual = end - start
    text += f", reverted at {format_value(end, 's')} (in force {format_value(actual, 's')}"
    return text + (f" of {format_value(planned, 's')} planned)" if planned else ")")


def _touched(fault: Mapping[str, Any]) -> str:
    """How many streams it touched, and how many of them its phase judges though sent in another."""
    touched = fault.get("touched_streams")
    if touched is None:
        return ""
    moved = fault.get("moved_from_other_phases") or 0
    return (f"; touched {touched} stream{'s' if touched != 1 else ''}"
            + (f" ({moved} sent in another phase, judged in {esc(fault.get('phase') or '-')})" if moved else ""))


def render_faults(faults: Sequence[Mapping[str, Any]]) -> str:
    if not faults:
        return '<p class="muted">No faults in this experiment.</p>'
    blocks = []
    for fault in faults:
        errors = "".join(f'<li class="fail">{esc(e)}</li>' for e in fault.get("errors") or [])
        blocks.append(
            f'<div class="fault" data-fault="{esc(fault["name"])}"><h3>{esc(fault["name"])} '
            f'<span class="muted">{esc(fault["kind"])} · phase {esc(fault.get("phase") or "-")}</span></h3>'
            f"<p>{_when(fault)}{_touched(fault)}</p>"
            + (f"<ul>{errors}</ul>" if errors else "")
            + '<div class="fault-steps">'
            + "".join(f"<div><h4>{title}</h4>{kv_table(fault.get(key) or {})}</div>" for key, title in _STEPS)
            + "</div></div>"
        )
    return "".join(blocks)
