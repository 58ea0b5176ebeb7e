"""Container faults on a docker target's container: freeze it, kill it, starve it of CPU.

- ``docker.pause``: the cgroup freezer stops every process in the container at once (the engine,
  its server, its tokenizer threads); connections stay open and requests queue in the kernel. Revert
  unpauses. Evidence: ``State.Paused`` read back from the daemon.
- ``docker.kill``: a signal to the container's main process at a set time; with ``restart`` the
  same container is started again once it has exited and the run waits until it answers. Evidence:
  the exit code and times the daemon recorded, and the new start.
- ``docker.cpu_limit``: a CFS quota (``cpus`` of one CPU per period) set with ``docker update`` and
  the previous quota and period restored on revert. Evidence: the quota read back, and the cgroup's
  own count of throttled periods over the fault.

Each acts only on the container the runner started for this run (``TargetInfo.container_id``) and
only while it still carries this run's labels; a revert or a rollback restores the value read
before the inject, and only where the live value is still the one this run set. The Docker SDK
blocks, so every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chaos.docker.containers import container_facts, docker_client, find_container, ownership_problem
from chaos.model.context import RunContext
from chaos.model.errors import FaultError, FaultUnsupported
from chaos.model.params import Param, Schema
from faults.base import Fault, Injection, register
from faults.kill_schedule import KillSchedule

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["DockerCpuLimit", "DockerKill", "DockerPause", "quota_for"]

EXIT_WAIT_S = 30.0  # a SIGTERM'd server may drain its streams first
DEFAULT_PERIOD_US = 100_000  # the kernel's CFS period when none is set


def _target_problem(kind: str, experiment: Experiment) -> list[tuple[str, str]]:
    if experiment.target.kind != "docker":
        return [("", f"{kind} acts on the container of a docker target; this experiment's target is "
                     f"{experiment.target.kind} (set target.kind: docker)")]
    return []


def _container_id(kind: str, ctx: RunContext) -> str:
    if not ctx.target.container_id:
        raise FaultUnsupported(f"{kind} needs the container the runner started (target.kind: docker); "
                               f"target {ctx.target.kind} at {ctx.target.base_url} has none "
                               "(--target-url makes any target remote)")
    return ctx.target.container_id


def _checked(kind: str, ctx: RunContext) -> dict[str, Any]:
    """At activation: the daemon answers and the target container is there and this run's; its inspect data."""
    container_id = _container_id(kind, ctx)
    client = docker_client(FaultUnsupported, kind)
    try:
        container = find_container(client, container_id)
        if container is None:
            raise FaultUnsupported(f"{kind}: the target container {container_id[:12]} is not on the Docker daemon")
        why = ownership_problem(container.attrs, run_dir=ctx.run_dir)
        if why is not None:
            raise FaultUnsupported(f"{kind}: {why}")
        return dict(container.attrs)
    finally:
        client.close()


def _rollback_container(kind: str, undo: Mapping[str, Any]) -> tuple[Any, Any] | dict[str, Any]:
    """(client, container) for a rollback, or the evidence of why it leaves things alone."""
    client = docker_client(FaultError, f"rolling back {kind}")
    container = find_container(client, str(undo.get("container_id") or ""))
    if container is None:
        client.close()
        return {"skipped": "the container is gone"}
    why = ownership_problem(container.attrs, run_dir=str(undo.get("run_dir") or "/nonexistent"),
                            run_id=str(undo.get("run_id") or ""))
    if why is not None:
        client.close()
        return {"skipped": f"{why}; left alone"}
    return client, container


class _ContainerInjection(Injection):
    """Shared by the three kinds: this run's container, looked up and checked on every call."""

    outlives_runner = True  # a frozen or throttled container stays so when the runner dies

    def __init__(self, fault: Fault, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self.container_id = _container_id(fault.kind, ctx)
        self._client: Any = None

    def _container(self) -> Any:
        """The container, reloaded; ``FaultError`` when it is gone or no longer this run's."""
        if self._client is None:
            self._client = docker_client(FaultUnsupported, self.kind)
        container = find_container(self._client, self.container_id)
        if container is None:
            raise FaultError(f"{self.kind}: the target container {self.container_id[:12]} is gone")
        why = ownership_problem(container.attrs, run_dir=self.ctx.run_dir)
        if why is not None:
            raise FaultError(f"{self.kind}: {why}")
        return container

    def _close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def plan(self) -> dict[str, Any]:
        return {"container_id": self.container_id}


# -- docker.pause -------------------------------------------------------------------------------------


@register
@dataclass(frozen=True, kw_only=True)
class DockerPause(Fault):
    """Freeze the target container (cgroup freezer) for the phase."""

    kind = "docker.pause"
    summary = ("freeze the target container for the phase (cgroup freezer: every process stops at once); "
               "unpause on revert")
    schema = Schema()

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        return _target_problem(self.kind, experiment)

    def activate(self, ctx: RunContext) -> Injection:
        _checked(self.kind, ctx)
        return _Pause(self, ctx)

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        found = _rollback_container(cls.kind, undo)
        if isinstance(found, dict):
            return found
        client, container = found
        try:
            if not container.attrs["State"].get("Paused"):
                return {"skipped": "not paused", **_brief(container.attrs)}
            container.unpause()
            container.reload()
            return {"unpaused": True, **_brief(container.attrs)}
        finally:
            client.close()


def _brief(attrs: Mapping[str, Any]) -> dict[str, Any]:
    facts = container_facts(attrs)
    return {k: facts[k] for k in ("container", "status", "paused")}


class _Pause(_ContainerInjection):
    def __init__(self, fault: DockerPause, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self._paused_at: float | None = None
        self._cpu_ns: int | None = None

    def plan(self) -> dict[str, Any]:
        return {"container_id": self.container_id, "paused_before": False, "revert": "unpause"}

    async def inject(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._pause)

    def _pause(self) -> dict[str, Any]:
        container = self._container()
        state = container.attrs["State"]
        if state.get("Paused"):
            raise FaultError(f"docker.pause: container {self.container_id[:12]} is paused already, "
                             "not by this fault: left alone")
        if state.get("Status") != "running":
            raise FaultError(f"docker.pause: container {self.container_id[:12]} is {state.get('Status')}, not running")
        container.pause()
        self._paused_at = time.monotonic()
        container.reload()
        evidence = _brief(container.attrs)
        if not evidence["paused"]:
            raise FaultError(f"docker.pause: the daemon reports container {self.container_id[:12]} "
                             f"as {evidence['status']} after pause")
        self._cpu_ns = _cpu_used_ns(container)
        return evidence

    async def revert(self) -> dict[str, Any]:
        if self._paused_at is None:
            return {"skipped": "not injected"}
        return await asyncio.to_thread(self._unpause)

    def _unpause(self) -> dict[str, Any]:
        try:
            container = self._container()
            if not container.attrs["State"].get("Paused"):
                return {"skipped": "no longer paused (unpaused by someone else)", **_brief(container.attrs)}
            # the freezer's proof: no CPU time at all went to the container while it was paused
            used = _cpu_used_ns(container) - self._cpu_ns if self._cpu_ns is not None else None
            container.unpause()
            container.reload()
            frozen = round(time.monotonic() - (self._paused_at or time.monotonic()), 3)
            self._paused_at = None
            return {"unpaused": True, "paused_for_s": frozen,
                    "cpu_used_while_paused_ms": None if used is None else round(used / 1e6, 3),
                    **_brief(container.attrs)}
        finally:
            self._close()


# -- docker.kill --------------------------------------------------------------------------------------


@register
@dataclass(frozen=True, kw_only=True)
class DockerKill(Fault):
    """Kill the target container's main process with a signal; optionally start the container again."""

    kind = "docker.kill"
    summary = "signal the target container's main process at a set time (docker kill); optionally start it again"
    schema = Schema(
        params=(
            Param("signal", "choice", "SIGKILL", choices=("SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP")),
            Param("at", "duration", 0.0, doc="delay after the phase start"),
            Param("restart", "bool", False,
                  doc="start the same container again once it has exited, and wait until it answers"),
        ),
    )

    signal: str
    at: float
    restart: bool

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        return _target_problem(self.kind, experiment)

    def activate(self, ctx: RunContext) -> Injection:
        if self.restart and ctx.restart_target is None:
            raise FaultUnsupported("docker.kill with restart: true needs the runner to restart the target, "
                                   "which it cannot here")
        _checked(self.kind, ctx)
        return _Kill(self, ctx)


class _Kill(_ContainerInjection):
    """The kill scheduled for one phase, what the daemon recorded of it, and the restart if asked for."""

    outlives_runner = False  # a kill cannot be undone; the container itself is the target's to remove

    def __init__(self, fault: DockerKill, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self._schedule = KillSchedule(self.name)
        self._outcome: dict[str, Any] = {}
        self._restarted = False

    def plan(self) -> dict[str, Any]:
        return {"container_id": self.container_id, "signal": self.spec.signal,
                "restart": bool(getattr(self.spec, "restart", False)), "note": "a kill cannot be undone"}

    async def inject(self) -> dict[str, Any]:
        before = await asyncio.to_thread(lambda: container_facts(self._container().attrs))
        if before["status"] != "running":
            raise FaultError(f"docker.kill: container {before['container']} is {before['status']}, not running")
        self._restarted = False
        self._outcome = {"container": before["container"], "signal": self.spec.signal, "at_s": self.spec.at,
                         "started_at_before": before["started_at"]}
        scheduled = await self._schedule.start(self.spec.at, self._kill)
        return dict(self._outcome, scheduled=True) if scheduled else dict(self._outcome)

    async def _kill(self) -> None:
        sent = time.monotonic()
        await asyncio.to_thread(lambda: self._container().kill(signal=self.spec.signal))
        self._outcome.update(killed=True, sent_at_monotonic_ns=time.monotonic_ns())
        self._outcome.update(await self._wait_exit(sent))
        self._schedule.acted.set()
        if self.spec.restart and self._outcome.get("exited"):
            await self._restart()

    async def _wait_exit(self, sent: float) -> dict[str, Any]:
        """Poll the daemon until the container has exited; its exit code and times as it recorded them."""
        while time.monotonic() - sent < EXIT_WAIT_S:
            facts = await asyncio.to_thread(lambda: container_facts(self._container().attrs))
            if facts["status"] in ("exited", "dead"):
                return {"exited": True, "exit_code": facts["exit_code"], "oom_killed": facts["oom_killed"],
                        "finished_at": facts["finished_at"], "exit_after_s": round(time.monotonic() - sent, 3)}
            await asyncio.sleep(0.05)
        return {"exited": False, "exit": f"still running {EXIT_WAIT_S:g}s after the signal"}

    async def _restart(self) -> None:
        if self._restarted or self.ctx.restart_target is None:
            return
        start = time.monotonic()
        await self.ctx.restart_target()
        self._restarted = True
        facts = await asyncio.to_thread(lambda: container_facts(self._container().attrs))
        self._outcome.update(restarted=True, restart_s=round(time.monotonic() - start, 3),
                             started_at=facts["started_at"], status=facts["status"],
                             restart_count=facts["restart_count"])

    async def revert(self) -> dict[str, Any]:
        if (skipped := self._schedule.skip_revert()) is not None:
            return skipped
        try:
            settled = await self._schedule.settle(sent="sent_at_monotonic_ns" in self._outcome)
            if (not settled.get("cancelled") and self.spec.restart and self._outcome.get("exited")
                    and not self._restarted):
                self._schedule.stop()
                await self._restart()  # a failure here is the revert's failure: the runner journals it
            return dict(self._outcome, **settled)
        finally:
            await asyncio.to_thread(self._close)


# -- docker.cpu_limit ---------------------------------------------------------------------------------


def quota_for(cpus: float, period_us: int) -> int:
    """The CFS quota (microseconds per period) that gives ``cpus`` CPUs; the kernel's floor is 1 ms. Pure."""
    return max(1000, round(cpus * period_us))


@register
@dataclass(frozen=True, kw_only=True)
class DockerCpuLimit(Fault):
    """Lower the target container's CPU quota for the phase; restore the previous one on revert."""

    kind = "docker.cpu_limit"
    summary = ("cap the target container's CPU (CFS quota: cpus per period) for the phase; "
               "the previous limit restored on revert")
    schema = Schema(
        params=(
            Param("cpus", "float", required=True, min=0.01, max=1024,
                  doc="CPUs the container may use, e.g. 0.2 (a fifth of one)"),
            Param("period", "duration", 0.1, doc="the CFS period (1ms to 1s); the quota is cpus x period"),
        ),
    )

    cpus: float
    period: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        out = _target_problem(self.kind, experiment)
        if not 0.001 <= self.period <= 1.0:
            out.append(("period", f"the CFS period must lie between 1ms and 1s, found {self.period:g}s"))
        return out

    def activate(self, ctx: RunContext) -> Injection:
        attrs = _checked(self.kind, ctx)
        if (attrs.get("HostConfig") or {}).get("NanoCpus"):
            raise FaultUnsupported(f"docker.cpu_limit: container {str(attrs.get('Id', ''))[:12]} "
                                   "was started with --cpus (NanoCpus), and Docker refuses a CFS quota beside it")
        return _CpuLimit(self, ctx)

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        found = _rollback_container(cls.kind, undo)
        if isinstance(found, dict):
            return found
        client, container = found
        try:
            return _restore(container, undo)
        finally:
            client.close()


def _restore(container: Any, undo: Mapping[str, Any]) -> dict[str, Any]:
    """The quota and period read before the inject, put back if the live ones are still this run's."""
    host = container.attrs["HostConfig"]
    quota, period = host.get("CpuQuota"), host.get("CpuPeriod")
    if (quota, period) != (undo.get("set_quota_us"), undo.get("set_period_us")):
        return {"restored": False, "cpu_quota_us": quota, "cpu_period_us": period,
                "why": f"the quota reads {quota}us per {period}us, not the {undo.get('set_quota_us')}us per "
                       f"{undo.get('set_period_us')}us this run set: changed by someone else since "
                       "(or never set); left alone"}
    previous_quota = int(undo.get("previous_quota_us") or 0)
    previous_period = int(undo.get("previous_period_us") or 0)
    # 0 means "never set", which `docker update` reads as "unchanged": -1 is the kernel's "no quota"
    container.client.api.update_container(container.id, cpu_quota=previous_quota if previous_quota > 0 else -1,
                                          cpu_period=previous_period or DEFAULT_PERIOD_US)
    container.reload()
    host = container.attrs["HostConfig"]
    return {"restored": True, "cpu_quota_us": host.get("CpuQuota"), "cpu_period_us": host.get("CpuPeriod"),
            "previous_quota_us": previous_quota, "previous_period_us": previous_period}


def _cpu_used_ns(container: Any) -> int:
    """CPU time the container's cgroup has used so far, as the daemon reports it (one sample)."""
    stats = container.stats(stream=False, one_shot=True)
    return int(((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage", 0))


def _throttling(container: Any) -> dict[str, int]:
    """The cgroup's CFS counters as the daemon reports them (one sample, no waiting)."""
    stats = container.stats(stream=False, one_shot=True)
    data = (stats.get("cpu_stats") or {}).get("throttling_data") or {}
    return {"periods": int(data.get("periods", 0)), "throttled_periods": int(data.get("throttled_periods", 0)),
            "throttled_time_ns": int(data.get("throttled_time", 0))}


class _CpuLimit(_ContainerInjection):
    def __init__(self, fault: DockerCpuLimit, ctx: RunContext) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.period_us = round(fault.period * 1e6)
        self.quota_us = quota_for(fault.cpus, self.period_us)
        self._undo: dict[str, Any] | None = None
        self._counters: dict[str, int] = {}

    def plan(self) -> dict[str, Any]:
        # read here, before the inject, so the fsync'd plan can restore it after a crash (one quick
        # inspect over the daemon's socket, as the GPU faults read NVML in their plans)
        host = self._container().attrs["HostConfig"]
        self._undo = {"container_id": self.container_id, "previous_quota_us": host.get("CpuQuota") or 0,
                      "previous_period_us": host.get("CpuPeriod") or 0, "set_quota_us": self.quota_us,
                      "set_period_us": self.period_us}
        return dict(self._undo)

    async def inject(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._limit)

    def _limit(self) -> dict[str, Any]:
        if self._undo is None:
            self.plan()
        container = self._container()
        self._counters = _throttling(container)
        container.client.api.update_container(container.id, cpu_period=self.period_us, cpu_quota=self.quota_us)
        container.reload()
        host = container.attrs["HostConfig"]
        if (host.get("CpuQuota"), host.get("CpuPeriod")) != (self.quota_us, self.period_us):
            raise FaultError(f"docker.cpu_limit: the daemon reports a quota of {host.get('CpuQuota')}us "
                             f"per {host.get('CpuPeriod')}us after setting {self.quota_us}us per {self.period_us}us")
        return {"container": self.container_id[:12], "cpus": self.spec.cpus, "cpu_quota_us": host.get("CpuQuota"),
                "cpu_period_us": host.get("CpuPeriod")}

    async def revert(self) -> dict[str, Any]:
        if self._undo is None or not self._counters:
            return {"skipped": "not injected"}
        return await asyncio.to_thread(self._unlimit)

    def _unlimit(self) -> dict[str, Any]:
        assert self._undo is not None
        try:
            container = self._container()
            after = _throttling(container)
            throttled = {k: after[k] - self._counters.get(k, 0) for k in after}
            evidence = _restore(container, self._undo)
            self._counters = {}
            share = throttled["throttled_periods"] / throttled["periods"] if throttled["periods"] else 0.0
            return {**evidence, "periods": throttled["periods"], "throttled_periods": throttled["throttled_periods"],
                    "throttled_share": round(share, 4), "throttled_s": round(throttled["throttled_time_ns"] / 1e9, 3)}
        finally:
            self._close()
