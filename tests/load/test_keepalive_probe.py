"""The keep-alive probe (chaos.load.keepalive) against real servers on loopback: one that keeps its
connections after a streamed response, and one that closes them unannounced as llama-server does."""

from __future__ import annotations

import pytest

from chaos.load.keepalive import KeepAliveFinding, keep_alive_reuse, probe_keep_alive
from chaos.load.mock import MockSSEServer

BODY = {"model": "mock", "prompt": "hi", "max_tokens": 2, "stream": True}


@pytest.mark.parametrize("closes", [False, True])
async def test_the_probe_tells_a_server_that_closes_after_streams(closes: bool) -> None:
    server = MockSSEServer(closes_after_stream=closes)
    await server.start()
    try:
        finding = await probe_keep_alive(f"{server.base_url}/completions", BODY)
    finally:
        await server.stop()
    assert finding is not None
    assert finding.closes_after_stream is closes, finding
    assert server.connections_opened == 1
    if closes:
        assert "without Connection: close" in finding.detail, finding.detail


async def test_a_probe_that_gets_no_answer_decides_nothing_and_says_why() -> None:
    server = MockSSEServer(uuid_request_ids=True)
    await server.start()
    try:  # refused (400): the connection's fate after a stream cannot be seen
        finding = await probe_keep_alive(f"{server.base_url}/completions", BODY, headers={"X-Request-Id": "0-0"})
    finally:
        await server.stop()
    assert finding.decided is False and "HTTP 400" in finding.detail, finding
    assert keep_alive_reuse("auto", finding) is True  # nothing learned: reuse, and count what is lost


def test_what_the_load_does_with_the_finding() -> None:
    closes = KeepAliveFinding(True, "keep-alive: timeout=5, max=100", "closed")
    keeps = KeepAliveFinding(False, "none", "kept")
    assert keep_alive_reuse("auto", closes) is False
    assert keep_alive_reuse("auto", keeps) is True
    assert keep_alive_reuse("auto", None) is True  # nothing learned: reuse, and count what is lost
    assert keep_alive_reuse("on", closes) is True
    assert keep_alive_reuse("off", keeps) is False
