"""Start ``python -m chaos.stack`` as a child process, wait for its ready line, and stop it cleanly.

Used by the runner's builtin target, by tests and by the benchmark. Startup is bounded: a child
that does not print its ready line in time is killed and ``SetupFailed`` carries its stderr tail.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Self

from chaos.errors import SetupFailed

__all__ = ["StackProcess"]

READY_PREFIX = "streamchaos stack ready url="  # the one line serve.py prints (kept in sync by a test)


class StackProcess:
    """A running builtin stack: ``url`` (``http://H:P``), ``base_url`` (``/v1``), ``admin_url``, ``pid``."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, stderr: IO[bytes]) -> None:
        self.proc = proc
        self.url = url
        self._stderr = stderr

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def admin_url(self) -> str:
        return self.url + "/admin"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    @classmethod
    def start(cls, *args: str, timeout: float = 30.0, env: dict[str, str] | None = None) -> StackProcess:
        """Spawn the stack with ``args`` (serve options; ``--port 0`` is the default) and wait until ready."""
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child; closed by close()
        proc = subprocess.Popen(
            [sys.executable, "-m", "chaos.stack", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, **(env or {})},
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        buffer = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                left = deadline - time.monotonic()
                if left <= 0 or proc.poll() is not None:
                    break
                if sel.select(min(left, 0.2)):
                    chunk = os.read(proc.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    buffer += chunk
        line = buffer.split(b"\n", 1)[0].decode(errors="replace").strip()
        if not line.startswith(READY_PREFIX):
            code = proc.poll()
            if code is None:
                proc.kill()
                proc.wait(5)
            stderr.seek(0)
            tail = stderr.read()[-2000:].decode(errors="replace")
            stderr.close()
            why = f"exited with {code}" if code is not None else f"printed no ready line within {timeout:g}s"
            raise SetupFailed(f"builtin stack {why}; stdout {line!r}; stderr tail:\n{tail}")
        return cls(proc, line[len(READY_PREFIX):], stderr)

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; the exit code (negative: killed by a signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return int(self.proc.returncode)

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def close(self) -> None:
        self.stop()
        self._stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
