"""The journal's file: JSON lines appended, thread-safe, redacted, fsync'd when durable; 0600, created
fresh, never through a link. A leaf (``chaos.execution.journal`` is the run listener on top), so a
load shard and ``rollback`` write and read journals without the run's event chain."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from chaos.host.redact import redact

__all__ = ["JOURNAL_NAME", "JournalFile"]

JOURNAL_NAME = "journal.jsonl"


class JournalFile:
    """Appends JSON lines to a journal file, thread-safe; ``durable`` lines are fsync'd."""

    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
        self._file = os.fdopen(os.open(path, flags, 0o600), "a", encoding="utf-8")

    def write(self, body: dict[str, Any] | str, *, durable: bool = False) -> None:
        line = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                                                             default=str)
        line = redact(line)  # a target that echoes a credential does not get it recorded
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
