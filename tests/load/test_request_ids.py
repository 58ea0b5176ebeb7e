"""A server that refuses the load's request ids (llama-cpp-python's answers 400 to any X-Request-Id but a
UUID) is found by the preflight, which sends what the load sends, before the run starts; and
``load.headers: {X-Request-Id: null}`` really sends none, from the preflight and from the load (issue 44:
every shipped experiment called such a healthy server dead, 20x HTTP 400, because the per-request header
was added after ``load.headers`` and the preflight sent none)."""

from __future__ import annotations

import time

import pytest

from chaos.execution.preflight import PreflightRefused, preflight
from chaos.load.generator import LoadGenerator
from chaos.load.mock import ThreadedMockServer
from chaos.load.workload import LoadSettings, LoadTarget
from chaos.model.context import ClientPolicy
from chaos.model.engines import PROFILES
from chaos.model.experiment import LoadSpec
from chaos.model.observations import StreamRecord
from chaos.model.request_ids import is_uuid4, record_id_of

pytestmark = pytest.mark.timeout(30)


async def test_the_preflight_sends_a_uuid_shaped_id_that_a_uuid_checking_server_takes() -> None:
    with ThreadedMockServer(uuid_request_ids=True) as server:
        result = await preflight(LoadSpec(max_tokens=(3, 3)), base_url=server.base_url, model="mock", seed=1,
                                 api_key=None, profile=PROFILES["openai"], timeout=5.0)
        (sent,) = [r.id_header for r in server.requests]
    assert result.record.error is None and server.server.refused_ids == []
    assert sent is not None and is_uuid4(sent) and record_id_of(sent) == "preflight", sent


async def test_the_preflight_sends_the_loads_request_id_and_a_server_refusing_it_stops_the_run_there() -> None:
    with ThreadedMockServer(uuid_request_ids=True) as server:
        with pytest.raises(PreflightRefused) as caught:  # the load's old ids: the preflight sends them too
            await preflight(LoadSpec(max_tokens=(3, 3), request_ids="sequence"), base_url=server.base_url,
                            model="mock", seed=1, api_key=None, profile=PROFILES["openai"], timeout=5.0)
        assert server.server.refused_ids == ["preflight"]
    first = str(caught.value).splitlines()[0]
    assert "HTTP 400" in first and "not a UUID" in first, first


async def test_x_request_id_null_sends_none_from_the_preflight_and_the_load() -> None:
    headers = (("X-Request-Id", None),)
    with ThreadedMockServer(uuid_request_ids=True) as server:
        result = await preflight(LoadSpec(max_tokens=(3, 3), headers=headers), base_url=server.base_url,
                                 model="mock", seed=1, api_key=None, profile=PROFILES["openai"], timeout=5.0)
        assert result.record.error is None
        records: list[StreamRecord] = []
        spec = LoadSettings(concurrency=2, max_requests=4, max_tokens=(3, 3), request_timeout=10.0, headers=headers)
        gen = LoadGenerator(spec, LoadTarget(server.base_url, "mock", 1), policy=ClientPolicy(), sink=records.append)
        await gen.run(time.monotonic_ns() + 5_000_000_000)
        await gen.drain(5)
        await gen.aclose()
        seen = list(server.requests)
    assert len(records) == 4 and all(r.error is None for r in records), [r.error for r in records]
    assert server.server.refused_ids == [] and [r.id_header for r in seen] == [None] * 5


async def test_without_null_each_request_carries_its_own_id() -> None:
    with ThreadedMockServer() as server:
        records: list[StreamRecord] = []
        spec = LoadSettings(concurrency=1, max_requests=2, max_tokens=(3, 3), request_timeout=10.0)
        gen = LoadGenerator(spec, LoadTarget(server.base_url, "mock", 1), policy=ClientPolicy(), sink=records.append)
        await gen.run(time.monotonic_ns() + 5_000_000_000)
        await gen.drain(5)
        await gen.aclose()
        sent = sorted(r.id_header or "" for r in server.requests)
    # UUID-shaped by default (load.request_ids: uuid), each standing for its record's id
    assert all(is_uuid4(w) for w in sent) and sorted(map(record_id_of, sent)) == ["0-0", "0-1"], sent

