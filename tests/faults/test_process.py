"""process.kill against real child processes: the signal, its timing, cancellation, restart, refusal."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from chaos.model.context import RunContext, TargetInfo
from chaos.model.errors import FaultUnsupported
from faults.process import ProcessKill, describe_status

pytestmark = pytest.mark.timeout(60)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes standing in for the serving process; all killed and reaped at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def spawn(children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(SLEEPER)
    children.append(proc)
    return proc


def env_for(pid: int | None, tmp_path: Path) -> RunContext:
    target = TargetInfo(kind="builtin", base_url="http://127.0.0.1:1/v1", pid=pid)
    return RunContext(seed=1, target=target, run_dir=tmp_path)


def kill(**params: Any) -> ProcessKill:
    return ProcessKill.from_params("crash", {"target": "server", "signal": "SIGKILL", "at": 0.0,
                                             "restart": False} | params)


async def test_sigkill_at_phase_start(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    proc = spawn(children)
    env = env_for(proc.pid, tmp_path)
    fault = kill()
    fault = fault.activate(env)
    assert fault.plan()["pid"] == proc.pid
    evidence = await fault.inject()
    # The child is not reaped yet (we are its parent and have not waited): the zombie's status shows.
    assert evidence["killed"] and evidence["exit"] == "killed by SIGKILL"
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert (await fault.revert())["killed"]
    assert (await fault.revert())["skipped"] == "already reverted"


async def test_sigterm_at_a_delay(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    proc = spawn(children)
    env = env_for(proc.pid, tmp_path)
    fault = kill(signal="SIGTERM", at=0.3)
    start = time.monotonic_ns()
    fault = fault.activate(env)
    evidence = await fault.inject()
    assert evidence["scheduled"] and proc.poll() is None  # not yet
    await asyncio.to_thread(proc.wait, 10)
    assert proc.returncode == -signal.SIGTERM
    outcome = await fault.revert()
    assert outcome["killed"] and outcome["signal"] == "SIGTERM"
    delay = (outcome["sent_at_monotonic_ns"] - start) / 1e9
    assert 0.3 <= delay < 5.0  # at ~`at` (the upper bound only guards a hang)


async def test_revert_cancels_a_pending_kill(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    proc = spawn(children)
    env = env_for(proc.pid, tmp_path)
    fault = kill(at=30.0, restart=True)
    env.restart_target = _forbidden_restart
    fault = fault.activate(env)
    await fault.inject()
    outcome = await fault.revert()
    assert outcome["cancelled"] and not outcome["killed"]
    await asyncio.sleep(0.2)
    assert proc.poll() is None  # never signalled


async def _forbidden_restart() -> None:
    raise AssertionError("a cancelled kill must not restart the target")


async def test_restart_is_awaited_after_the_kill(tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    proc = spawn(children)
    env = env_for(proc.pid, tmp_path)
    restarts: list[int] = []

    async def restart_target() -> None:
        assert proc.poll() is not None or proc.wait(timeout=5) is not None  # the old one is gone first
        await asyncio.sleep(0.3)  # a real restart takes a while: revert must wait for it
        new = spawn(children)
        env.target = replace(env.target, pid=new.pid)
        restarts.append(new.pid)

    env.restart_target = restart_target
    fault = kill(at=0.1, restart=True)
    fault = fault.activate(env)
    await fault.inject()
    await asyncio.to_thread(proc.wait, 10)  # the runner, as the parent, reaps the killed server
    assert not restarts
    outcome = await fault.revert()  # the kill was sent: revert waits for the restart in progress
    assert restarts and outcome["restarted"] and outcome["new_pid"] == restarts[0] != proc.pid
    assert proc.returncode == -signal.SIGKILL
    assert children[-1].poll() is None  # the restarted "server" runs


def test_refuses_a_target_without_a_pid(tmp_path: Path) -> None:
    with pytest.raises(FaultUnsupported, match="pid of the serving process.*openai"):
        target = TargetInfo(kind="openai", base_url="http://staging.example/v1")
        kill().activate(RunContext(seed=1, target=target, run_dir=tmp_path))
    with pytest.raises(FaultUnsupported, match="restart"):
        kill(restart=True).activate(env_for(1, tmp_path))


def test_describe_status() -> None:
    assert describe_status(9) == "killed by SIGKILL"
    assert describe_status(3 << 8) == "exited with 3"
    assert describe_status(None) is None
