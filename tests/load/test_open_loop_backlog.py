"""Open-loop arrivals beyond the in-flight cap wait as scheduled times in a bounded queue, not as one
asyncio task each: against a server that stalls, the generator's task count stays bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from chaos.load import generator as generator_module
from chaos.load.generator import LoadGenerator
from chaos.load.mock import ThreadedMockServer
from chaos.load.workload import LoadSettings, LoadTarget
from chaos.model.context import ClientPolicy
from chaos.model.observations import StreamRecord

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]
S = 1_000_000_000


async def run_against_a_stall(server: ThreadedMockServer, spec: LoadSettings,
                              seconds: float) -> tuple[LoadGenerator, list[StreamRecord], int]:
    """Drive ``spec`` for ``seconds`` while every response stalls; the most tasks seen on the loop."""
    server.server.tick_s = 30.0  # each stream sends one token, then nothing for the rest of the test
    records: list[StreamRecord] = []
    gen = LoadGenerator(spec, LoadTarget(server.base_url, "m", 2), policy=ClientPolicy(), sink=records.append)
    most = 0

    async def census() -> None:
        nonlocal most
        while True:
            most = max(most, len(asyncio.all_tasks()))
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(census())
    try:
        await gen.run(time.monotonic_ns() + int(seconds * S))
        most = max(most, len(asyncio.all_tasks()))
    finally:
        watcher.cancel()
        await gen.drain(0.0)
        await gen.aclose()
    return gen, records, most


async def test_queued_arrivals_are_not_tasks(mock_server: ThreadedMockServer,
                                             make_spec: Callable[..., LoadSettings]) -> None:
    # 400 arrivals/s for 1.5 s against a cap of 4 in-flight streams that never end: ~600 arrivals
    # queue client-side. One task per queued arrival (the old _admit) would put ~600 tasks on the loop.
    spec = make_spec(concurrency=4, rate=400.0, max_tokens=(50, 50), request_timeout=30.0)
    gen, records, most = await run_against_a_stall(mock_server, spec, 1.5)
    assert gen.overflows > 300, gen.stats()
    # this test, its watcher, the lag monitor, the run's driver, 4 streams (and pytest's own few)
    assert most <= 4 + 12, most
    # nothing queued was ever sent: the cap never freed; every queued arrival is counted as abandoned
    assert gen.abandoned == gen.overflows
    assert len(records) == 4 and gen.sent == 4


async def test_the_queue_itself_is_bounded(mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(generator_module, "BACKLOG_CAP", 50)
    spec = make_spec(concurrency=2, rate=400.0, max_tokens=(50, 50), request_timeout=30.0)
    gen, _records, _most = await run_against_a_stall(mock_server, spec, 1.0)
    assert gen.overflows > 200
    # those beyond the bound were abandoned at once, the 50 queued at the deadline
    assert gen.abandoned == gen.overflows and gen.sent == 2


async def test_a_freed_slot_goes_to_the_oldest_queued_arrival(mock_server: ThreadedMockServer,
                                                             make_spec: Callable[..., LoadSettings]) -> None:
    records: list[StreamRecord] = []
    spec = make_spec(concurrency=2, rate=60.0, max_tokens=(8, 8))
    mock_server.server.tick_s = 0.02  # 8 tokens ≈ 0.15 s per stream: arrivals queue, then go out in order
    gen = LoadGenerator(spec, LoadTarget(mock_server.base_url, "m", 5), policy=ClientPolicy(), sink=records.append)
    start = time.monotonic_ns()
    await gen.run(start + S)
    await gen.drain(10)
    await gen.aclose()
    assert gen.overflows > 0 and mock_server.server.max_active <= 2
    by_sent = sorted((r for r in records if r.t_sent is not None), key=lambda r: r.t_sent or 0)
    scheduled = [r.t_scheduled for r in by_sent]
    assert scheduled == sorted(scheduled)  # type: ignore[type-var]  # first come, first served
    delays = gen.send_delay_stats()
    assert set(delays) == {""} and delays[""]["samples"] == len(by_sent)
    # the send delay is the client's own lateness, not the wait for a slot (which is hundreds of ms)
    waited = max((r.t_sent or 0) - (r.t_scheduled or 0) for r in by_sent) / 1e6
    assert waited > 100 and delays[""]["p50_ms"] < waited
