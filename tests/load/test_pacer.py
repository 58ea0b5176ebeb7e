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
