"""The run journal: an append-only JSON-lines file, flushed each loop turn, fsync'd where it matters.

Every observation and every fault step is appended as it happens, so a run killed at any moment
leaves a journal from which ``streamchaos rollback`` can tell what was changed and not undone, and
``streamchaos verify`` can re-judge what was observed. The journal is a run listener: it keeps
every observation record it hears about, in memory and on disk; fault events are fsync'd.

The file is created fresh (never appended to across runs), mode 0600, and its first record carries
a random ``run_id``: the watchdog and rollback act only on the run they were started for.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from chaos.execution.events import RunEvent, is_record
from chaos.host.journal_file import JOURNAL_NAME, JournalFile  # re-exported: the journal's own names
from chaos.host.procs import start_time
from chaos.host.runfiles import prepare_private_dir
from chaos.model.observations import FaultEvent, Note, Observations, Record, to_json

__all__ = ["JOURNAL_NAME", "Journal", "JournalFile", "prepare_run_dir", "servers_in"]

def prepare_run_dir(out_dir: Path) -> None:
    """Create the run directory, or refuse one that already holds anything (0700, ours).

    A reused directory would mix two runs in one journal, and a previous run's ``end`` record would
    tell the new run's watchdog to stand down; one another user owns or can write to would let them
    plant links for the runner to write through.
    """
    prepare_private_dir(out_dir, "--out")  # and ours, not writable by group or others (chaos.host.runfiles)


def servers_in(note: Note) -> list[tuple[str, int, list[str]]]:
    """The server processes a ``target`` or ``path`` note says the run started: (role, pid, the URLs
    they answer on). Pure; a note without a pid (a remote target, a container) names none."""
    data = note.data
    if note.topic == "target" and isinstance(data.get("pid"), int):
        urls = [data.get(key) for key in ("base_url", "metrics_url", "admin_url")]
        return [("target", int(data["pid"]), [u for u in urls if isinstance(u, str) and u])]
    if note.topic != "path":
        return []
    out = []
    for hop in data.get("hops") or []:
        if not (isinstance(hop, dict) and isinstance(hop.get("pid"), int)):
            continue
        urls = [hop.get("base_url"), f"http://{hop['listen']}" if hop.get("listen") else None,
                _api_url(hop.get("config"))]
        out.append((f"hop {hop.get('name')} ({hop.get('kind')})", int(hop["pid"]),
                    [u for u in urls if isinstance(u, str) and u]))
    return out


def _api_url(config: object) -> str | None:
    """A Toxiproxy hop's API URL, from the facts its ``config`` holds as JSON (None for other hops)."""
    try:
        facts = json.loads(config) if isinstance(config, str) else None
    except ValueError:
        return None
    url = facts.get("api_url") if isinstance(facts, dict) else None
    return url if isinstance(url, str) else None


class Journal:
    """One run's journal: a run listener that keeps every record in memory and on disk."""

    def __init__(self, path: Path, experiment: str, t0: int, wall_t0: float) -> None:
        self.path = path
        self.run_id = secrets.token_hex(8)
        self._file = JournalFile(path, create=True)
        self._flush_set = False  # a flush of held records is set for the end of this loop turn
        self._flush_failed: OSError | None = None
        self.observations = Observations(experiment=experiment, t0=t0, wall_t0=wall_t0)
        self._file.write({"type": "run", "experiment": experiment, "t0": t0, "wall_t0": wall_t0, "pid": os.getpid(),
                          "run_id": self.run_id}, durable=True)

    def on_event(self, event: RunEvent) -> None:
        if is_record(event):
            self.append(event)
            if isinstance(event, Note):
                self._servers(event)

    def _servers(self, note: Note) -> None:
        """Journal (fsync'd) each server process a note says the run started, with its start time: a
        rollback after a crash tells a server that died with the runner ("gone") from one still
        serving, and a reused pid from ours, without contacting or signalling anything."""
        for role, pid, urls in servers_in(note):
            self._file.write({"type": "server", "role": role, "pid": pid, "start_time": start_time(pid),
                              "urls": urls, "t": note.t, "run_id": self.run_id}, durable=True)

    def append(self, record: Record, *, durable: bool | None = None) -> None:
        """Keep ``record``; fault events are fsync'd (rollback depends on them) unless told otherwise.

        On a running loop a record that need not be durable reaches the file at the end of the loop
        turn that made it, with every other record of that turn in one write: the load's records
        arrive by the frame (64 at a time), and a write and flush apiece was a third of what the
        runner spent on each (cProfile, 64 streams turning over). A durable record writes what is
        held before it, so the order on disk is the order of events."""
        if self._flush_failed is not None:
            raise self._flush_failed  # a held write failed at its turn's end: the run stops here
        self.observations.add(record)
        durable = isinstance(record, FaultEvent) if durable is None else durable
        self._file.write(to_json(record), durable=durable, hold=not durable and self._flush_at_turn_end())

    def _flush_at_turn_end(self) -> bool:
        """Whether a flush is (now) set for the end of this loop turn; False off a loop (replay, tests)."""
        if self._flush_set:
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        self._flush_set = True
        loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        self._flush_set = False
        try:
            self._file.flush()
        except OSError as exc:  # no listener to raise it from at a turn's end: the next record raises it
            self._flush_failed = exc

    def resource(self, body: dict[str, Any]) -> None:
        """Journal (fsync'd) something the run created outside its processes, e.g. a container:
        ``{"name", "kind", "action": "plan" | "release", "undo", "evidence"}``. Not an observation:
        only ``streamchaos rollback`` reads these, to remove what a killed run left."""
        self._file.write({"type": "resource", "t": time.monotonic_ns(), "run_id": self.run_id, **body}, durable=True)

    def close(self, status: str) -> None:
        """Mark the run finished (the watchdog stands down when it sees this) and close the file."""
        self._file.write({"type": "end", "status": status, "wall": time.time(), "run_id": self.run_id}, durable=True)
        self._file.close()
