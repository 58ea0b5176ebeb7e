"""The run journal: an append-only JSON-lines file, flushed per record, fsync'd where it matters.

Every observation and every fault step is appended as it happens, so a run killed at any moment
leaves a journal from which ``streamchaos rollback`` can tell what was changed and not undone, and
``streamchaos verify`` can re-judge what was observed. The journal is a run listener: it keeps
every observation record it hears about, in memory and on disk; fault events are fsync'd.

The file is created fresh (never appended to across runs), mode 0600, and its first record carries
a random ``run_id``: the watchdog and rollback act only on the run they were started for.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from chaos.errors import UsageError
from chaos.events import RunEvent, is_record
from chaos.observations import FaultEvent, Observations, Record, to_json

__all__ = ["JOURNAL_NAME", "Journal", "JournalFile", "prepare_run_dir"]

JOURNAL_NAME = "journal.jsonl"


def prepare_run_dir(out_dir: Path) -> None:
    """Create the run directory, or refuse one that already holds anything (0700, ours).

    A reused directory would mix two runs in one journal, and a previous run's ``end`` record would
    tell the new run's watchdog to stand down.
    """
    if out_dir.exists():
        if not out_dir.is_dir():
            raise UsageError(f"--out {out_dir}: exists and is not a directory")
        if any(out_dir.iterdir()):
            raise UsageError(f"--out {out_dir}: the directory is not empty (a previous run?); give a new or empty directory")
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)


class JournalFile:
    """Appends JSON lines to a journal file, thread-safe; ``durable`` lines are fsync'd."""

    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
        self._file = os.fdopen(os.open(path, flags, 0o600), "a", encoding="utf-8")

    def write(self, body: dict[str, Any] | str, *, durable: bool = False) -> None:
        line = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"), default=str)
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line + "\n")
            self._file.flush()
            if durable:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()


class Journal:
    """One run's journal: a run listener that keeps every record in memory and on disk."""

    def __init__(self, path: Path, experiment: str, t0: int, wall_t0: float) -> None:
        self.path = path
        self.run_id = secrets.token_hex(8)
        self._file = JournalFile(path, create=True)
        self.observations = Observations(experiment=experiment, t0=t0, wall_t0=wall_t0)
        self._file.write({"type": "run", "experiment": experiment, "t0": t0, "wall_t0": wall_t0, "pid": os.getpid(),
                          "run_id": self.run_id}, durable=True)

    def on_event(self, event: RunEvent) -> None:
        if is_record(event):
            self.append(event)  # type: ignore[arg-type]

    def append(self, record: Record, *, durable: bool | None = None) -> None:
        """Keep ``record``; fault events are fsync'd (rollback depends on them) unless told otherwise."""
        self.observations.add(record)
        self._file.write(to_json(record), durable=isinstance(record, FaultEvent) if durable is None else durable)

    def resource(self, body: dict[str, Any]) -> None:
        """Journal (fsync'd) something the run created outside its processes, e.g. a container:
        ``{"name", "kind", "action": "plan" | "release", "undo", "evidence"}``. Not an observation:
        only ``streamchaos rollback`` reads these, to remove what a killed run left."""
        self._file.write({"type": "resource", "t": time.monotonic_ns(), "run_id": self.run_id, **body}, durable=True)

    def close(self, status: str) -> None:
        """Mark the run finished (the watchdog stands down when it sees this) and close the file."""
        self._file.write({"type": "end", "status": status, "wall": time.time(), "run_id": self.run_id}, durable=True)
        self._file.close()
