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
import os
import secrets
import time
from pathlib import Path
from typing import Any

from chaos.execution.events import RunEvent, is_record
from chaos.host.journal_file import JOURNAL_NAME, JournalFile  # re-exported: the journal's own names
from chaos.host.runfiles import prepare_private_dir
from chaos.model.observations import FaultEvent, Observations, Record, to_json

__all__ = ["JOURNAL_NAME", "Journal", "JournalFile", "prepare_run_dir"]

def prepare_run_dir(out_dir: Path) -> None:
    """Create the run directory, or refuse one that already holds anything (0700, ours).

    A reused directory would mix two runs in one journal, and a previous run's ``end`` record would
    tell the new run's watchdog to stand down; one another user owns or can write to would let them
    plant links for the runner to write through.
    """
    prepare_private_dir(out_dir, "--out")  # and ours, not writable by group or others (chaos.host.runfiles)


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
