"""The run journal: an append-only JSON-lines file, flushed per record, fsync'd where it matters.

Every observation and every fault step is appended as it happens, so a run killed at any moment
leaves a journal from which ``streamchaos rollback`` can tell what was changed and not undone, and
``streamchaos verify`` can re-judge what was observed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from chaos.observations import Observations, Record, to_json

__all__ = ["Journal"]


class Journal:
    """Append-only JSONL writer shared by the runner's tasks and threads."""

    def __init__(self, path: Path, experiment: str, t0: int, wall_t0: float) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.observations = Observations(experiment=experiment, t0=t0, wall_t0=wall_t0)
        self.write_raw({"type": "run", "experiment": experiment, "t0": t0, "wall_t0": wall_t0, "pid": os.getpid()}, durable=True)

    def append(self, record: Record, *, durable: bool = False) -> None:
        """Keep ``record`` in memory and on disk; ``durable`` also fsyncs (fault plans and reverts)."""
        self.observations.add(record)
        self._write(to_json(record), durable)

    def write_raw(self, body: dict[str, Any], *, durable: bool = False) -> None:
        self._write(json.dumps(body, ensure_ascii=False, separators=(",", ":")), durable)

    def _write(self, line: str, durable: bool) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line + "\n")
            self._file.flush()
            if durable:
                os.fsync(self._file.fileno())

    def close(self, status: str) -> None:
        """Mark the run finished (the watchdog stands down when it sees this) and close the file."""
        self.write_raw({"type": "end", "status": status, "wall": time.time()}, durable=True)
        with self._lock:
            self._file.close()
