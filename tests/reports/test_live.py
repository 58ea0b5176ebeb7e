"""Live progress: the running figures from run events, plain lines off a terminal, a rich panel on one."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from chaos.execution.events import RunStarted, Stage
from chaos.model.observations import ErrorInfo, FaultEvent, PhaseWindow, StreamRecord
from chaos.output.live import WINDOW_S, LiveProgress, Tally, format_line

NS = 1_000_000_000
MS = 1_000_000


def stream(i: int, end_s: float, ttft_ms: int, *, events: int = 4, error: bool = False) -> StreamRecord:
    t_end = int(end_s * NS)
    sent = t_end - 200 * MS
    content = [sent + ttft_ms * MS + k * MS for k in range(events)]
    st = StreamRecord(id=str(i), phase="steady", t_sent=sent, t_first_content=content[0], t_content=content,
                      t_end=t_end, status=200, finish_reason="stop", done_seen=True)
    if error:
        st.error = ErrorInfo("read", "reset")
    return st


def test_tally_figures_per_phase_with_rates_over_the_last_seconds() -> None:
    tally = Tally()
    tally.start((("baseline", 10.0), ("steady", 20.0)))
    tally.add(PhaseWindow("baseline", 0))
    tally.add(stream(0, 1.0, 500))  # baseline: forgotten when the next phase starts
    tally.add(PhaseWindow("baseline", 0, 10 * NS))
    tally.add(PhaseWindow("steady", 10 * NS))
    tally.add(FaultEvent("slow", "network.latency", "inject", 10 * NS, "steady"))
    for i in range(100):
        tally.add(stream(i, 10.0 + i * 0.1, 10 + i, error=i % 25 == 0))  # 10 streams/s for 10 s, 4 events each
    snap = tally.snapshot(20 * NS)
    assert snap.phase == "steady" and snap.phase_index == 2 and snap.phases == 2
    assert snap.elapsed_s == pytest.approx(10.0) and snap.remaining_s == pytest.approx(10.0)
    assert snap.streams_per_s == pytest.approx(10.0, rel=0.05)  # the last WINDOW_S seconds only
    assert snap.events_per_s == pytest.approx(40.0, rel=0.05)
    assert snap.ttft_p50_s == pytest.approx(0.0595, abs=0.001) and snap.ttft_p99_s == pytest.approx(0.108, abs=0.001)
    assert snap.streams == 100 and snap.errors == 4 and snap.early_closes == 4 and snap.faults == ("slow",)
    assert WINDOW_S == 5.0
    tally.add(FaultEvent("slow", "network.latency", "revert", 21 * NS, "steady"))
    assert tally.snapshot(21 * NS).faults == ()
    line = format_line(snap)
    assert line.startswith("phase steady (2/2) 10.0s, 10.0s left: 10.0 streams/s, 40 events/s, TTFT p50 59.5ms p99 108")
    assert "4 errors, 4 early closes, faults: slow" in line


def events() -> list[object]:
    return [RunStarted("probe", "/tmp/run", 0, 0.0, (("steady", 4.0),)), Stage("target", "starting target (builtin)"),
            PhaseWindow("steady", 0), *[stream(i, 0.1 * i + 0.3, 30) for i in range(1, 20)],
            PhaseWindow("steady", 0, 4 * NS)]


def test_off_a_terminal_it_writes_plain_lines() -> None:
    out = io.StringIO()
    progress = LiveProgress(out, line_every_s=0.0)
    assert progress.interactive is False  # a StringIO is no TTY
    for event in events():
        progress.on_event(event)  # type: ignore[arg-type]
    text = out.getvalue()
    assert "starting target (builtin)" in text
    assert "phase steady (1/1)" in text and "TTFT p50 30.0ms" in text
    assert "\x1b[" not in text  # no terminal control codes in CI logs


def test_on_a_terminal_it_draws_a_live_panel() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160)
    progress = LiveProgress(buffer, interactive=True, refresh_s=0.0, console=console)
    for event in events():
        progress.on_event(event)  # type: ignore[arg-type]
    progress.close()
    text = buffer.getvalue()
    assert "TTFT p50" in text and "streams/s" in text and "30.0ms" in text and "\x1b[" in text


def test_at_80_columns_every_header_and_unit_of_the_panel_is_whole() -> None:
    """A newcomer's terminal is 80 columns: no header cut to an ellipsis or wrapped, no TTFT without its unit."""
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=80, color_system=None)
    progress = LiveProgress(buffer, interactive=True, refresh_s=0.0, console=console)
    for event in events():
        progress.on_event(event)  # type: ignore[arg-type]
    progress.tally.ttft_s.append(12.3456)  # a TTFT past 10 s, the widest figure the panel shows
    progress.on_event(Stage("drain", "draining in-flight streams", 100 * NS))  # draws the panel once more
    progress.close()
    text = buffer.getvalue()
    panel = [line for line in text.splitlines() if line.startswith(("┃", "│"))]
    assert panel and all(len(line) <= 80 for line in panel), text
    headers = " ".join(line for line in panel if line.startswith("┃"))
    for header in ("elapsed", "remaining", "streams/s", "events/s", "TTFT p50", "TTFT p99", "streams", "errors",
                   "early closes", "faults"):
        assert f" {header} " in headers, f"{header!r} is not whole at 80 columns:\n{text}"
    assert "…" not in text, text
    assert "30.0ms" in text and re.search(r" \d{5}\.\dms ", text), text  # p50, and a p99 near 10 s with its unit


def test_a_closed_terminal_does_not_stop_the_run() -> None:
    out = io.StringIO()
    progress = LiveProgress(out)
    out.close()
    for event in events():
        progress.on_event(event)  # type: ignore[arg-type]
    assert progress.broken
