"""Console progress: plain lines on stderr as a run moves on (a run listener).

Each line carries the seconds since the run started: what the runner is doing (``Stage``), each
phase, each fault injected, reverted or failing, and the outcome. ``describe`` is the pure part.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from chaos.execution.events import RunEvent, RunFinished, RunStarted, Stage, VerdictsReady
from chaos.model.observations import FaultEvent, Note

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
    if isinstance(event, Note):
        return _note_line(event)
    if isinstance(event, VerdictsReady):
        failing = [v for v in event.verdicts if not v.ok]
        return f"verdicts: {len(event.verdicts)} judged, {len(failing)} not as expected"
    if isinstance(event, RunFinished):
        return f"run {event.result.status}, exit {event.result.exit_code}"
    return None


def _note_line(note: Note) -> str | None:
    """The notes a person watching the run must see: which engine profile and why, what the preflight
    dropped, a failing metrics scrape, a halt's cause, an unguarded Toxiproxy."""
    data = note.data
    if note.topic == "engine_profile":
        prof = data.get("profile") or {}
        end = "finish_reason and [DONE]" if prof.get("done_required", True) else "finish_reason, [DONE] not required"
        return (f"engine: {prof.get('title', '?')} (profile {prof.get('name', '?')}; {data.get('detected_by', '?')}); "
                f"complete = {end}")
    if note.topic == "preflight":
        dropped = data.get("dropped") or {}
        lines = [f"preflight: HTTP {data.get('status')}, {data.get('events', 0)} events, finish_reason "
                 f"{data.get('finish_reason')}, [DONE] {'seen' if data.get('done_seen') else 'not seen'}"]
        lines += [f"  dropped {name} from every request: {why}" for name, why in dropped.items()]
        lines += [f"  !! ignored by the server: {i.get('field')} ({i.get('evidence')}); changes: "
                  + ", ".join(dict.fromkeys(str(a).partition(":")[0] for a in i.get("affects") or ()))
                  for i in data.get("ignored_fields") or ()]
        if data.get("cut"):
            lines.append(f"  {data['cut']}")
        if data.get("warning"):
            lines.append(f"  !! {data['warning']}")
        return "\n".join(lines)
    if note.topic == "scrape_error":
        every = (f"; no metrics there, asked every {data['next_every_s']:g}s from now"
                 if data.get("next_every_s") else "")
        return (f"  !! metrics: scraping {data.get('url')} failed: {data.get('error')} "
                f"({data.get('failures')} so far{every})")
    if note.topic == "halt":
        return f"  !! halt: {data.get('reason')}"
    if note.topic == "proxy":
        return _proxy_lines(data)
    return None


def _proxy_lines(data: dict[str, Any]) -> str | None:
    """A Toxiproxy's notes (a binary or container the run was told to use: its API is unguarded)."""
    notes = [str(n) for n in data.get("notes") or () if n]
    return "\n".join(f"  !! Toxiproxy ({data.get('server')} at {data.get('api_url')}): {n}" for n in notes) or None


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
