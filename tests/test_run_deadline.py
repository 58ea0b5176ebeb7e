"""The run's deadline knows its target (issue 40, point 1): the bring-up is bounded by the start-up
allowance the target's kind really grants, and ``safety.max_duration`` counts from when the target
is ready. A 274 s vLLM start under ``max_duration + startup_timeout`` left 25 s for 40 s of phases.

A test-only target kind whose start takes longer than ``target.startup_timeout`` (as vLLM's does,
within its own floor) in front of one real builtin stack shared by the module; the stages of
``RunDeadline`` on a real event loop; the dry run's account of both bounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.execution.deadline import RunDeadline
from chaos.execution.dryrun import dry_run
from chaos.execution.runner import Runner
from chaos.experiment import experiment_from_dict
from chaos.model.context import TargetInfo
from chaos.model.experiment import Experiment, TargetSpec
from chaos.stack.process import StackProcess
from chaos.targets.base import TARGET_KINDS, Account, Target, TargetStart, target_kind
from chaos.targets.registry import kinds

pytestmark = pytest.mark.timeout(60)

START_TAKES_S = 3.0  # longer than target.startup_timeout, inside the kind's own allowance
FLOOR_S = 20.0  # the kind's allowance, as vLLM's STARTUP_FLOOR_S is its own


class SlowStart(Target):
    """A target whose start takes ``START_TAKES_S`` (as vLLM's three processes importing torch do), then
    answers as the module's real builtin stack."""

    kind = "test.slow-start"
    summary = "a test's kind: a start that takes longer than target.startup_timeout, within its own floor"
    order = 60
    stack_url = ""  # set by the fixture: the module's stack

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        return cls()

    @classmethod
    def startup_allowance_s(cls, spec: TargetSpec) -> float | None:
        return max(spec.startup_timeout, FLOOR_S)

    @classmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        out.say("target: the slow-starting test kind (not started now)")
        return TargetInfo(kind=cls.kind, base_url="http://127.0.0.1:<port>/v1", model=exp.target.model), False

    def __init__(self) -> None:
        self.info = TargetInfo(kind=self.kind, base_url="", model="tiny")

    async def start(self) -> TargetInfo:
        await asyncio.sleep(START_TAKES_S)
        self.info = TargetInfo(kind=self.kind, base_url=self.stack_url + "/v1", metrics_url=self.stack_url + "/metrics",
                               model="tiny")
        return self.info

    async def stop(self) -> None:
        return None


@pytest.fixture(scope="module")
def slow_kind() -> Iterator[type[SlowStart]]:
    kinds()  # the shipped ones first, as a run finds them
    target_kind(SlowStart)
    stack = StackProcess.start("--port", "0")
    SlowStart.stack_url = stack.url
    try:
        yield SlowStart
    finally:
        stack.close()
        TARGET_KINDS.pop(SlowStart.kind, None)


def _experiment(**safety: Any) -> Experiment:
    return experiment_from_dict({
        "name": "slow-start", "target": {"kind": "test.slow-start", "startup_timeout": "500ms"},
        "load": {"concurrency": 2, "max_tokens": 4, "process": "runner"},
        "phases": [{"name": "steady", "duration": "500ms"}], "sla": [{"kind": "errors", "budget": "0%"}],
        "safety": {"max_duration": "3s", "drain_timeout": "1s", "cleanup_window": "200ms",
                   "halt_on_dead_target": False, **safety},
    })


def test_a_start_within_the_kinds_allowance_leaves_max_duration_whole(slow_kind: type[SlowStart],
                                                                      tmp_path: Path) -> None:
    """3 s of start against startup_timeout 500ms: today the run's 3.5 s (max_duration + startup_timeout)
    were spent by the start and the run failed "exceeded safety.max_duration" before its phase ended."""
    result = asyncio.run(Runner(_experiment(), out_dir=tmp_path / "run", handle_signals=False).run())
    assert result.exit_code == 0, result.error
    assert result.ended - result.started >= START_TAKES_S + 1.0  # the phase ran after the whole start
    steady = result.observations.population("steady")
    assert steady and all(s.error is None for s in steady)


# -- the stages, on a real loop ----------------------------------------------------------------------

async def _stages() -> dict[str, Any]:
    seen: dict[str, Any] = {}
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as timeout:
        clock = RunDeadline(timeout, 100.0, grace_s=5.0)
        clock.start_up(300.0)
        seen["start-up"] = timeout.when() - loop.time()  # type: ignore[operator]
        clock.start_up(None)
        seen["reached"] = timeout.when() - loop.time()  # type: ignore[operator]
        clock.ready()
        seen["ready"] = timeout.when() - loop.time()  # type: ignore[operator]
        with clock.paused("path", 20.0):
            seen["path"] = timeout.when() - loop.time()  # type: ignore[operator]
            await asyncio.sleep(0.2)
        seen["after path"] = timeout.when() - loop.time()  # type: ignore[operator]
        seen["not counted"] = dict(clock.not_counted_s)
    return seen


def test_the_deadline_moves_from_the_start_up_allowance_to_max_duration_from_ready() -> None:
    seen = asyncio.run(_stages())
    assert seen["start-up"] == pytest.approx(305.0, abs=0.5)  # vLLM's 300 s floor + the grace
    assert seen["reached"] == pytest.approx(5.0, abs=0.5)  # a server already running: the grace only
    assert seen["ready"] == pytest.approx(100.0, abs=0.5)  # max_duration, whole, from ready
    assert seen["path"] == pytest.approx(120.0, abs=0.5)  # the path may take its allowance on top
    assert seen["after path"] == pytest.approx(100.0, abs=0.5)  # and its 0.2 s are not counted
    assert seen["not counted"]["path"] >= 0.19


async def _fired_in(stage: str) -> str:
    clock: RunDeadline | None = None
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(None) as timeout:
            clock = RunDeadline(timeout, 0.05, grace_s=0.05)
            clock.start_up(0.0)
            if stage != "start-up":
                clock.ready()
            if stage == "restart":
                with clock.paused("restart", 0.05):
                    await asyncio.sleep(1.0)
            await asyncio.sleep(1.0)
    assert clock is not None
    return clock.exceeded()


def test_the_message_names_the_bound_that_was_exceeded() -> None:
    assert asyncio.run(_fired_in("start-up")).startswith("the target was not ready within 0.05s")
    assert asyncio.run(_fired_in("run")).startswith("the run exceeded safety.max_duration (0.05s), counted from when")
    assert asyncio.run(_fired_in("restart")).startswith("the target's restart took longer than its allowance (0.05s)")


# -- the dry run ---------------------------------------------------------------------------------------

def _dry(target: dict[str, Any], **load: Any) -> str:
    exp = experiment_from_dict({"name": "d", "target": target, "load": {"concurrency": 1, **load},
                                "phases": [{"name": "a", "duration": "10s"}],
                                "safety": {"max_duration": "1m", "drain_timeout": "5s", "cleanup_window": "2s"}})
    return "\n".join(asyncio.run(dry_run(exp)).lines)


def test_the_dry_run_states_the_start_up_allowance_and_the_phases_against_max_duration() -> None:
    vllm = _dry({"kind": "vllm", "executable": "/nonexistent/python"})
    assert "deadline: the target has 330s to be ready (its start-up allowance 300s + 30s" in vllm, vllm
    assert "safety.max_duration counts from when the target is ready" in vllm
    assert "the run then needs 18s of max_duration 60s (phases 10s + 1s baseline" in vllm and "42s to spare" in vllm
    builtin = _dry({"kind": "builtin"})
    assert "deadline: the target has 90s to be ready (its start-up allowance 60s + 30s" in builtin, builtin
