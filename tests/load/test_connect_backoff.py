"""Closed-loop clients back off on a connection refused (issue 40, point 3), as real SDKs do: during a
200 s vLLM restart four clients re-sent at once, 53-65 requests a second, and 13,724 instant failures
buried the phase. ``load.connect_backoff`` (the OpenAI SDK's 0.5 s initial, 8 s max, x2, jitter by
default; ``off``: the fixed 50 ms pause of before), reset by any request that connects.

The backoff's waits, pure; a closed loop against a loopback port nobody listens on, then a real
server listening there; behind a gateway or a proxy with nothing behind it (502/503/504, a connection
closed with no response) the same, but not after a 500 (a server fault's share of failures keeps its
load); the setting through the experiment and a shard's wire.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Awaitable, Callable

import pytest

from chaos.experiment import experiment_from_dict
from chaos.load.backoff import DEFAULT_CONNECT_BACKOFF, FIXED_PAUSE_S, ConnectBackoff
from chaos.load.generator import LoadGenerator
from chaos.load.mock import ThreadedMockServer
from chaos.load.wire import settings_from_json, settings_to_json
from chaos.load.workload import LoadSettings, LoadTarget
from chaos.model.context import ClientPolicy
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import StreamRecord
from tests.load.conftest import loopback_server

pytestmark = pytest.mark.timeout(30)
S = 1_000_000_000


def test_the_waits_double_from_initial_to_max_with_jitter_and_reset() -> None:
    backoff = ConnectBackoff(DEFAULT_CONNECT_BACKOFF, random.Random(7))
    waits = [backoff.wait_s() for _ in range(7)]
    for wait, base in zip(waits, (0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0), strict=True):
        assert 0.75 * base <= wait <= base  # cut by up to a quarter, as the OpenAI SDK's jitter
    backoff.reset()
    assert 0.375 <= backoff.wait_s() <= 0.5  # a request that connected: from the initial wait again
    again = ConnectBackoff(DEFAULT_CONNECT_BACKOFF, random.Random(7))
    assert [again.wait_s() for _ in range(7)] == waits  # seeded: a run replays
    off = ConnectBackoff(None, random.Random(7))
    assert [off.wait_s() for _ in range(5)] == [FIXED_PAUSE_S] * 5  # `off`: the fixed pause of before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _refused(records: list[StreamRecord], before: int | None = None) -> list[StreamRecord]:
    return [r for r in records if r.error is not None and r.error.kind == "connect"
            and (before is None or (r.t_sent or r.t_end or 0) < before)]


async def test_a_closed_loop_backs_off_while_nothing_listens_and_resumes_when_a_server_does(
        make_spec: Callable[..., LoadSettings]) -> None:
    port = _free_port()
    records: list[StreamRecord] = []
    spec = make_spec(concurrency=4, connect_backoff=(0.2, 1.0, 2.0))
    gen = LoadGenerator(spec, LoadTarget(f"http://127.0.0.1:{port}/v1", "m", 1), policy=ClientPolicy(),
                        sink=records.append)
    start = time.monotonic_ns()
    run = asyncio.create_task(gen.run(start + 4 * S))
    await asyncio.sleep(1.5)  # nothing listens: each client tries at 0, ~0.2, ~0.6, ~1.4 s
    up = time.monotonic_ns()
    refused_down = len(_refused(records))
    assert 4 <= refused_down <= 4 * 5, refused_down  # before: one every 50 ms, ~120 in 1.5 s
    with ThreadedMockServer(port=port, tick_s=0.005):  # a real server listens there now
        await run
        await gen.drain(5)
    await gen.aclose()
    served = [r for r in records if r.error is None and r.t_sent is not None]
    first = min(r.t_sent for r in served if r.t_sent is not None)
    assert first - up < int(1.5 * S)  # every client wakes within its last wait (at most 1 s)
    assert not [r for r in _refused(records) if (r.t_sent or 0) > first + S // 2]  # reset: no backoff after
    last_second = [r for r in served if r.t_sent is not None and r.t_sent >= start + 3 * S]
    assert len(last_second) >= 4 * 5, len(last_second)  # back at the full closed-loop rate
    stats = gen.stats()
    assert stats["connect_backoffs"] == len(_refused(records)) and stats["connect_backoff_s"] > 0


async def test_off_keeps_the_fixed_pause(make_spec: Callable[..., LoadSettings]) -> None:
    records: list[StreamRecord] = []
    gen = LoadGenerator(make_spec(concurrency=2, connect_backoff=None),
                        LoadTarget(f"http://127.0.0.1:{_free_port()}/v1", "m", 1), policy=ClientPolicy(),
                        sink=records.append)
    await gen.run(time.monotonic_ns() + S)
    await gen.drain(5)
    await gen.aclose()
    assert len(_refused(records)) >= 2 * 8  # one every 50 ms or so per client, as before


def test_the_setting_reaches_the_generator_from_the_experiment_and_over_a_shards_wire() -> None:
    def load(**load: object) -> LoadSettings:
        exp = experiment_from_dict({"name": "b", "load": {"concurrency": 2, **load},
                                    "phases": [{"name": "a", "duration": "1s"}]})
        return LoadSettings.of(exp.load)

    assert load().connect_backoff == DEFAULT_CONNECT_BACKOFF == (0.5, 8.0, 2.0)
    assert load(connect_backoff="off").connect_backoff is None
    assert load(connect_backoff=False).connect_backoff is None  # YAML's `off` reads as false
    custom = load(connect_backoff={"initial": "100ms", "max": "2s", "multiplier": 3})
    assert custom.connect_backoff == (0.1, 2.0, 3.0)
    assert settings_from_json(settings_to_json(custom)) == custom  # a shard gets it as the runner has it
    assert settings_from_json(settings_to_json(load(connect_backoff="off"))).connect_backoff is None
    with pytest.raises(ExperimentInvalid, match=r"load.connect_backoff.max: must be at least initial \(2s\)"):
        load(connect_backoff={"initial": "2s", "max": "1s"})
    with pytest.raises(ExperimentInvalid, match=r"load.connect_backoff.initail: unknown key"):
        load(connect_backoff={"initail": "2s"})


async def _status(code: int, writer: asyncio.StreamWriter) -> None:
    writer.write(f"HTTP/1.1 {code} Nope\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                 "Connection: close\r\n\r\n{}".encode())
    await writer.drain()


async def _no_response(_writer: asyncio.StreamWriter) -> None:
    return None  # accepted, read, closed: nothing sent (Toxiproxy with its upstream down)


async def _closed_loop_against(reply: Callable[[asyncio.StreamWriter], Awaitable[None]],
                               make_spec: Callable[..., LoadSettings]) -> tuple[list[StreamRecord], int]:
    """Four closed-loop clients for 1 s against a server that answers every request with ``reply``."""
    records: list[StreamRecord] = []
    async with loopback_server(lambda _head, _reader, writer: reply(writer)) as url:
        gen = LoadGenerator(make_spec(concurrency=4, connect_backoff=(0.2, 1.0, 2.0)),
                            LoadTarget(url.removesuffix("/completions"), "m", 1), policy=ClientPolicy(),
                            sink=records.append)
        await gen.run(time.monotonic_ns() + S)
        await gen.drain(5)
        await gen.aclose()
    return records, int(gen.stats()["connect_backoffs"])


@pytest.mark.parametrize("reply", [pytest.param(lambda w: _status(503, w), id="503"),
                                   pytest.param(_no_response, id="no_response")])
async def test_a_gateway_with_nothing_behind_it_gets_backed_off_too(
        reply: Callable[[asyncio.StreamWriter], Awaitable[None]], make_spec: Callable[..., LoadSettings]) -> None:
    """nginx answers 502 with its upstream down, a server not taking requests 503, Toxiproxy accepts
    and closes: the outage flooded at full speed there, as only connect errors backed off."""
    records, backoffs = await _closed_loop_against(reply, make_spec)
    # each client at 0, ~0.2, ~0.6 s (less 25% jitter): at most 4 in 1 s, not hundreds
    assert 4 <= len(records) <= 4 * 4, len(records)
    assert all(r.error is not None for r in records) and backoffs == len(records)


async def test_a_500_keeps_the_full_closed_loop_rate(make_spec: Callable[..., LoadSettings]) -> None:
    """A server fault fails a share of requests with 500: the clients send again at once, its load's shape."""
    records, backoffs = await _closed_loop_against(lambda w: _status(500, w), make_spec)
    assert backoffs == 0 and len(records) >= 4 * 8, len(records)
    assert all(r.status == 500 for r in records)
