"""Client faults: rules, their seeded draws, and their effect on real streams against a loopback server."""

from __future__ import annotations

import pickle
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.load.mock import ThreadedMockServer
from chaos.model.client_rules import DisconnectRule, SlowReaderRule, TimeoutRule
from chaos.model.context import ClientPlan, ClientPolicy, RunContext, TargetInfo
from chaos.model.observations import StreamRecord
from faults.base import REGISTRY


@pytest.fixture
def server() -> Iterator[ThreadedMockServer]:
    with ThreadedMockServer(tick_s=0.01) as srv:
        yield srv


async def run_one(srv: ThreadedMockServer, plan: ClientPlan, mock: dict[str, Any], *, tokens: int = 50) -> StreamRecord:
    body = {"model": "m", "stream": True, "max_tokens": tokens, "mock": mock}
    async with make_http_client(2) as http:
        rec = await stream_request(http, srv.base_url + "/completions", body, StreamRecord(id="r", phase="p"),
                                   plan=plan, request_timeout=20)
        # a second request on the same client must need a new connection: the first one was closed
        again = await stream_request(http, srv.base_url + "/completions", {"max_tokens": 1, "stream": True},
                                     StreamRecord(id="r2", phase="p"), request_timeout=20)
    assert again.complete
    return rec


def server_saw_disconnect(srv: ThreadedMockServer) -> bool:
    return srv.wait_for(lambda: bool(srv.requests) and srv.requests[0].disconnected, timeout=5)


# ---- effects on real streams -------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_disconnect_after_tokens_closes_the_tcp_connection(server: ThreadedMockServer) -> None:
    plan = DisconnectRule("dc", 1.0, after_tokens=(3, 3)).draw(random.Random(1))
    assert plan is not None
    rec = await run_one(server, plan, {"tick_s": 0.01})
    assert rec.hangup is not None and (rec.hangup.fault, rec.hangup.reason) == ("dc", "after_tokens")
    assert len(rec.t_content) == 3 and rec.error is None and not rec.done_seen
    assert server_saw_disconnect(server)
    assert server.requests[0].tokens_sent < 50
    assert server.server.connections_opened == 2  # the hung-up connection was not reused


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_disconnect_after_time(server: ThreadedMockServer) -> None:
    rec = await run_one(server, ClientPlan(hangup_after_s=0.15, faults=("t",)), {"tick_s": 0.01})
    assert rec.hangup is not None and rec.hangup.reason == "after_time"
    assert rec.hangup.t - rec.t_sent >= 140_000_000  # type: ignore[operator]
    assert 0 < len(rec.t_content) < 50
    assert server_saw_disconnect(server)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_disconnect_while_queued_before_headers(server: ThreadedMockServer) -> None:
    rec = await run_one(server, ClientPlan(hangup_while_queued=True, faults=("q",)), {"headers_delay_s": 0.3})
    assert rec.hangup is not None and rec.hangup.reason == "while_queued"
    assert rec.t_headers is None and rec.t_first_byte is None
    assert server_saw_disconnect(server)
    assert server.requests[0].tokens_sent == 0


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_disconnect_while_queued_after_early_headers(server: ThreadedMockServer) -> None:
    # a server that sends headers at once (Starlette) and the first token only after prefill
    rec = await run_one(server, ClientPlan(hangup_while_queued=True, faults=("q",)), {"first_delay_s": 0.5})
    assert rec.hangup is not None and rec.hangup.reason == "while_queued"
    assert rec.t_headers is not None and rec.t_first_byte is None
    assert server_saw_disconnect(server)
    assert server.requests[0].tokens_sent == 0


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_slow_reader_reads_at_about_the_rate(server: ThreadedMockServer) -> None:
    rate = 40_000.0
    plan = SlowReaderRule("slow", 1.0, read_rate_bps=rate).draw(random.Random(0))
    assert plan is not None
    # 200 characters a token (within the load client's 256 a token content bound), 44,000 in all
    rec = await run_one(server, plan, {"tick_s": 0, "text": "x" * 200}, tokens=220)
    assert rec.complete and rec.bytes_received > 40_000
    elapsed = (rec.t_end - rec.t_first_byte) / 1e9  # type: ignore[operator]
    achieved = rec.bytes_received / elapsed
    assert 0.6 * rate < achieved < 1.2 * rate, achieved
    assert rec.read_count > 20  # consumed in small slices, not one gulp


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_slow_reader_pauses_before_each_read(server: ThreadedMockServer) -> None:
    rec = await run_one(server, ClientPlan(read_delay_s=0.03, faults=("slow",)), {"tick_s": 0}, tokens=5)
    assert rec.complete
    assert (rec.t_end - rec.t_sent) / 1e9 >= 0.9 * 0.03 * rec.read_count  # type: ignore[operator]


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_read_timeout_hangs_up_with_its_reason(server: ThreadedMockServer) -> None:
    plan = TimeoutRule("to", 1.0, timeout_s=0.05).draw(random.Random(0))
    assert plan is not None
    rec = await run_one(server, plan, {"tick_s": 0.4}, tokens=5)
    assert rec.hangup is not None and (rec.hangup.fault, rec.hangup.reason) == ("to", "read_timeout")
    assert rec.error is None and len(rec.t_content) == 1
    assert server_saw_disconnect(server)


# ---- seeded draws ---------------------------------------------------------------------------------


def test_fraction_is_honoured_over_many_draws() -> None:
    rule = DisconnectRule("dc", 0.3, after_tokens=(2, 9))
    plans = [rule.draw(random.Random(f"7:client:0-{n}")) for n in range(4000)]
    picked = [p for p in plans if p is not None]
    assert 0.27 < len(picked) / len(plans) < 0.33
    drawn = {p.hangup_after_tokens for p in picked}
    assert drawn == set(range(2, 10))  # the whole range, ends included
    assert all(p.faults == ("dc",) for p in picked)


def test_draws_replay_with_the_same_seed_and_differ_with_another() -> None:
    policy = ClientPolicy()
    policy.install(DisconnectRule("dc", 0.5, after_tokens=(1, 20)))
    policy.install(SlowReaderRule("slow", 0.5, read_delay_s=0.01))
    first = [policy.plan(random.Random(f"1:client:0-{n}")) for n in range(200)]
    again = [policy.plan(random.Random(f"1:client:0-{n}")) for n in range(200)]
    other = [policy.plan(random.Random(f"2:client:0-{n}")) for n in range(200)]
    assert first == again and first != other
    both = [p for p in first if set(p.faults) == {"dc", "slow"}]
    assert both and all(p.hangup_after_tokens is not None and p.read_delay_s == 0.01 for p in both)


def test_rules_pickle_for_worker_processes() -> None:
    for rule in (DisconnectRule("a", 0.2, after_s=1.0), SlowReaderRule("b", 1.0, read_rate_bps=2000.0),
                 TimeoutRule("c", 0.1, 0.2)):
        assert pickle.loads(pickle.dumps(rule)) == rule


# ---- the Fault kinds ------------------------------------------------------------------------------


def parse(kind: str, raw: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    return REGISTRY[kind].schema.parse(raw)


def test_schemas_parse_units_and_enforce_exactly_one_trigger() -> None:
    values, problems = parse("client.disconnect", {"fraction": "30%", "after_tokens": [2, 5]})
    assert not problems and values["fraction"] == pytest.approx(0.3) and values["after_tokens"] == (2, 5)
    _, problems = parse("client.disconnect", {"after_tokens": 3, "after": "1s"})
    assert any("exactly one" in m for _, m in problems)
    _, problems = parse("client.disconnect", {"fraction": 0.5})
    assert any("exactly one" in m for _, m in problems)
    values, problems = parse("client.slow_reader", {"rate": "2KB/s"})
    assert not problems and values["rate"] == 2000.0
    _, problems = parse("client.timeout", {"fraction": 1.5, "timeout": "200ms"})
    assert problems and problems[0][0] == "fraction"
    _, problems = parse("client.timeout", {})
    assert any("timeout" in m for _, m in problems)


def test_while_queued_false_alone_is_a_problem() -> None:
    values, problems = parse("client.disconnect", {"while_queued": False})
    assert not problems
    fault = REGISTRY["client.disconnect"].from_params("dc", values)
    assert fault.problems(None) and fault.problems(None)[0][0] == "while_queued"


@pytest.mark.asyncio
async def test_inject_installs_the_rule_and_revert_removes_it(tmp_path: Path) -> None:
    env = RunContext(seed=3, target=TargetInfo(kind="openai", base_url="http://127.0.0.1:1/v1"), run_dir=tmp_path)
    seen: list[dict[str, Any]] = []
    env.clients.on_change.append(seen.append)
    values, problems = parse("client.timeout", {"fraction": 1, "timeout": "250ms"})
    assert not problems
    fault = REGISTRY["client.timeout"].from_params("slow-clients", values).activate(env)
    evidence = await fault.inject()
    assert evidence == {"rule": "TimeoutRule", "fault": "slow-clients", "fraction": 1.0, "timeout_s": 0.25}
    assert env.clients.plan(random.Random(0)).read_timeout_s == 0.25
    assert (await fault.revert()) == {"removed": True}
    assert (await fault.revert()) == {"removed": False}  # idempotent
    assert env.clients.plan(random.Random(0)) == ClientPlan()
    assert [sorted(s) for s in seen] == [["slow-clients"], [], []]
