"""Process faults: kill the serving process with a signal at a set time, optionally restart it.

``process.kill {target: engine|server, signal, at, restart}`` signals ``env.target.pid``. For the
builtin stack the engine and the ASGI server are one process, so ``engine`` and ``server`` name the
same pid; for a vLLM the run built, ``server`` is its API server and ``engine`` its ``EngineCore``
process (found at inject, in the API server's process group), and the evidence says what the API
server did next (vLLM's own answer to a dead engine). Remote targets (openai, docker, kubernetes)
have no pid here and are refused at ``check`` (use ``k8s.*`` faults).

The kill is scheduled with asyncio inside ``inject`` (``at`` after the phase start); ``revert`` cancels
a kill still pending. With ``restart`` the runner's ``env.restart_target()`` is awaited once the
process has exited, and at the latest on ``revert``; the revert returns only once the restarted
target serves again (a restart already under way in the scheduled task included, however long it
takes: vLLM's is minutes), so the fault's time in force and its phase are as long as the outage
really was, and the evidence says how long that was (``outage_s``: the kill sent to the target
answering again). A kill cannot be undone, so ``rollback`` has nothing to do; a restart after a
crashed run is the runner's next start.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from chaos.host.procs import check_signalable, exit_status, proc_state, start_time
from chaos.model.context import FaultAccount, RunContext, Scene
from chaos.model.errors import FaultError, FaultUnsupported
from chaos.model.params import Param, Schema
from faults.base import Fault, Injection, register
from faults.kill_schedule import REVERT_WAIT_S, KillSchedule

__all__ = ["ProcessKill", "describe_status"]

EXIT_WAIT_S = 30.0  # a SIGTERM'd server may drain its streams first
SERVER_WATCH_S = 10.0  # how long the API server is watched after its engine was killed
RESTART_BUDGET_S = 330.0  # a revert that restarts the target waits for its start-up (vLLM: up to 5 min)
REVERT_MARGIN_S = 5.0  # of a restarting revert's budget, left to end it cleanly when the restart overruns


def describe_status(status: int | None) -> str | None:
    """A wait status as words: ``"killed by SIGKILL"``, ``"exited with 0"``; None when unknown."""
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    if os.WIFEXITED(status):
        return f"exited with {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


@register
@dataclass(frozen=True, kw_only=True)
class ProcessKill(Fault):
    """Kill the serving process (engine and server are one process in the builtin stack)."""

    kind = "process.kill"
    summary = "kill the target's serving process with a signal at a set time; optionally restart it"
    schema = Schema(
        params=(
            Param("target", "choice", "server", choices=("engine", "server"),
                  doc="which process; the same pid for the builtin stack; vLLM's EngineCore or its API server"),
            Param("signal", "choice", "SIGKILL", choices=("SIGKILL", "SIGTERM", "SIGINT")),
            Param("at", "duration", 0.0, doc="delay after the phase start"),
            Param("restart", "bool", False, doc="restart the target once it has exited; the fault (and its phase) "
                  "lasts until it serves again, the outage in its evidence (outage_s)"),
        ),
    )

    target: str
    signal: str
    at: float
    restart: bool

    def describe(self, scene: Scene) -> FaultAccount:
        who = f"pid {scene.target.pid}" if scene.target.pid else "the serving process the runner starts"
        return FaultAccount(
            changes=(f"sends {self.signal} to {who} {self.at:g}s after the phase starts"
                     + (", then restarts the target" if self.restart else "")),
            undo=("a kill cannot be undone: "
                  + ("the runner restarts the target once it has exited, at the latest when the phase ends"
                     if self.restart else "the target stays down for the rest of the run")
                  + "; a kill still pending is cancelled when the phase ends"),
            refused=None if scene.target_spawned or scene.target.pid else
            (f"process.kill needs the pid of the serving process; target {scene.target.kind} "
             f"at {scene.target.base_url} has none"),
        )

    def activate(self, ctx: RunContext) -> Injection:
        pid = ctx.target.pid
        if pid is None:
            raise FaultUnsupported(
                f"process.kill needs the pid of the serving process, which the runner knows only for a target it"
                f" started (builtin, vllm); target {ctx.target.kind} at {ctx.target.base_url} has none;"
                " for a Kubernetes target use a k8s.* fault"
            )
        if self.restart and ctx.restart_target is None:
            raise FaultUnsupported("process.kill with restart: true needs the runner to restart target "
                                   f"{ctx.target.kind}, which it cannot")
        check_signalable(pid, "process.kill: the target process")
        return _Kill(self, ctx)


class _Kill(Injection):
    """The kill scheduled for one phase, its outcome, and the restart if asked for."""

    def __init__(self, fault: ProcessKill, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        if fault.restart:  # the revert waits for the exit, the server's answer and the restart
            self.step_timeout_s = EXIT_WAIT_S + SERVER_WATCH_S + RESTART_BUDGET_S
        self._schedule = KillSchedule(self.name)
        self._outcome: dict[str, Any] = {}
        self._restarted = False
        self._injected_ns = 0

    def plan(self) -> dict[str, Any]:
        # ``restart`` tells the halt watcher that the outage until the restart is planned
        return {"pid": self.ctx.target.pid, "signal": self.spec.signal, "restart": self.spec.restart,
                "note": "a kill cannot be undone"}

    def _victim(self) -> tuple[int, str]:
        """The pid to signal and what it is; vLLM's engine core is looked up now (a restart moves it)."""
        pid = self.ctx.target.pid
        if pid is None:
            raise FaultUnsupported("process.kill: the target has no known pid any more")
        if self.ctx.target.kind == "vllm" and self.spec.target == "engine":
            from chaos.host.procguard import engine_core_pid

            core = engine_core_pid(pid)
            if core is None:
                raise FaultError("process.kill target engine: no VLLM::EngineCore process in the group of vLLM's "
                                 f"API server (pid {pid})")
            return core, "vLLM EngineCore"
        return pid, "vLLM API server" if self.ctx.target.kind == "vllm" else "serving process"

    async def inject(self) -> dict[str, Any]:
        pid, what = self._victim()
        check_signalable(pid, "process.kill: the target process")
        self._injected_ns = time.monotonic_ns()
        self._outcome = {"pid": pid, "process": what, "signal": self.spec.signal, "at_s": self.spec.at}
        self._restarted = False
        identity = start_time(pid)
        scheduled = await self._schedule.start(self.spec.at, lambda: self._kill(pid, identity))
        return dict(self._outcome, scheduled=True) if scheduled else dict(self._outcome)

    async def _kill(self, pid: int, identity: int | None) -> None:
        if start_time(pid) != identity:
            self._outcome.update(killed=False, why=f"pid {pid} exited (or was reused) before the kill")
            self._schedule.acted.set()
            return
        sig = signal.Signals[self.spec.signal]
        sent = time.monotonic_ns()
        self._outcome.update(sent_at_monotonic_ns=sent, sent_after_s=round((sent - self._injected_ns) / 1e9, 4))
        os.kill(pid, sig)
        self._outcome.update(killed=True, **await _wait_exit(pid, identity, EXIT_WAIT_S))
        server = self.ctx.target.pid
        if server is not None and server != pid:  # the engine died: what its API server does about it
            self._outcome["api_server_after"] = await _server_after(server, start_time(server), SERVER_WATCH_S)
        self._schedule.acted.set()
        if self.spec.restart:
            await self._restart()

    async def _restart(self) -> None:
        if self._restarted:
            return
        if self.ctx.restart_target is None:
            raise FaultError("process.kill: restart requested but the runner gave no restart_target")
        start = time.monotonic()
        await self.ctx.restart_target()  # returns once the target answers its health check again
        served = time.monotonic_ns()
        self._restarted = True
        self._outcome.update(restarted=True, new_pid=self.ctx.target.pid, restart_s=round(time.monotonic() - start, 3),
                             served_again_at_monotonic_ns=served)
        sent = self._outcome.get("sent_at_monotonic_ns")
        if isinstance(sent, int):  # the outage as a client saw it: the kill sent to the target serving again
            self._outcome["outage_s"] = round((served - sent) / 1e9, 3)

    async def revert(self) -> dict[str, Any]:
        if (skipped := self._schedule.skip_revert()) is not None:
            return skipped
        # a restart under way is waited for to its end (the step's whole budget, less a margin to end cleanly)
        wait = self.step_timeout_s - REVERT_MARGIN_S if self.spec.restart else REVERT_WAIT_S
        settled = await self._schedule.settle(sent="sent_at_monotonic_ns" in self._outcome, wait_s=wait)
        if settled.get("cancelled") or not self.spec.restart or not self._outcome.get("killed") or self._restarted:
            return dict(self._outcome, **settled)
        self._schedule.stop()
        if settled.get("running"):  # a restart that outlasted its budget: the fault's failure, not a retry
            raise FaultError(f"process.kill: the target did not serve again within {wait:g}s of the revert "
                             f"({settled['kill_task_error']})")
        await self._restart()  # the kill task failed before its restart; a failure here is the revert's failure
        return dict(self._outcome, **settled)


async def _server_after(pid: int, identity: int | None, watch_s: float) -> str:
    """Whether a server whose engine was killed exits (and how soon) or keeps running."""
    outcome = await _wait_exit(pid, identity, watch_s)
    if outcome["exited"]:
        return f"exited {outcome['exit_after_s']:g}s after its engine ({outcome['exit']})"
    return f"still running {watch_s:g}s after its engine died"


async def _wait_exit(pid: int, identity: int | None, timeout: float) -> dict[str, Any]:
    """Poll /proc until ``pid`` has exited; never reap it (the runner is its parent, not us)."""
    start = time.monotonic()
    status = None
    while time.monotonic() - start < timeout:
        state = proc_state(pid)
        if state == "Z":
            status = exit_status(pid)
            break
        if state is None or start_time(pid) != identity:
            break  # already reaped by its parent
        await asyncio.sleep(0.01)
    else:
        return {"exited": False, "exit_status": None, "exit": f"still running after {timeout:g}s"}
    return {"exited": True, "exit_status": status, "exit": describe_status(status) or "exited (reaped by its parent)",
            "exit_after_s": round(time.monotonic() - start, 4)}
