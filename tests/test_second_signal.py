"""A second SIGINT/SIGTERM forces the exit during teardown, after the faults are reverted (issue 41, point 2).

A teardown step that never ends (as a shard coordinator waiting on a silent shard did) held the
runner forever: every later signal only said "already reverting and stopping", past max_duration,
the stack left running. Here the runner's own signal logic is driven in-process (``interrupt`` is
what its handlers call): the bring-up journals a container and enters a teardown step that never
ends, the phase's work reverts a fault when stopped. The second signal, sent during that revert or
during teardown, lets the revert finish, cuts the hung step, journals what is left for
``streamchaos rollback``, and the run ends ``interrupted``, exit 4, within seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.execution.runner import FORCE_GRACE_S, Runner
from chaos.experiment import experiment_from_dict
from chaos.model.observations import FaultEvent

pytestmark = pytest.mark.timeout(30)


def _runner(out: Path) -> Runner:
    exp = experiment_from_dict({
        "name": "forced", "target": {"url": "http://127.0.0.1:9"},
        "load": {"concurrency": 1, "max_tokens": 4, "process": "runner"},
        "phases": [{"name": "steady", "duration": "60s"}], "sla": [{"kind": "errors", "budget": "0%"}],
        "safety": {"max_duration": "120s"},
    })
    return Runner(exp, out_dir=out, handle_signals=False)


@pytest.mark.parametrize("second_during", ["revert", "teardown"])
def test_a_second_signal_forces_the_exit_after_the_revert_and_journals_what_is_left(
        tmp_path: Path, second_during: str) -> None:
    runner = _runner(tmp_path / "run")
    steps: list[str] = []
    up = asyncio.Event()

    async def hung_step() -> None:
        steps.append("teardown step began")
        try:
            await asyncio.Event().wait()  # never set: a call that is never answered
        finally:
            steps.append("teardown step cut")

    async def bring_up(resources: contextlib.AsyncExitStack) -> Any:
        assert runner.journal is not None
        runner.journal.resource({"name": "stack-c1", "kind": "docker.container", "action": "plan", "undo": {}})
        resources.push_async_callback(hung_step)
        return None

    async def drive(ctx: Any) -> None:
        emit = runner.events.emit
        emit(FaultEvent("lat", "network.latency", "plan", time.monotonic_ns(), "steady"))
        up.set()
        try:
            await asyncio.sleep(3600)
        finally:  # the phase's faults reverted, as `_injected` does: to its end, whatever arrives meanwhile
            if second_during == "revert":
                runner.interrupt("SIGINT")
            await asyncio.sleep(0.3)
            emit(FaultEvent("lat", "network.latency", "revert", time.monotonic_ns(), "steady"))
            steps.append("reverted")

    runner._bring_up = bring_up  # type: ignore[method-assign]  # the test stands in for the bring-up
    runner._drive = drive  # type: ignore[method-assign]  # and for the phases

    async def main() -> Any:
        run = asyncio.create_task(runner.run())
        await asyncio.wait_for(up.wait(), 10)
        runner.interrupt("SIGTERM")
        if second_during == "teardown":
            while "teardown step began" not in steps:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # hung there, as it was forever before
            runner.interrupt("SIGTERM")
        return await asyncio.wait_for(run, 5 + FORCE_GRACE_S)  # before: never returned

    started = time.monotonic()
    result = asyncio.run(main())
    assert time.monotonic() - started < 4.0
    assert steps == ["reverted", "teardown step began", "teardown step cut"]  # the revert first, always
    assert result.status == "interrupted" and result.exit_code == 4, result.error
    assert "forced by a second signal" in (result.error or "")
    assert "left docker.container stack-c1: run `streamchaos rollback" in (result.error or "")
    lines = [json.loads(line) for line in (tmp_path / "run" / "journal.jsonl").read_text().splitlines()]
    (forced,) = [body for body in lines if body.get("topic") == "forced_exit"]
    assert forced["data"]["resources_left"] == ["docker.container stack-c1"]
    assert forced["data"]["faults_not_reverted"] == []
    assert lines[-1]["type"] == "end" and lines[-1]["status"] == "interrupted"


def test_one_signal_in_teardown_is_noted_and_does_not_cut_it(tmp_path: Path) -> None:
    runner = _runner(tmp_path / "run")

    async def slow_step() -> None:
        await asyncio.sleep(0.5)

    async def bring_up(resources: contextlib.AsyncExitStack) -> Any:
        resources.push_async_callback(slow_step)
        return None

    async def drive(ctx: Any) -> None:
        return None  # the run's work done: its teardown is what the signal meets

    runner._bring_up = bring_up  # type: ignore[method-assign]  # the test stands in for the bring-up
    runner._drive = drive  # type: ignore[method-assign]  # and for the phases

    async def main() -> Any:
        run = asyncio.create_task(runner.run())
        while not runner.cleaning:
            await asyncio.sleep(0.01)
        runner.interrupt("SIGTERM")
        return await asyncio.wait_for(run, 10)

    result = asyncio.run(main())
    assert runner.forced is None and result.status == "completed", result.error  # noted, not acted on


def test_a_forced_exit_cuts_every_hung_step_even_past_the_grace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three teardown steps that never end, the grace enough for one: the others are cut too before the
    run returns. Before, the run returned with them pending, and asyncio.run's shutdown cancelled the
    teardown once and then waited forever on the next hung step."""
    import chaos.execution.runner as runner_module

    monkeypatch.setattr(runner_module, "FORCE_GRACE_S", 1.0)
    runner = _runner(tmp_path / "run")
    steps: list[str] = []
    release = asyncio.Event()  # only so that a run left with hung steps (before) still ends here

    def hung(name: str) -> Any:
        async def step() -> None:
            steps.append(f"{name} began")
            try:
                await release.wait()
                steps.append(f"{name} released")
            except asyncio.CancelledError:
                steps.append(f"{name} cut")
                raise

        return step

    async def bring_up(resources: contextlib.AsyncExitStack) -> Any:
        for name in ("c", "b", "a"):  # exits run newest first: a, b, c
            resources.push_async_callback(hung(name))
        return None

    async def drive(ctx: Any) -> None:
        return None  # the run's work done: its teardown is what the signals meet

    runner._bring_up = bring_up  # type: ignore[method-assign]  # the test stands in for the bring-up
    runner._drive = drive  # type: ignore[method-assign]  # and for the phases

    async def main() -> tuple[Any, list[str]]:
        run = asyncio.create_task(runner.run())
        try:
            while "a began" not in steps:
                await asyncio.sleep(0.01)
            runner.interrupt("SIGTERM")
            runner.interrupt("SIGTERM")
            result = await asyncio.wait_for(run, 10)
            return result, list(steps)  # as the run left them when it returned
        finally:
            release.set()

    started = time.monotonic()
    result, at_return = asyncio.run(main())
    assert at_return == ["a began", "a cut", "b began", "b cut", "c began", "c cut"]
    assert time.monotonic() - started < 4.0
    assert result.status == "interrupted" and "forced by a second signal" in (result.error or "")
