"""A phase that runs until decided (``duration: {min, max}``) in the report, on the console and live:
its range and how its looks ended it, not "31.6s of 20s planned" nor "0.0s left" past its min. Pure:
synthetic observations and snapshots."""

from __future__ import annotations

import io
import re
import time

from rich.console import Console

from chaos.execution.events import RunStarted
from chaos.model.observations import Observations, PhaseWindow
from chaos.output.live import LiveProgress, Snapshot, Tally, format_line, remaining_text
from chaos.output.report import phase_report, timing_lines
from chaos.output.reports.phases import render_phases, until_text

S = 1_000_000_000


def _observations() -> Observations:
    obs = Observations(t0=0)
    obs.add(PhaseWindow("baseline", 0, 10 * S, 0))
    obs.add(PhaseWindow("steady", 10 * S, 41_600_000_000, 10 * S, looks=3, stopped_by="decided",
                        t_decided=41 * S))
    return obs


def test_the_report_row_carries_the_max_the_looks_and_what_stopped_it() -> None:
    rows = {r["name"]: r for r in phase_report(_observations(), {"baseline": 10.0, "steady": 20.0},
                                               {"steady": 100.0})}
    assert rows["steady"]["planned_max_s"] == 100.0 and rows["steady"]["looks"] == 3
    assert rows["steady"]["stopped_by"] == "decided"
    fixed = rows["baseline"]
    assert fixed["planned_max_s"] is None and fixed["looks"] == 0 and fixed["stopped_by"] is None
    lines = timing_lines({"phases": list(rows.values())})
    assert lines[1].startswith("phase steady: 31.60s of 20s–100s planned (until decided: stopped at look 3, "
                               "decided)"), lines
    assert lines[0] == "phase baseline: 10.00s of 10s planned", lines  # a fixed phase reads as before
    html = render_phases(list(rows.values()))
    assert "20.00s–100.00s (until decided: stopped at look 3, decided)" in html, html


def test_every_way_a_ranged_phase_ends_has_its_words() -> None:
    base = {"planned_duration_s": 20.0, "planned_max_s": 100.0, "in_force_duration_s": 100.0}
    assert until_text({**base, "looks": 9, "stopped_by": "max"}) == (
        "until decided: stopped at its max (look 9), undecided")
    assert until_text({**base, "looks": 2, "stopped_by": None}) == "until decided: cut short after look 2"
    assert until_text({**base, "looks": 0, "in_force_duration_s": 4.0}) == (
        "until decided: cut short before its first look")
    assert until_text({**base, "looks": 0, "in_force_duration_s": 20.0}) == (
        "until decided: no verdict judged on it can decide inside it, ran its min")
    assert until_text({"planned_duration_s": 20.0, "planned_max_s": None}) is None


def _snapshot(remaining: float | None, up_to: float | None) -> Snapshot:
    return Snapshot(phase="steady", elapsed_s=31.6, remaining_s=remaining, phase_index=2, phases=3,
                    streams_per_s=1.0, events_per_s=1.0, ttft_p50_s=None, ttft_p99_s=None, streams=1, errors=0,
                    early_closes=0, faults=(), up_to_s=up_to)


def test_live_says_until_decided_past_the_min_not_zero_left() -> None:
    tally = Tally()
    tally.start((("baseline", 10.0), ("steady", 20.0)), (("steady", 100.0),))
    tally.add(PhaseWindow("steady", 0))
    past = tally.snapshot(int(31.6 * S))
    assert past.remaining_s == 0.0 and past.up_to_s is not None
    assert ", until decided, up to 68.4s left:" in format_line(past), format_line(past)  # today: "0.0s left"
    before = tally.snapshot(5 * S)
    assert ", 15.0s to its min, up to 95.0s left:" in format_line(before), format_line(before)
    assert remaining_text(_snapshot(0.0, 68.4), short=True) == "up to 68.4s"
    assert remaining_text(_snapshot(15.0, 95.0), short=True) == "15.0s–95.0s"
    assert remaining_text(_snapshot(3.0, None)) == "3.0s"  # a fixed phase as before


def test_the_panel_takes_the_range_from_the_runs_start() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=80, color_system=None)
    progress = LiveProgress(buffer, interactive=True, refresh_s=0.0, console=console)
    progress.on_event(RunStarted("probe", "/tmp/run", 0, 0.0, (("steady", 0.001),), (("steady", 1000.0),)))
    progress.on_event(PhaseWindow("steady", time.monotonic_ns()))  # past its min at once
    progress.close()
    assert re.search(r"up to (1000|99\d)\.\ds", buffer.getvalue()) and "…" not in buffer.getvalue(), buffer.getvalue()
