"""The load driver against a real loopback server: closed and open loop, bounds, drain, background load."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

import pytest

from chaos.load.generator import LoadGenerator
from chaos.load.mock import ThreadedMockServer
from chaos.load.workload import LoadSettings, LoadTarget
from chaos.model.client_rules import DisconnectRule
from chaos.model.context import ClientPolicy
from chaos.model.observations import StreamRecord

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]
S = 1_000_000_000


def generator(spec: LoadSettings, server: ThreadedMockServer, records: list[StreamRecord],
              policy: ClientPolicy | None = None, seed: int = 1) -> LoadGenerator:
    return LoadGenerator(spec, LoadTarget(server.base_url, "m", seed), policy=policy or ClientPolicy(),
                         sink=records.append)


async def test_closed_loop_keeps_concurrency_in_flight_until_the_deadline(
    mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings]
) -> None:
    records: list[StreamRecord] = []
    gen = generator(make_spec(concurrency=4, max_tokens=(8, 8)), mock_server, records)
    gen.phase = "baseline"
    start = time.monotonic_ns()
    await gen.run(start + int(0.5 * S))
    returned = time.monotonic_ns()
    assert returned - start < 3 * S  # returns at the deadline, not after the streams
    assert await gen.drain(10) == 0
    await gen.aclose()
    assert mock_server.server.max_active == 4
    assert len(records) >= 8 and all(r.complete for r in records)
    assert len({r.id for r in records}) == len(records) and all(r.id.startswith("0-") for r in records)
    assert all(r.phase == "baseline" and r.t_scheduled is None for r in records)
    # no slot claims a stream after the deadline; a stream claimed just before it may stamp t_sent
    # (taken when the request bytes go out) a moment after it, so at most one per slot, shortly after
    deadline = start + int(0.5 * S)
    late = [r for r in records if r.t_sent is not None and r.t_sent >= deadline]
    assert len(late) <= 4, [r.t_sent - deadline for r in late]  # type: ignore[operator]
    assert all(r.t_sent - deadline < int(0.25 * S) for r in late)  # type: ignore[operator]


async def test_closed_loop_stops_at_max_requests(mock_server: ThreadedMockServer,
                                                 make_spec: Callable[..., LoadSettings]) -> None:
    records: list[StreamRecord] = []
    gen = generator(make_spec(concurrency=2, max_requests=5), mock_server, records)
    start = time.monotonic_ns()
    await gen.run(start + 20 * S)
    assert time.monotonic_ns() - start < 10 * S
    await gen.drain(10)
    await gen.aclose()
    assert sorted(r.id for r in records) == [f"0-{n}" for n in range(5)]


async def test_open_loop_follows_the_rate_and_stamps_the_schedule(
    mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings]
) -> None:
    records: list[StreamRecord] = []
    rate = 60.0
    gen = generator(make_spec(concurrency=None, rate=rate, max_tokens=(2, 2)), mock_server, records, seed=3)
    start = time.monotonic_ns()
    await gen.run(start + int(1.5 * S))
    await gen.drain(10)
    await gen.aclose()
    scheduled = sorted(r.t_scheduled for r in records)  # type: ignore[type-var]
    # 90 arrivals expected; a Poisson count has sd ~9.5, so ±35 is a > 3.5 sigma band
    assert 55 <= len(records) <= 125
    gaps = [b - a for a, b in zip(scheduled, scheduled[1:], strict=False)]
    assert statistics.fmean(gaps) / S == pytest.approx(1 / rate, rel=0.35)
    late = sorted((r.t_sent - r.t_scheduled) / 1e6 for r in records)  # type: ignore[operator]
    assert late[0] >= 0 and late[len(late) // 2] < 50  # sent on schedule (ms), queueing kept apart
    assert gen.overflows == 0


async def test_open_loop_never_waits_for_a_slow_server(mock_server: ThreadedMockServer,
                                                       make_spec: Callable[..., LoadSettings]) -> None:
    records: list[StreamRecord] = []
    # an in-flight cap of 2 against 0.3 s streams at 40 req/s: arrivals queue client-side
    spec = make_spec(concurrency=2, rate=40.0, max_tokens=(30, 30))
    gen = generator(spec, mock_server, records)
    mock_server.server.tick_s = 0.01
    start = time.monotonic_ns()
    await gen.run(start + 1 * S)
    await gen.drain(10)
    await gen.aclose()
    assert gen.overflows >= 10
    assert mock_server.server.max_active == 2
    queued = max((r.t_sent - r.t_scheduled) for r in records)  # type: ignore[operator]
    assert queued > 0.2 * S  # the wait is recorded as client-side queueing, not hidden
    assert all(r.t_scheduled < start + S for r in records)  # type: ignore[operator]


async def test_open_loop_stops_at_max_requests(mock_server: ThreadedMockServer,
                                               make_spec: Callable[..., LoadSettings]) -> None:
    records: list[StreamRecord] = []
    gen = generator(make_spec(concurrency=None, rate=200.0, max_requests=7), mock_server, records)
    start = time.monotonic_ns()
    await gen.run(start + 20 * S)
    assert time.monotonic_ns() - start < 10 * S
    await gen.drain(10)
    await gen.aclose()
    assert len(records) == 7


async def test_drain_cancels_what_is_left_and_the_server_sees_it(
    mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings]
) -> None:
    records: list[StreamRecord] = []
    gen = generator(make_spec(concurrency=3, max_tokens=(1000, 1000)), mock_server, records)
    mock_server.server.tick_s = 0.05
    await gen.run(time.monotonic_ns() + int(0.2 * S))
    assert records == []  # in-flight streams keep running after run() returns
    assert await gen.drain(0.2) == 3
    await gen.aclose()
    assert len(records) == 3 and all(r.error is not None and r.error.kind == "cancelled" for r in records)
    assert mock_server.wait_for(lambda: sum(q.disconnected for q in mock_server.requests) == 3)


async def test_phase_is_taken_when_each_request_is_sent(mock_server: ThreadedMockServer,
                                                        make_spec: Callable[..., LoadSettings]) -> None:
    records: list[StreamRecord] = []
    gen = generator(make_spec(concurrency=2), mock_server, records)
    gen.phase = "a"
    task = asyncio.create_task(gen.run(time.monotonic_ns() + int(0.6 * S)))
    await asyncio.sleep(0.3)
    gen.phase = "b"
    await task
    await gen.drain(5)
    await gen.aclose()
    by_phase = {p: [r for r in records if r.phase == p] for p in ("a", "b")}
    assert by_phase["a"] and by_phase["b"]
    assert max(r.t_sent for r in by_phase["a"]) < min(r.t_sent for r in by_phase["b"])  # type: ignore[type-var]


async def test_client_rules_apply_per_request_and_replay(mock_server: ThreadedMockServer,
                                                         make_spec: Callable[..., LoadSettings]) -> None:
    async def one_run() -> dict[str, str | None]:
        records: list[StreamRecord] = []
        policy = ClientPolicy()
        policy.install(DisconnectRule("dc", 0.5, after_tokens=(1, 2)))
        gen = generator(make_spec(concurrency=4, max_requests=24, max_tokens=(6, 6)), mock_server, records, policy,
                        seed=9)
        await gen.run(time.monotonic_ns() + 20 * S)
        await gen.drain(10)
        await gen.aclose()
        return {r.id: (r.hangup.reason if r.hangup else None) for r in records}

    first, second = await one_run(), await one_run()
    assert first == second and len(first) == 24
    hung = sum(v == "after_tokens" for v in first.values())
    assert 4 <= hung <= 20


async def test_background_load_is_marked_and_stopped(mock_server: ThreadedMockServer,
                                                     make_spec: Callable[..., LoadSettings]) -> None:
    records: list[StreamRecord] = []
    gen = generator(make_spec(concurrency=1), mock_server, records)
    mock_server.server.tick_s = 0.02
    # start() waits until each background stream has its first token (bounded), and says how many did
    assert await gen.start("hog", 3, 50, 500, settle_s=30) == 3
    assert await mock_server.until(lambda: mock_server.server.active == 3)
    assert await gen.stop("hog") == 3
    assert await gen.stop("hog") == 0
    await gen.aclose()
    assert len(records) == 3 and all(r.background for r in records)
    assert all(r.hangup is not None and r.hangup.reason == "stopped" and r.error is None for r in records)
    assert mock_server.wait_for(lambda: sum(q.disconnected for q in mock_server.requests) == 3)


async def test_lag_stats_report_the_generator_itself(mock_server: ThreadedMockServer,
                                                     make_spec: Callable[..., LoadSettings]) -> None:
    gen = generator(make_spec(concurrency=1, lag_threshold=10.0), mock_server, [])
    await gen.run(time.monotonic_ns() + int(0.5 * S))
    await gen.drain(5)
    stats = gen.lag_stats()
    await gen.aclose()
    assert set(stats) == {"p50_ms", "p99_ms", "max_ms", "samples", "threshold_ms", "saturated"}
    assert stats["samples"] >= 3 and stats["threshold_ms"] == 10_000.0 and stats["saturated"] is False
    assert 0 <= stats["p50_ms"] <= stats["p99_ms"] <= stats["max_ms"]
