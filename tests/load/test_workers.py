"""WorkerPool: the generator in two spawned processes, merged into one record stream."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from chaos.load.driver import make_load
from chaos.load.mock import ThreadedMockServer
from chaos.load.workers import WorkerPool
from chaos.load.workload import LoadSettings, LoadTarget, split_evenly
from chaos.model.client_rules import DisconnectRule
from chaos.model.context import ClientPolicy
from chaos.model.observations import StreamRecord

S = 1_000_000_000


def test_split_evenly() -> None:
    assert split_evenly(5, 2) == [3, 2] and split_evenly(4, 4) == [1, 1, 1, 1] and sum(split_evenly(7, 3)) == 7


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_two_workers_merge_records_and_follow_phase_and_rule_changes(
    mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings]
) -> None:
    records: list[StreamRecord] = []
    policy = ClientPolicy()
    spec = make_spec(concurrency=4, workers=2, max_tokens=(4, 4))
    pool = make_load(spec, LoadTarget(mock_server.base_url, "m", 4), policy=policy, sink=records.append)
    assert isinstance(pool, WorkerPool) and pool.count == 2
    try:
        await pool.ready()
        pool.phase = "one"
        await pool.run(time.monotonic_ns() + int(0.6 * S))
        # the runner's order at a phase boundary: phase, then rules, then the next run (one pipe: in order)
        pool.phase = "two"
        policy.install(DisconnectRule("dc", 1.0, after_tokens=(1, 1)))
        await pool.run(time.monotonic_ns() + int(0.6 * S))
        assert await pool.drain(10) == 0
        lag = pool.lag_stats()
    finally:
        await pool.aclose()
    assert mock_server.server.max_active <= 4
    ids = [r.id for r in records]
    assert len(ids) == len(set(ids)) and {i.split("-")[0] for i in ids} == {"0", "1"}
    assert {r.phase for r in records} == {"one", "two"}
    two = [r for r in records if r.phase == "two"]
    assert two and all(r.hangup is not None and r.hangup.fault == "dc" for r in two)
    assert all(r.hangup is None for r in records if r.phase == "one")
    assert lag["samples"] > 0 and set(lag["workers"]) == {0, 1}
    assert all(p.poll() is not None for p in pool._procs)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_no_record_is_lost_when_the_parent_falls_behind(
    mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings]
) -> None:
    # Workers stream records up a pipe; when the parent stops reading, the pipe fills. A worker
    # whose write end was non-blocking (uvloop makes a watched fd so; a duplex pipe shares one fd
    # for both ends) raised BlockingIOError there and dropped records; one pipe per direction
    # keeps the write blocking: the worker waits and nothing is lost.
    import asyncio as aio

    records: list[StreamRecord] = []
    mock_server.server.tick_s = 0.0
    pool = make_load(make_spec(concurrency=8, workers=2, max_tokens=(2, 2)), LoadTarget(mock_server.base_url, "m", 6),
                     policy=ClientPolicy(), sink=records.append)
    assert isinstance(pool, WorkerPool)
    try:
        await pool.ready()
        run = aio.create_task(pool.run(time.monotonic_ns() + int(1.5 * S)))
        await aio.sleep(0.3)
        time.sleep(0.8)  # the parent's loop stalls: nothing reads the pipes while the workers send
        await run
        await pool.drain(10)
        sent = pool.stats()["sent"]
    finally:
        await pool.aclose()
    assert sent > 100
    assert len(records) == sent and len({r.id for r in records}) == sent


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_worker_whose_close_is_not_confirmed_is_named_in_the_stats(
    mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's close reply follows every record it made; one that never comes (here the worker is
    frozen, as a runner that fell hundreds of MB behind would leave it still sending) means records may
    be missing from the journal: the pool's stats (the journal's load_process note) say which worker,
    and the frozen process is still stopped, not left behind."""
    import os
    import signal

    from chaos.load import workers as workers_module

    monkeypatch.setattr(workers_module, "_CLOSE_TIMEOUT_S", 1.0)
    pool = make_load(make_spec(concurrency=2, workers=2, max_tokens=(2, 2)), LoadTarget(mock_server.base_url, "m", 6),
                     policy=ClientPolicy(), sink=lambda record: None)
    assert isinstance(pool, WorkerPool)
    try:
        await pool.ready()
        assert "closed_unconfirmed" not in pool.stats()
        frozen = pool._procs[1]
        assert frozen.pid is not None
        os.kill(frozen.pid, signal.SIGSTOP)
    finally:
        await pool.aclose()
    assert pool.stats()["closed_unconfirmed"] == [1]
    assert all(p.poll() is not None for p in pool._procs)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_workers_report_streams_in_flight_only_when_asked(
    mock_server: ThreadedMockServer, make_spec: Callable[..., LoadSettings]
) -> None:
    """Only a `target_down` halt condition reads the in-flight streams' last bytes: unasked, a worker
    sends no activity report (one woke the runner every tick); asked, each reports them."""
    import asyncio as aio

    mock_server.server.tick_s = 0.2  # long streams: several in flight at every report
    pool = make_load(make_spec(concurrency=4, workers=2, max_tokens=(50, 50)), LoadTarget(mock_server.base_url, "m", 4),
                     policy=ClientPolicy(), sink=lambda r: None)
    assert isinstance(pool, WorkerPool)
    try:
        await pool.ready()
        run = aio.create_task(pool.run(time.monotonic_ns() + int(3.0 * S)))
        await aio.sleep(1.2)  # two report periods and more
        assert pool.last_activity() == [] and pool._activity == {}
        pool.report_activity()
        deadline = time.monotonic() + 10
        while len(pool._activity) < 2 and time.monotonic() < deadline:
            await aio.sleep(0.05)
        stamps = pool.last_activity()
        assert set(pool._activity) == {0, 1} and len(stamps) == 4, pool._activity  # every stream in flight
        assert all(0 <= time.monotonic_ns() - t < 5 * S for t in stamps)
        run.cancel()
        with pytest.raises(aio.CancelledError):
            await run
    finally:
        await pool.aclose()
