"""The report's per-turn table: for each phase and conversation turn, how many streams, their time to first
token (p50, p99) and the share that completed. What a fault did to turn 2 of live conversations sits
beside turn 1 here (``report.json``'s ``turns``; the HTML report's "Per turn" table). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from chaos.model.observations import Observations, StreamRecord

__all__ = ["MAX_TURN_ROWS", "render_turn_table", "turn_table"]

MAX_TURN_ROWS = 8  # turns 1..8 each a row; later turns share one row ("9+")


def _label(turn: int) -> int | str:
    return turn if turn <= MAX_TURN_ROWS else f"{MAX_TURN_ROWS + 1}+"


def _row(phase: str, turn: int | str, streams: list[StreamRecord], obs: Observations) -> dict[str, Any]:
    ttft = [st.ttft_ns / 1e9 for st in streams if st.ttft_ns is not None]
    p50, p99 = (np.quantile(ttft, [0.5, 0.99]).tolist() if ttft else (None, None))
    return {"phase": phase, "turn": turn, "streams": len(streams), "with_first_token": len(ttft),
            "ttft_p50_s": None if p50 is None else round(p50, 6), "ttft_p99_s": None if p99 is None else round(p99, 6),
            "completed_share": round(sum(1 for st in streams if obs.complete(st)) / len(streams), 4)}


def turn_table(obs: Observations) -> list[dict[str, Any]] | None:
    """One row per (phase, turn) over the judged streams (``Observations.population``), phases in run order;
    None when no stream is a conversation's turn (single-turn load)."""
    if not any(st.turn is not None for st in obs.streams if not st.background):
        return None
    rows: list[dict[str, Any]] = []
    for window in sorted(obs.phases, key=lambda w: w.t_start or 0):
        groups: dict[int | str, list[StreamRecord]] = {}
        for st in obs.population(window.name):
            if st.turn is not None:
                groups.setdefault(_label(st.turn), []).append(st)
        for turn in sorted(groups, key=lambda t: t if isinstance(t, int) else MAX_TURN_ROWS + 1):
            rows.append(_row(window.name, turn, groups[turn], obs))
    return rows


def render_turn_table(rows: Sequence[Mapping[str, Any]] | None) -> str:
    """The table as HTML ('' without rows)."""
    if not rows:
        return ""
    from chaos.output.render import format_value
    from chaos.output.reports.html import esc

    def secs(value: Any) -> str:
        return "-" if value is None else esc(format_value(value, "s"))

    body = "".join(
        f'<tr data-phase="{esc(str(r["phase"]))}"><td>{esc(str(r["phase"]))}</td><td>{esc(str(r["turn"]))}</td>'
        f'<td>{r["streams"]}</td><td>{secs(r["ttft_p50_s"])}</td><td>{secs(r["ttft_p99_s"])}</td>'
        f'<td>{float(r["completed_share"]) * 100:.1f}%</td></tr>'
        for r in rows)
    return ("<table><thead><tr><th>phase</th><th>turn</th><th>streams</th><th>TTFT p50</th><th>TTFT p99</th>"
            "<th>completed</th></tr></thead><tbody>" + body + "</tbody></table>")
