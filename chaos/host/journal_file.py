"""The journal's file: JSON lines appended, thread-safe, redacted, fsync'd when durable; 0600, created
fresh, never through a link. A leaf (``chaos.execution.journal`` is the run listener on top), so a
load shard and ``rollback`` write and read journals without the run's event chain."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from chaos.host.redact import redact
from chaos.host.runfiles import open_at

__all__ = ["JOURNAL_NAME", "JournalFile"]

JOURNAL_NAME = "journal.jsonl"
_SURROGATE = re.compile("[\ud800-\udfff]")  # what a JSON "\\ud800" decodes to: no UTF-8 file holds it


class JournalFile:
    """Appends JSON lines to a journal file, thread-safe; ``durable`` lines are fsync'd.

    A line is on disk when ``write`` returns, unless it was written with ``hold``: then it waits,
    in order, for the next ``flush`` or unheld write, and every held line goes in one system call
    (whole lines only: a reader never meets half of one that was not cut by a kill)."""

    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
        # relative to the run directory's descriptor while the run holds it (chaos.host.runfiles)
        self._file = os.fdopen(open_at(path, flags, 0o600), "a", encoding="utf-8")
        self._held: list[str] = []

    def write(self, body: dict[str, Any] | str, *, durable: bool = False, hold: bool = False) -> None:
        line = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                                                             default=str)
        line = redact(line)  # a target that echoes a credential does not get it recorded
        if not line.isascii():
            line = _SURROGATE.sub("\ufffd", line)  # a lone one cannot be UTF-8: it would jam every later line
        with self._lock:
            if self._file.closed:
                return
            self._held.append(line)
            if hold and not durable:
                return
            self._write_held()
            if durable:
                os.fsync(self._file.fileno())

    def flush(self) -> None:
        """Write the held lines now."""
        with self._lock:
            if not self._file.closed and self._held:
                self._write_held()

    def _write_held(self) -> None:
        self._file.write("\n".join(self._held) + "\n")
        self._file.flush()
        self._held.clear()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed and self._held:
                self._write_held()
            self._file.close()
