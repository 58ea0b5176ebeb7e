"""The open loop's pacer: a wait ends at its instant, never before it, on uvloop (the load process's loop)
and on asyncio's own; a cancelled wait leaves nothing armed behind it. How late it ends is measured in
benchmarks/bench_trace_replay.py, not asserted here: ``asyncio.sleep`` on uvloop ended waits up to
1.2 ms *early* (libuv's millisecond timers), which sent a trace's requests before their time."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import pytest
import uvloop

from chaos.load.pacer import Pacer

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"uvloop": uvloop.new_event_loop,
                                                              "asyncio": asyncio.new_event_loop}


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_wait_never_ends_before_its_instant(loop_kind: str) -> None:
    async def waits() -> list[int]:
        pacer = Pacer()
        assert pacer.precise  # Linux: a timerfd
        rng = random.Random(7)
        early = []
        try:
            for _ in range(200):
                due = time.monotonic_ns() + rng.randint(100_000, 2_500_000)  # 0.1-2.5 ms ahead
                await pacer.until(due)
                early.append(due - time.monotonic_ns())
        finally:
            pacer.close()
        return early

    with asyncio.Runner(loop_factory=LOOPS[loop_kind]) as runner:
        early = runner.run(waits())
    assert max(early) <= 0, max(early)  # ns before its instant: none


def test_a_cancelled_wait_leaves_the_next_one_right() -> None:
    async def scenario() -> int:
        pacer = Pacer()
        try:
            task = asyncio.ensure_future(pacer.until(time.monotonic_ns() + 50_000_000))
            await asyncio.sleep(0.005)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            due = time.monotonic_ns() + 2_000_000
            await pacer.until(due)
            await pacer.until(time.monotonic_ns() - 1)  # past: at once
            return time.monotonic_ns() - due
        finally:
            pacer.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) >= 0


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_on_time_runs_from_the_wake_up_before_any_other_ready_callback(loop_kind: str) -> None:
    """What must happen at the instant (the open loop's write) runs in the timer's own callback: a callback
    made ready in the same iteration, and the waiting coroutine, both come after it. Before, the write
    waited a loop iteration and every other ready callback (other streams' reads): 0.3 ms p50 late."""
    async def scenario() -> list[str]:
        pacer, order = Pacer(), []
        loop = asyncio.get_running_loop()
        try:
            due = time.monotonic_ns() + 3_000_000
            # a timer of the loop's own due at the same instant: ready beside the timerfd's wake-up
            loop.call_at(loop.time() + 0.003, order.append, "other")
            await pacer.until(due, on_time=lambda: order.append(f"on_time late={time.monotonic_ns() >= due}"))
            order.append("resumed")
            await pacer.until(time.monotonic_ns() - 1, on_time=lambda: order.append("past: at once"))
            return order
        finally:
            pacer.close()

    with asyncio.Runner(loop_factory=LOOPS[loop_kind]) as runner:
        order = runner.run(scenario())
    assert order.index("on_time late=True") < order.index("resumed"), order
    assert order[-1] == "past: at once", order


def test_an_on_time_that_raises_raises_in_the_waiting_coroutine() -> None:
    async def scenario() -> None:
        pacer = Pacer()
        try:
            await pacer.until(time.monotonic_ns() + 1_000_000, on_time=lambda: 1 / 0)  # type: ignore[func-returns-value]
        finally:
            pacer.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner, pytest.raises(ZeroDivisionError):
        runner.run(scenario())
