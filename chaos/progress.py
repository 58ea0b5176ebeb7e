"""Console progress: plain lines on stderr as a run moves on (a run listener).

Each line carries the seconds since the run started: what the runner is doing (``Stage``), each
phase, each fault injected, reverted or failing, and the outcome. ``describe`` is the pure part.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from chaos.events import RunEvent, RunFinished, RunStarted, Stage, VerdictsReady
from chaos.observations import FaultEvent

__all__ = ["ConsoleProgress", "describe"]


def describe(event: RunEvent) -> str | None:
    """The progress line for an event, or None when it is not worth a line. Pure."""
    if isinstance(event, RunStarted):
        return f"run {event.experiment} → {event.out_dir}"
    if isinstance(event, Stage):
        return event.detail or event.what
    if isinstance(event, FaultEvent):
        if event.action == "inject":
            return f"  injected {event.fault} ({event.kind})"
        if event.action == "revert":
            return f"  reverted {event.fault}"
        if event.action == "error":
            return f"  !! {event.fault} ({event.kind}): {event.message}"
        return None
    if isinstance(event, VerdictsReady):
        failing = [v for v in event.verdicts if not v.ok]
        return f"verdicts: {len(event.verdicts)} judged, {len(failing)} not as expected"
    if isinstance(event, RunFinished):
        return f"run {event.result.status}, exit {event.result.exit_code}"
    return None


class ConsoleProgress:
    """Prints ``describe``'s lines, stamped with the seconds since the run started."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.started = time.monotonic()

    def on_event(self, event: RunEvent) -> None:
        line = describe(event)
        if line is None:
            return
        if isinstance(event, RunStarted):
            self.started = time.monotonic()
        try:
            print(f"[{time.monotonic() - self.started:6.1f}s] {line}", file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed terminal must not stop the run
            pass
