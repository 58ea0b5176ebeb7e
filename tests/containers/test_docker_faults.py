"""Container faults against the real daemon and a real builtin stack in its container: each injected,
its effect observed from outside (requests that stall, tokens that slow, a process that dies),
its evidence read back from the daemon, and reverted — and left alone where the live state is no
longer this run's."""

from __future__ import annotations

import asyncio
import secrets
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.experiment import experiment_from_dict
from chaos.model.context import RunContext
from chaos.model.errors import FaultError, FaultUnsupported
from chaos.targets.base import Target
from chaos.targets.registry import running_target
from faults.docker import DockerCpuLimit, DockerKill, DockerPause

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def stack(tmp_path: Path, leftovers: list[str]) -> AsyncIterator[tuple[Target, RunContext]]:
    """The builtin stack in a container, and the run context a runner would hand the faults."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    leftovers.append(str(run_dir))
    spec = experiment_from_dict({"name": "t", "target": {"kind": "docker", "kv_blocks": 128},
                                 "phases": [{"name": "p", "duration": "1s"}]}).target
    # a run id of its own: two of these tests on two xdist workers at once must not want one container name
    run_id = f"faults-{secrets.token_hex(4)}"
    async with running_target(spec, target_url=None, run_dir=run_dir, seed=1, run_id=run_id) as target:
        ctx = RunContext(seed=1, target=target.info, run_dir=run_dir)

        async def restart() -> None:
            await target.restart()
            ctx.target = target.info

        ctx.restart_target = restart
        yield target, ctx


async def stream(base_url: str, max_tokens: int = 32, timeout: float = 10.0) -> tuple[float, float]:
    """One streamed completion: (seconds to the first content byte, tokens per second after it)."""
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    sent = time.monotonic()
    first = None
    events = 0
    async with httpx.AsyncClient(timeout=timeout) as client, \
            client.stream("POST", base_url + "/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                events += 1
                first = first or time.monotonic()
    end = time.monotonic()
    assert first is not None and events >= max_tokens // 2
    return first - sent, events / max(end - first, 1e-6)


async def test_pause_freezes_the_engine_and_unpause_thaws_it(stack: tuple[Target, RunContext],
                                                             docker_client: Any) -> None:
    target, ctx = stack
    injection = DockerPause.from_params("freeze", {}).activate(ctx)
    assert injection.plan() == {"container_id": target.info.container_id, "paused_before": False, "revert": "unpause"}
    evidence = await injection.inject()
    assert evidence["paused"] is True and evidence["status"] == "paused"
    assert docker_client.containers.get(target.info.container_id).attrs["State"]["Paused"] is True
    # from outside: the kernel still accepts the connection, but nothing answers
    with pytest.raises(httpx.ReadTimeout):
        async with httpx.AsyncClient(timeout=1.0) as client:
            await client.get(target.info.base_url[: -len("/v1")] + "/health")
    reverted = await injection.revert()
    assert reverted["unpaused"] is True and reverted["paused"] is False and reverted["paused_for_s"] >= 1.0
    assert reverted["cpu_used_while_paused_ms"] == 0  # the freezer's proof: no CPU time at all while paused
    ttft, _ = await stream(target.info.base_url)
    assert ttft < 5.0
    assert (await injection.revert())["skipped"] == "not injected"  # idempotent


async def test_pause_leaves_alone_a_container_someone_else_paused_or_unpaused(stack: tuple[Target, RunContext],
                                                                               docker_client: Any) -> None:
    target, ctx = stack
    container = docker_client.containers.get(target.info.container_id)
    container.pause()  # not ours: the inject refuses to take it over, and so never unpauses it
    with pytest.raises(FaultError, match="paused already, not by this fault"):
        await DockerPause.from_params("freeze", {}).activate(ctx).inject()
    container.unpause()
    injection = DockerPause.from_params("freeze", {}).activate(ctx)
    await injection.inject()
    container.unpause()  # someone thaws it mid-phase: the revert says so and changes nothing
    assert (await injection.revert())["skipped"].startswith("no longer paused")


async def test_cpu_limit_throttles_a_cpu_engine_and_restores_the_previous_quota(stack: tuple[Target, RunContext],
                                                                                docker_client: Any) -> None:
    target, ctx = stack
    base = target.info.base_url
    await stream(base)  # warm
    free = [await stream(base, max_tokens=16) for _ in range(3)]
    injection = DockerCpuLimit.from_params("starve", {"cpus": 0.1, "period": 0.1}).activate(ctx)
    plan = injection.plan()
    assert plan["previous_quota_us"] == 0 and plan["set_quota_us"] == 10_000 and plan["set_period_us"] == 100_000
    evidence = await injection.inject()
    assert (evidence["cpu_quota_us"], evidence["cpu_period_us"]) == (10_000, 100_000)
    starved = [await stream(base, max_tokens=16, timeout=60) for _ in range(3)]
    reverted = await injection.revert()
    # evidence from the cgroup itself, as the daemon reports it: the quota bit
    assert reverted["restored"] is True and reverted["cpu_quota_us"] == -1 and reverted["throttled_periods"] > 0
    host = docker_client.containers.get(target.info.container_id).attrs["HostConfig"]
    assert host["CpuQuota"] == -1
    # before and after: a busy spell of the shared machine hits both
    free += [await stream(base, max_tokens=16) for _ in range(3)]
    # and the engine felt it: a tenth of a CPU cuts the decode rate several-fold (0.02-0.12 of
    # unlimited, however loaded the machine was); ratios, side by side
    rate_free, rate_starved = statistics.median(r for _, r in free), statistics.median(r for _, r in starved)
    print(f"\ntokens/s free {rate_free:.0f}, at 0.1 CPU {rate_starved:.0f}; TTFT free "
          f"{statistics.median(t for t, _ in free) * 1e3:.1f}ms, "
          f"starved {statistics.median(t for t, _ in starved) * 1e3:.1f}ms; "
          f"throttled {reverted['throttled_periods']}/{reverted['periods']} periods")
    assert rate_starved < 0.5 * rate_free, (rate_free, rate_starved)


async def test_cpu_limit_leaves_alone_a_quota_someone_else_changed(stack: tuple[Target, RunContext],
                                                                   docker_client: Any) -> None:
    target, ctx = stack
    injection = DockerCpuLimit.from_params("starve", {"cpus": 0.5, "period": 0.1}).activate(ctx)
    injection.plan()
    await injection.inject()
    docker_client.api.update_container(target.info.container_id, cpu_quota=70_000)  # an operator's change mid-phase
    reverted = await injection.revert()
    assert reverted["restored"] is False and "changed by someone else" in reverted["why"]
    assert docker_client.containers.get(target.info.container_id).attrs["HostConfig"]["CpuQuota"] == 70_000


async def test_kill_with_restart_brings_the_same_container_back(stack: tuple[Target, RunContext],
                                                                docker_client: Any) -> None:
    target, ctx = stack
    before = docker_client.containers.get(target.info.container_id).attrs["State"]["StartedAt"]
    injection = DockerKill.from_params("crash", {"signal": "SIGKILL", "at": 0.0, "restart": True}).activate(ctx)
    evidence = await injection.inject()
    # 128 + SIGKILL, as the daemon saw it
    assert evidence["killed"] and evidence["exited"] and evidence["exit_code"] == 137
    reverted = await injection.revert()
    assert reverted["restarted"] and reverted["started_at"] != before and reverted["status"] == "running"
    assert ctx.target.container_id == target.info.container_id  # the same container, on the same port
    ttft, _ = await stream(ctx.target.base_url)
    assert ttft < 5.0


async def test_kill_at_a_set_time_and_cancelled_when_the_phase_ends_first(stack: tuple[Target, RunContext],
                                                                          docker_client: Any) -> None:
    target, ctx = stack
    later = DockerKill.from_params("crash", {"signal": "SIGTERM", "at": 30.0, "restart": False}).activate(ctx)
    assert (await later.inject())["scheduled"] is True
    assert (await later.revert())["cancelled"] is True
    assert docker_client.containers.get(target.info.container_id).status == "running"
    now = DockerKill.from_params("crash", {"signal": "SIGTERM", "at": 0.1, "restart": False}).activate(ctx)
    await now.inject()
    await asyncio.sleep(1.0)  # past the kill: the revert now waits for the exit instead of cancelling
    reverted = await now.revert()
    assert reverted["killed"] and reverted["exited"] and reverted["signal"] == "SIGTERM"
    assert docker_client.containers.get(target.info.container_id).status == "exited"


async def test_container_faults_refuse_a_target_without_a_container(tmp_path: Path,
                                                                    stack: tuple[Target, RunContext]) -> None:
    _, ctx = stack
    remote = RunContext(seed=1, target=replace(ctx.target, container_id=None, kind="openai"), run_dir=tmp_path)
    for fault in (DockerPause.from_params("p", {}), DockerCpuLimit.from_params("c", {"cpus": 1.0, "period": 0.1})):
        with pytest.raises(FaultUnsupported, match="needs the container the runner started"):
            fault.activate(remote)
    other_run = RunContext(seed=1, target=ctx.target, run_dir=tmp_path / "another-run")
    with pytest.raises(FaultUnsupported, match="is not this run's"):
        DockerPause.from_params("p", {}).activate(other_run)
