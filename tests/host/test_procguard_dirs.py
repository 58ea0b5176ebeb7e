"""The process guard removes the directories its command's tree used (vLLM's ZMQ sockets) once the
group has ended: when the command exits, and when the guard is told to stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)

# binds a Unix socket in the directory and leaves it there, as vLLM does with its IPC paths
LEAVES_A_SOCKET = ("import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1] + '/ipc'); "
                   "print('bound', flush=True); time.sleep(float(sys.argv[2]))")


def guarded(directory: Path, hold_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "chaos.host.procguard", "--parent", str(os.getpid()), "--grace", "1",
                             "--remove-dir", str(directory), "--", sys.executable, "-c", LEAVES_A_SOCKET,
                             str(directory), str(hold_s)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)


def test_the_directory_goes_when_the_command_exits(tmp_path: Path) -> None:
    directory = tmp_path / "ipc-exits"
    directory.mkdir()
    guard = guarded(directory, 0.0)
    assert guard.wait(30) == 0
    assert not directory.exists()


def test_the_directory_goes_when_the_guard_is_stopped(tmp_path: Path) -> None:
    directory = tmp_path / "ipc-stopped"
    directory.mkdir()
    guard = guarded(directory, 300.0)
    try:
        assert guard.stdout is not None
        guard.stdout.readline()  # the command's pid
        deadline = time.monotonic() + 20
        while not (directory / "ipc").is_socket():
            assert time.monotonic() < deadline, "the guarded command never bound its socket"
            time.sleep(0.05)
        guard.terminate()
        guard.wait(30)
    finally:
        if guard.poll() is None:
            guard.kill()
    assert not directory.exists()
