"""Start ``python -m chaos.stack`` as a child process, wait for its ready line, and stop it cleanly.

Used by the runner's builtin target, by tests and by the benchmark. Startup is bounded: a child
that does not print its ready line in time is killed and ``SetupFailed`` carries its stderr tail.
Each stack gets its own random admin token (``admin_token``), passed in its environment, never on
its command line.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Self

from chaos.host.children import first_line, spawn
from chaos.host.runfiles import open_append
from chaos.model.errors import SetupFailed
from chaos.stack.serve import ADMIN_TOKEN_ENV, READY_PREFIX

__all__ = ["StackProcess", "parse_ready"]


def parse_ready(line: str) -> tuple[str, str | None]:
    """``(url, ca)`` of a ready line: ``READY_PREFIX`` + URL, then `` ca=PATH`` (the rest of the line)
    where the stack made its own certificate."""
    url, _, rest = line[len(READY_PREFIX):].strip().partition(" ")
    return url, rest[len("ca="):] if rest.startswith("ca=") else None


class StackProcess:
    """A running builtin stack: ``url`` (``http://H:P``, or ``https://`` with ``--tls``), ``base_url``
    (``/v1``), ``admin_url``, ``pid``, the ``admin_token`` its admin API wants (``admin_headers`` for a
    request), and ``ca``: the CA of a certificate it made itself (``--tls`` without files), else None."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, stderr: IO[bytes], admin_token: str = "") -> None:
        self.proc = proc
        self.url = url
        self._stderr = stderr
        self.admin_token = admin_token
        self.ca: str | None = None

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

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
    def launch(
        cls, *args: str, command: list[str] | None = None, env: dict[str, str] | None = None,
        log: Path | None = None, new_session: bool = False, admin_token: str | None = None,
    ) -> StackProcess:
        """Spawn the stack (``python -m chaos.stack ARGS``, or ``command``) without waiting for it.

        Spawned through ``chaos.host.children``, so from the main thread the child dies with us; our own
        stack also watches its parent id, so it shuts down once we are gone from any thread. Its
        stderr goes to ``log`` (appended) or to a temporary file. Its admin token is ``admin_token``
        or a new random one, in its environment (``STREAMCHAOS_ADMIN_TOKEN``: readable only by its
        owner in /proc, unlike the command line). Call ``wait_ready`` next.
        """
        token = admin_token or secrets.token_urlsafe(32)
        # a run directory's log: no link followed, 0600 (chaos.host.runfiles); closed by close()
        stderr: IO[bytes] = open_append(log) if log is not None else tempfile.TemporaryFile()  # noqa: SIM115
        if command is None:  # our own stack shuts down when we are gone, however we went (serve --exit-with-parent)
            command = [sys.executable, "-m", "chaos.stack", *args, "--exit-with-parent", str(os.getpid())]
        proc = spawn(
            command,
            stdout=subprocess.PIPE, stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {}), ADMIN_TOKEN_ENV: token},
            start_new_session=new_session,
        )
        return cls(proc, "", stderr, token)

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Block until the ready line (then return the URL); ``SetupFailed`` with the stderr tail if none comes."""
        proc = self.proc
        line = first_line(proc, timeout)
        if not line.startswith(READY_PREFIX):
            code = proc.poll()
            if code is None:
                proc.kill()
                proc.wait(5)
            tail = self.stderr_text()[-2000:]
            why = f"exited with {code}" if code is not None else f"printed no ready line within {timeout:g}s"
            raise SetupFailed(f"builtin stack {why}; stdout {line!r}; stderr tail:\n{tail}")
        self.url, self.ca = parse_ready(line)
        return self.url

    @classmethod
    def start(
        cls, *args: str, timeout: float = 30.0, env: dict[str, str] | None = None, command: list[str] | None = None,
        admin_token: str | None = None,
    ) -> StackProcess:
        """Spawn the stack with ``args`` (serve options; ``--port 0`` is the default) and wait until ready."""
        stack = cls.launch(*args, command=command, env=env, admin_token=admin_token)
        try:
            stack.wait_ready(timeout)
        except SetupFailed:
            stack._stderr.close()
            raise
        return stack

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait up to ``timeout``, then SIGKILL; the exit code (negative: killed by a signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a duty-cycle fault may have left it stopped
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
        try:
            self._stderr.flush()
            with open(self._stderr.fileno(), "rb", closefd=False) as f:
                f.seek(0)
                return f.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        self.stop()
        self._stderr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
