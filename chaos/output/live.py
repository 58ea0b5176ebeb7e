"""Live progress on the console: per phase elapsed/remaining, streams/s, content events/s, TTFT
p50/p99 so far, errors, early closes, active faults (a run listener).

On an interactive terminal a ``rich`` live panel redraws at most ``refresh_s`` apart; elsewhere (CI,
a pipe) plain lines: the run's stage lines as ``chaos.output.progress`` writes them, and a figures line
every ``line_every_s`` and at each phase's end. Per event the work is a few additions to counters
and a rolling window; quantiles are computed only when something is drawn.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from chaos.execution.events import RunEvent, RunFinished, RunStarted, Stage
from chaos.model.observations import (
    END_RULE_TOPIC,
    NS,
    STRICT_END,
    EndRule,
    FaultEvent,
    Note,
    PhaseWindow,
    StreamRecord,
)
from chaos.output.progress import describe

__all__ = ["LOAD_STOPS", "LiveProgress", "Snapshot", "Tally", "format_line", "remaining_text"]

WINDOW_S = 5.0  # rates are over the last few seconds
# stages after which the load is over: the figures freeze there (streams a stop cut are not errors of the load)
LOAD_STOPS = ("drain", "signal", "halt", "teardown")


@dataclass(frozen=True)
class Snapshot:
    """What the display shows at one moment."""

    phase: str
    elapsed_s: float  # in the phase
    remaining_s: float | None  # None: no planned duration; a phase that runs until decided: to its min
    phase_index: int
    phases: int
    streams_per_s: float
    events_per_s: float
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    streams: int  # finished in this phase
    errors: int
    early_closes: int
    faults: tuple[str, ...]
    up_to_s: float | None = None  # a phase that runs until decided: the most it has left (to its max)


@dataclass
class Tally:
    """The running figures, fed by events; ``snapshot(now_ns)`` reads them. Pure (no clock of its own)."""

    durations: dict[str, float] = field(default_factory=dict)
    longest: dict[str, float] = field(default_factory=dict)  # phases that run until decided: their max
    order: list[str] = field(default_factory=list)
    phase: str = ""
    phase_start: int | None = None
    first_start: int | None = None
    ttft_s: list[float] = field(default_factory=list)  # this phase's
    streams: int = 0
    errors: int = 0
    early: int = 0
    faults: dict[str, str] = field(default_factory=dict)  # name → kind, in force
    recent: deque[tuple[int, int]] = field(default_factory=deque)  # (stream end ns, content events)
    end_rule: EndRule = STRICT_END  # the engine's end-of-stream rule, from the run's engine_profile note
    stopped_at: int | None = None  # when the load stopped (drain, a signal, a halt): nothing is counted after it

    def stop(self, t_ns: int) -> None:
        """The load is over: keep the figures as they were at ``t_ns`` (the first stop wins)."""
        if self.stopped_at is None:
            self.stopped_at = t_ns

    def start(self, phases: tuple[tuple[str, float], ...], ranged: tuple[tuple[str, float], ...] = ()) -> None:
        self.durations = dict(phases)
        self.longest = dict(ranged)
        self.order = [name for name, _ in phases]

    def add(self, event: Any) -> None:
        if isinstance(event, StreamRecord):
            self._add_stream(event)
        elif isinstance(event, PhaseWindow) and event.t_end is None:
            self._phase_began(event)
        elif isinstance(event, Note) and event.topic == END_RULE_TOPIC and isinstance(event.data.get("end"), dict):
            self.end_rule = EndRule.from_dict(event.data["end"])
        elif isinstance(event, FaultEvent):
            self._add_fault(event)

    def _add_stream(self, event: StreamRecord) -> None:
        if event.background or self.stopped_at is not None:
            return
        self.streams += 1
        if event.ttft_ns is not None:
            self.ttft_s.append(event.ttft_ns / NS)
        if event.error is not None or event.in_band_error is not None or (event.status or 0) >= 400:
            self.errors += 1
        if event.hangup is None and not event.is_complete(self.end_rule):
            self.early += 1
        end = event.t_end or (event.hangup.t if event.hangup else None) or event.t_sent
        if end is not None:
            self.recent.append((end, len(event.t_content)))

    def _phase_began(self, event: PhaseWindow) -> None:
        """A new phase: its figures start from nothing."""
        self.phase, self.phase_start = event.name, event.t_start
        self.first_start = event.t_start if self.first_start is None else self.first_start
        self.ttft_s, self.streams, self.errors, self.early = [], 0, 0, 0

    def _add_fault(self, event: FaultEvent) -> None:
        if event.action == "inject":
            self.faults[event.fault] = event.kind
        elif event.action in ("revert", "rollback", "error"):
            self.faults.pop(event.fault, None)

    def snapshot(self, now_ns: int) -> Snapshot:
        if self.stopped_at is not None:
            now_ns = min(now_ns, self.stopped_at)
        while self.recent and self.recent[0][0] < now_ns - WINDOW_S * NS:
            self.recent.popleft()
        # over the last WINDOW_S seconds, or since the first phase began when that is more recent
        span = WINDOW_S if self.first_start is None else min(WINDOW_S, max(1e-3, (now_ns - self.first_start) / NS))
        elapsed = max(0.0, (now_ns - self.phase_start) / NS) if self.phase_start is not None else 0.0
        planned, top = self.durations.get(self.phase), self.longest.get(self.phase)
        p50 = p99 = None
        if self.ttft_s:
            p50, p99 = (float(x) for x in np.quantile(np.asarray(self.ttft_s), (0.5, 0.99)))
        return Snapshot(
            phase=self.phase or "-", elapsed_s=elapsed,
            remaining_s=None if planned is None else max(0.0, planned - elapsed),
            phase_index=self.order.index(self.phase) + 1 if self.phase in self.order else 0, phases=len(self.order),
            streams_per_s=len(self.recent) / span, events_per_s=sum(n for _, n in self.recent) / span,
            ttft_p50_s=p50, ttft_p99_s=p99, streams=self.streams, errors=self.errors, early_closes=self.early,
            faults=tuple(sorted(self.faults)), up_to_s=None if top is None else max(0.0, top - elapsed),
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}ms"


def remaining_text(s: Snapshot, *, short: bool = False) -> str | None:
    """What is left of the phase: ``12.0s``; for one that runs until decided, ``12.0s to its min, up to
    92.0s`` before its min and ``until decided, up to 68.4s`` past it, not "0.0s left" (``short``, for
    the panel's column: ``12.0s–92.0s``, ``up to 68.4s``). Pure."""
    if s.up_to_s is not None:
        if s.remaining_s is not None and s.remaining_s >= 0.05:  # what would read "0.0s" is past it
            between = "–" if short else " to its min, up to "
            return f"{s.remaining_s:.1f}s{between}{s.up_to_s:.1f}s"
        return f"{'' if short else 'until decided, '}up to {s.up_to_s:.1f}s"
    return None if s.remaining_s is None else f"{s.remaining_s:.1f}s"


def format_line(s: Snapshot) -> str:
    """One plain line of figures. Pure."""
    left = remaining_text(s)
    remaining = "" if left is None else f", {left} left"
    return (f"phase {s.phase} ({s.phase_index}/{s.phases}) {s.elapsed_s:.1f}s{remaining}: "
            f"{s.streams_per_s:.1f} streams/s, {s.events_per_s:.0f} events/s, TTFT p50 {_ms(s.ttft_p50_s)} "
            f"p99 {_ms(s.ttft_p99_s)}, {s.streams} streams, {s.errors} errors, {s.early_closes} early closes, "
            f"faults: {', '.join(s.faults) or 'none'}")


def _table(s: Snapshot) -> Any:
    """The panel: the phase's figures over the counts and the faults in force. Two tables of at most six
    columns, so an 80-column terminal shows every header and every unit whole (ten columns in one
    table needed 104 and rich cut them all)."""
    from rich.console import Group
    from rich.table import Table

    figures = Table(title=f"phase {s.phase} ({s.phase_index}/{s.phases})", title_justify="left")
    for column in ("elapsed", "remaining", "streams/s", "events/s", "TTFT p50", "TTFT p99"):
        figures.add_column(column, justify="right", no_wrap=True)
    figures.add_row(f"{s.elapsed_s:.1f}s", remaining_text(s, short=True) or "-",
                    f"{s.streams_per_s:.1f}", f"{s.events_per_s:.0f}", _ms(s.ttft_p50_s), _ms(s.ttft_p99_s))
    counts = Table()
    for column in ("streams", "errors", "early closes"):
        counts.add_column(column, justify="right", no_wrap=True)
    counts.add_column("faults in force", overflow="fold")  # fault names are the experiment's: they may wrap
    counts.add_row(str(s.streams), f"[red]{s.errors}[/red]" if s.errors else "0",
                   f"[yellow]{s.early_closes}[/yellow]" if s.early_closes else "0", ", ".join(s.faults) or "none")
    return Group(figures, counts)


class LiveProgress:
    """The console listener: a live panel on a terminal, plain lines elsewhere.

    ``interactive`` defaults to whether ``stream`` is a TTY; ``console`` (a ``rich.console.Console``)
    may be given for tests. Never raises into the run: a closed terminal only stops the display.
    """

    def __init__(self, stream: TextIO | None = None, *, interactive: bool | None = None, refresh_s: float = 0.25,
                 line_every_s: float = 5.0, console: Any = None) -> None:
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty() if interactive is None else interactive
        self.refresh_s, self.line_every_s = refresh_s, line_every_s
        self.tally = Tally()
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_line = time.monotonic()
        self._live: Any = None
        self._console = console
        self.broken = False

    def _stamp(self) -> str:
        return f"[{time.monotonic() - self.started:6.1f}s]"

    def _print(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(f"{self._stamp()} {text}", markup=False, highlight=False)
        else:
            print(f"{self._stamp()} {text}", file=self.stream, flush=True)

    def on_event(self, event: RunEvent) -> None:
        if self.broken:
            return
        try:
            self._on_event(event)
        except (OSError, ValueError):  # a closed terminal must not stop the run
            self.broken = True

    def _on_event(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            self.started = time.monotonic()
            self.tally.start(event.phases, event.ranged)
            if self.interactive:
                self._start_live()
        closing_phase = isinstance(event, PhaseWindow) and event.t_end is not None and event.name == self.tally.phase
        if closing_phase:
            self._print(format_line(self.tally.snapshot(time.monotonic_ns())))  # the phase's final figures
            self._last_line = time.monotonic()  # not printed twice when the periodic line falls due now
        if isinstance(event, Stage) and event.what in LOAD_STOPS and self.tally.phase:
            self.tally.stop(event.t or time.monotonic_ns())
            if self._live is not None:  # the panel left on screen shows the load's figures, not a decaying rate
                self._live.update(_table(self.tally.snapshot(time.monotonic_ns())), refresh=True)
        self.tally.add(event)
        line = describe(event)
        if line is not None:
            self._print(line)
        if isinstance(event, RunFinished):
            self.close()
            return
        now = time.monotonic()
        if self._live is not None and now - self._last_draw >= self.refresh_s:
            self._last_draw = now
            self._live.update(_table(self.tally.snapshot(time.monotonic_ns())), refresh=True)
        elif self._live is None and self.tally.phase and now - self._last_line >= self.line_every_s:
            self._last_line = now
            self._print(format_line(self.tally.snapshot(time.monotonic_ns())))

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live

        console = self._console or Console(file=self.stream)
        # auto_refresh off: rich's refresh thread would read the tally while the run's loop writes it
        self._live = Live(console=console, auto_refresh=False, transient=False)
        self._live.start()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
