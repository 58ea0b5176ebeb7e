"""A client that hangs up while queued, in prefill or in decode frees its request and KV within 1 s."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)

CLEANUP_BUDGET_S = 1.0
# A hang-up during prefill is honoured when that forward pass ends: it cannot be cut. Unloaded the
# pass takes a few hundred ms; beside the suite and two busy processes it took 1.09 s. A leak still
# shows: the blocks would never come back within wait_idle's 10 s.
PREFILL_CLEANUP_BUDGET_S = 3.0


def _long(stream: bool = True, max_tokens: int = 3000) -> dict[str, Any]:
    return {"model": "tiny", "prompt": "tell me everything", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": stream}


def test_disconnect_during_decode(stack: StackProcess, admin: Any, sse: Any) -> None:
    sock = sse.open_raw(stack.url, "/v1/completions", _long())
    received = b""
    while received.count(b"data: ") < 5:  # the stream is flowing: we are in decode
        received += sock.recv(65536)
    assert admin.state()["kv_blocks_held"] > 0
    sock.close()
    assert admin.wait_idle(timeout=10) < CLEANUP_BUDGET_S


def test_disconnect_during_prefill(stack: StackProcess, admin: Any, sse: Any) -> None:
    # ~1800 prompt tokens take a few hundred ms to prefill on the tiny model (one forward pass). The
    # admin's view may come only after the pass (a CI run once saw the first token already out): such
    # a try proves nothing about prefill, so it is let go and another request tries (three at most)
    body = {"model": "tiny", "prompt": [10 + i % 500 for i in range(1800)], "max_tokens": 50, "stream": True}
    tries: list[list[dict[str, Any]]] = []
    for _ in range(3):
        sock = sse.open_raw(stack.url, "/v1/completions", body)
        seen: list[dict[str, Any]] = []
        while not seen or seen[0]["state"] != "running":
            seen = admin.requests()
        tries.append(seen)
        if seen[0]["completion_tokens"] == 0:
            break
        sock.close()
        admin.wait_idle(timeout=10)
    assert seen[0]["completion_tokens"] == 0 and seen[0]["blocks"] >= 1800 // 16, f"never seen in prefill: {tries}"
    sock.close()
    assert admin.wait_idle(timeout=10) < PREFILL_CLEANUP_BUDGET_S


def test_disconnect_while_queued(queue_stack: StackProcess, queue_admin: Any, sse: Any) -> None:
    running = sse.open_raw(queue_stack.url, "/v1/completions", _long(max_tokens=1000))
    queue_admin.wait(lambda s: s["num_running"] == 1, timeout=10)
    queued = sse.open_raw(queue_stack.url, "/v1/completions", _long(max_tokens=10))
    queue_admin.wait(lambda s: s["num_waiting"] == 1, timeout=10)
    assert [r["state"] for r in queue_admin.requests()].count("waiting") == 1
    queued.close()
    assert queue_admin.wait(lambda s: s["num_waiting"] == 0 and s["server_live_requests"] == 1,
                            timeout=10) < CLEANUP_BUDGET_S
    assert queue_admin.state()["num_running"] == 1  # the other request was not disturbed
    running.close()
    assert queue_admin.wait_idle(timeout=10) < CLEANUP_BUDGET_S


def test_disconnect_non_streaming(stack: StackProcess, admin: Any, sse: Any) -> None:
    sock = sse.open_raw(stack.url, "/v1/completions", _long(stream=False))
    admin.decoding()
    before = admin.state()["generation_tokens_total"]
    sock.close()
    assert admin.wait_idle(timeout=10) < CLEANUP_BUDGET_S
    assert admin.state()["generation_tokens_total"] - before < 2000  # it stopped long before 3000 tokens


def test_stalled_reader_then_disconnect(stack: StackProcess, admin: Any, sse: Any) -> None:
    """A client that never reads fills the socket buffers (send blocks); its hang-up is still seen."""
    sock = sse.open_raw(stack.url, "/v1/completions", _long(max_tokens=3000))
    admin.decoding()
    sock.close()
    assert admin.wait_idle(timeout=10) < CLEANUP_BUDGET_S
