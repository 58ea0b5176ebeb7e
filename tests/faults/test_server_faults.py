"""server.timeout and server.stall against a real builtin stack process on loopback."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from chaos.model.context import RunContext, TargetInfo
from chaos.model.errors import FaultUnsupported
from chaos.stack.process import StackProcess
from faults.server import ServerNagle, ServerStall, ServerTimeout

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def stack() -> Iterator[StackProcess]:
    with StackProcess.start("--max-num-seqs", "16") as proc:
        # warmed: a fresh engine's first forward passes are its slowest (one case beside the quick tier
        # had no token 877 ms into the first request), and the timing tests here time what follows
        _stream_events(proc, max_tokens=8)
        yield proc


@pytest.fixture
def env(stack: StackProcess, tmp_path: Path) -> Iterator[RunContext]:
    target = TargetInfo(kind="builtin", base_url=stack.base_url, metrics_url=stack.metrics_url,
                        admin_url=stack.admin_url, admin_token=stack.admin_token)
    yield RunContext(seed=7, target=target, run_dir=tmp_path)
    httpx.delete(stack.admin_url + "/faults", headers=stack.admin_headers, timeout=5)
    _wait_idle(stack)


def _state(stack: StackProcess) -> dict[str, Any]:
    return httpx.get(stack.admin_url + "/state", headers=stack.admin_headers, timeout=5).json()


def _wait_idle(stack: StackProcess, timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while True:
        s = _state(stack)
        if s["num_running"] == 0 and s["num_waiting"] == 0 and s["kv_blocks_held"] == 0:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < timeout, f"stack not idle after {timeout}s: {s}"
        time.sleep(0.01)


def _fault(cls: Any, name: str, raw: dict[str, Any]) -> Any:
    params, problems = cls.schema.parse(raw)
    assert not problems, problems
    fault = cls.from_params(name, params)
    assert fault.problems(None) == []
    return fault


def _stream_events(stack: StackProcess, max_tokens: int = 400,
                   times: list[float] | None = None) -> tuple[list[Any], list[float]]:
    """One streamed completion read over a bare socket: its events and the arrival time of each read
    (appended to ``times`` as they come, when given: a caller can wait for the stream to flow)."""
    body = json.dumps({"model": "tiny", "prompt": "go", "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True}).encode()
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        raw = b""
        times = [] if times is None else times
        while chunk := sock.recv(65536):
            raw += chunk
            if b"data: " in chunk:
                times.append(time.monotonic())
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    text = _dechunk(rest).decode("utf-8")
    events = [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]" for line in text.split("\n\n") if line]
    return events, times


def _dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, body = out + body[:size], body[size + 2:]
    return out


@pytest.mark.parametrize("where", ["engine_step", "detokenize", "send"])
def test_timeout_ends_stream_in_band_and_frees_blocks(stack: StackProcess, env: RunContext, where: str) -> None:
    # 500 ms: tokens flow before it fires even on a loaded box (at 100 ms one run beside the quick tier
    # had no token yet at 140 ms: the first step, its prefill, came late); 1,000 tokens outlast it
    # (400 took 0.50-0.55 s on an idle box: CI once saw the stream end whole before the timeout)
    fault = _fault(ServerTimeout, f"timeout-{where}", {"where": where, "every_n": 1, "after": "500ms"})
    fault = fault.activate(env)
    assert fault.plan() == {"admin_url": stack.admin_url, "fault_name": f"timeout-{where}"}
    evidence = asyncio.run(fault.inject())
    assert evidence["installed"]["spec"]["where"] == where and evidence["installed"]["spec"]["every_n"] == 1

    events, _ = _stream_events(stack, max_tokens=1000)
    assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
    error = events[-2]["error"]
    assert error["type"] == "TimeoutError" and error["code"] == 504 and where in error["message"]
    assert len(events) > 3  # tokens flowed for ~500ms before the timeout fired
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-2])
    assert _wait_idle(stack) < 1.0
    state = _state(stack)
    assert state["leaks_total"] == 0 and state["kv_blocks_held"] == 0

    reverted = asyncio.run(fault.revert())
    assert reverted["removed"] is True and reverted["last_seen"]["fired"] >= 1
    events, _ = _stream_events(stack, max_tokens=20)
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert asyncio.run(fault.revert())["removed"] is False  # idempotent


def test_timeout_non_streaming_is_5xx_json(stack: StackProcess, env: RunContext) -> None:
    fault = _fault(ServerTimeout, "nonstream", {"where": "send", "every_n": 1})
    fault = fault.activate(env)
    asyncio.run(fault.inject())
    r = httpx.post(stack.base_url + "/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 5}, timeout=10)
    assert r.status_code == 504 and r.json()["error"]["type"] == "TimeoutError"
    asyncio.run(fault.revert())


def test_timeout_fraction_hits_some_requests(stack: StackProcess, env: RunContext) -> None:
    fault = _fault(ServerTimeout, "half", {"where": "engine_step", "fraction": 0.5})
    fault = fault.activate(env)
    asyncio.run(fault.inject())
    statuses = [httpx.post(stack.base_url + "/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 3},
                           timeout=10).status_code
                for _ in range(16)]
    assert 0 < statuses.count(504) < 16 and statuses.count(504) + statuses.count(200) == 16
    listed = asyncio.run(fault.revert())["last_seen"]
    assert listed["requests_matched"] == statuses.count(504)


def test_rollback_deletes_the_hook_fault(stack: StackProcess, env: RunContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMCHAOS_ADMIN_TOKEN", stack.admin_token)  # rollback reads it there
    fault = _fault(ServerTimeout, "orphan", {"where": "send", "every_n": 2})
    fault = fault.activate(env)
    undo = fault.plan()
    asyncio.run(fault.inject())
    assert ServerTimeout.rollback(undo) == {"removed": True}
    assert httpx.get(stack.admin_url + "/faults", headers=stack.admin_headers, timeout=5).json()["faults"] == {}
    assert ServerTimeout.rollback(undo) == {"removed": False}
    gone = ServerTimeout.rollback({"admin_url": "http://127.0.0.1:9/admin", "fault_name": "x"})
    assert "gone" in gone["skipped"]


def test_check_refuses_targets_without_admin_api(tmp_path: Path) -> None:
    env = RunContext(seed=0, target=TargetInfo(kind="openai", base_url="http://127.0.0.1:1/v1"), run_dir=tmp_path)
    with pytest.raises(FaultUnsupported, match="admin API.*'openai'.*builtin"):
        _fault(ServerTimeout, "t", {"where": "send", "fraction": 1}).activate(env)
    with pytest.raises(FaultUnsupported, match="network.latency"):
        _fault(ServerStall, "s", {"where": "engine", "duration": "100ms", "every": "1s"}).activate(env)


def test_stall_schema_problems() -> None:
    params, problems = ServerStall.schema.parse({"where": "event_loop", "duration": "1s", "every": "500ms"})
    assert not problems
    assert ServerStall.from_params("s", params).problems(None)[0][0] == "every"
    _, problems = ServerTimeout.schema.parse({"where": "send"})
    assert any("exactly one of fraction, every_n" in m for _, m in problems)


@pytest.mark.parametrize("where", ["event_loop", "engine"])
def test_stall_makes_a_gap_in_token_arrival(stack: StackProcess, env: RunContext, where: str) -> None:
    stall = 0.4
    fault = _fault(ServerStall, f"stall-{where}",
                   {"where": where, "duration": f"{stall}s", "every": "30s"}).activate(env)
    result: dict[str, Any] = {}

    async def go() -> None:
        loop = asyncio.get_running_loop()
        arrived: list[float] = []
        reader = loop.run_in_executor(None, _stream_events, stack, 600, arrived)
        for _ in range(200):  # until the stream is flowing (a few events read; bounded: 10 s)
            if len(arrived) >= 3:
                break
            await asyncio.sleep(0.05)
        result["evidence"] = await fault.inject()
        result["events"], result["times"] = await reader
        result["reverted"] = await fault.revert()

    asyncio.run(go())
    times = result["times"]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert result["events"][-1] == "[DONE]" and "error" not in result["events"][-2]  # a stall is not an error
    assert stall * 0.75 <= max(gaps) <= stall * 4, f"longest gap {max(gaps):.3f}s, stall {stall}s"
    assert result["reverted"]["last_seen"]["stalls"] == 1
    assert not _state(stack)["engine_paused"]


# ---- server.nagle ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_nagle_inject_turns_nodelay_off_on_live_connections_and_revert_restores(stack: StackProcess,
                                                                                      env: RunContext) -> None:
    fault = _fault(ServerNagle, "nagle", {}).activate(env)
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as live:
        live.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert live.recv(4096).startswith(b"HTTP/1.1 200")
        injected = await fault.inject()
        assert injected["installed"]["spec"]["type"] == "nagle"
        # the live connection and the admin client's own: every one read back with Nagle on
        assert injected["connections_nagle_on"] == injected["connections_open"] >= 2, injected
        with socket.create_connection((host, int(port)), timeout=15) as new:  # accepted while the fault is in force
            new.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert new.recv(4096).startswith(b"HTTP/1.1 200")
            state = _state(stack)
        assert state["connections"]["nagle_wanted"] is True, state
        assert state["connections"]["nodelay_on"] == 0 and state["connections"]["open"] >= 3, state
        reverted = await fault.revert()
        assert reverted["removed"] is True
        assert reverted["after"]["nagle_on"] == 0 and reverted["after"]["nodelay_on"] == reverted["after"]["open"] >= 2
    assert (await fault.revert())["removed"] is False  # idempotent


def test_nagle_on_another_target_is_unsupported(tmp_path: Path) -> None:
    env = RunContext(seed=1, target=TargetInfo(kind="openai", base_url="http://127.0.0.1:1/v1"), run_dir=tmp_path)
    with pytest.raises(FaultUnsupported, match="admin API"):
        _fault(ServerNagle, "n", {}).activate(env)
    _params, problems = ServerNagle.schema.parse({"delay": "1ms"})
    assert problems and "unknown key" in problems[0][1]
