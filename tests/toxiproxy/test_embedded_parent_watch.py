"""The run's embedded Toxiproxy stops when the run that started it is gone, however it went.

It runs in a session of its own (a Ctrl-C revert must still reach it). Started from the main thread it
gets a parent-death signal (chaos.host.children.spawn); started from another thread (the pytest
plugin runs a run in one) it did not, and a killed run left it serving: once for 2 h 24 min after a
SIGTERMed pytest. Here a real parent process starts it the runner's own way
(``resolve_server("embedded")``) from a worker thread and is killed with SIGKILL; the server must
follow within a few parent polls.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from chaos.host.procs import alive
from chaos.toxiproxy.server.server import PARENT_POLL_S

PARENT = """
import sys
import threading
from pathlib import Path
from chaos.execution.proxy import resolve_server
box = []
starter = threading.Thread(target=lambda: box.append(resolve_server("embedded", None, 7, Path(sys.argv[1]))))
starter.start()
starter.join()
print(box[0].process.pid, flush=True)
sys.stdin.read()  # until the test kills us
"""


def _gone_within(pid: int, seconds: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if not alive(pid):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def test_a_sigkilled_run_takes_its_embedded_toxiproxy_with_it(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "toxiproxy.log")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    server_pid = 0
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert alive(server_pid)
        time.sleep(3 * PARENT_POLL_S)
        assert alive(server_pid)  # serves while its run lives
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        took = _gone_within(server_pid, 20 * PARENT_POLL_S)
        assert took is not None, "the embedded Toxiproxy outlived its killed run"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=10)
        if server_pid and alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
    assert "parent process" in (tmp_path / "toxiproxy.log").read_text()
