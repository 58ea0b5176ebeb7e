"""A stack whose runner was SIGKILLed shuts itself down, also one started from a worker thread.

The pytest plugin runs experiments in a worker thread, where PR_SET_PDEATHSIG cannot be used (it
fires when the forking thread ends): a killed pytest used to leave its builtin stack serving.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.timeout(90)

PARENT = textwrap.dedent("""
    import threading, time
    from chaos.stack.process import StackProcess

    def start():
        stack = StackProcess.start("--port", "0", timeout=60)
        print(stack.proc.pid, stack.url, flush=True)

    worker = threading.Thread(target=start)
    worker.start()
    worker.join()
    time.sleep(120)  # killed long before this
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:  # reaped by init soon after; a zombie is gone
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_stack_started_from_a_worker_thread_stops_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    stack_pid = 0
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        stack_pid = int(line.split()[0])
        assert _alive(stack_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 15
        while _alive(stack_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(stack_pid), "the orphaned stack is still serving"
    finally:
        parent.kill()
        parent.wait(10)
        if stack_pid and _alive(stack_pid):
            os.kill(stack_pid, signal.SIGKILL)
