"""Starting the runner's child processes (the stack, the embedded Toxiproxy) so none outlives it.

Children started from the main thread get PR_SET_PDEATHSIG(SIGTERM): if the runner is killed
(even with SIGKILL), the kernel terminates them, so a killed run leaves no stack or proxy behind.
The death signal fires when the *thread* that forked exits, so it is set only from the main
thread (a pytest plugin run happens in a worker thread and stops its children itself).
"""

from __future__ import annotations

import ctypes
import os
import selectors
import signal
import subprocess
import threading
import time
from typing import Any

__all__ = ["first_line", "script_interpreter", "spawn"]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def spawn(args: list[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen`` that ties the child's life to this process where it safely can."""
    if threading.current_thread() is threading.main_thread():
        popen_kwargs.setdefault("preexec_fn", _die_with_parent)
    return subprocess.Popen(args, **popen_kwargs)


def first_line(proc: subprocess.Popen[Any], timeout: float) -> str:
    """The first line the child writes to its stdout pipe, waiting at most ``timeout`` seconds.

    Returns what arrived ("" when nothing did, or the child exited first). Reads the raw file
    descriptor through a selector, so a silent child can never block the caller past the deadline.
    """
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if sel.select(min(left, 0.2)):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buffer += chunk
            elif proc.poll() is not None:
                break
    return buffer.split(b"\n", 1)[0].decode(errors="replace").strip()


def script_interpreter(script: str) -> str | None:
    """The interpreter a console script (``vllm``, ``litellm``) names on its ``#!`` line: the
    environment it was installed into, whose Python can then be asked what that environment holds."""
    try:
        with open(script, "rb") as f:
            line = f.readline(512)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    words = line[2:].decode(errors="replace").split()
    return words[0] if words else None
