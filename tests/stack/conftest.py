"""Fixtures for the builtin stack's tests: real ``python -m chaos.stack`` processes on loopback.

Helpers are handed out as fixtures (``sse``, ``admin``) so test modules never import this file.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from chaos.stack.process import StackProcess

# A context long enough for a prefill that lasts a few hundred milliseconds on the tiny model.
GENERAL_ARGS = ("--max-model-len", "4096", "--max-num-batched-tokens", "4096", "--kv-blocks", "1024",
                "--max-num-seqs", "8")


@pytest.fixture(scope="session")
def stack() -> Iterator[StackProcess]:
    with StackProcess.start(*GENERAL_ARGS) as proc:
        yield proc


@pytest.fixture(scope="session")
def queue_stack() -> Iterator[StackProcess]:
    """One sequence at a time, so a second request queues."""
    with StackProcess.start("--max-num-seqs", "1") as proc:
        yield proc


def parse_sse_strict(raw: bytes) -> list[Any]:
    """Every event one ``data: `` line of JSON, blank-line separated, ``[DONE]`` last then EOF."""
    text = raw.decode("utf-8")  # strict: a split multibyte character would raise here
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-80:]!r}"
    events: list[Any] = []
    for block in text[:-2].split("\n\n"):
        assert "\n" not in block and "\r" not in block, f"event spans lines: {block!r}"
        assert block.startswith("data: "), f"event is not a data line: {block!r}"
        payload = block[len("data: "):]
        events.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
    assert events and events[-1] == "[DONE]" and events.count("[DONE]") == 1, "exactly one [DONE], last"
    return events[:-1]


def check_stream(events: list[Any], *, chat: bool, include_usage: bool) -> tuple[str, str]:
    """Validate an OpenAI chunk sequence; return ``(text, finish_reason)``."""
    assert events, "no chunks before [DONE]"
    assert all("error" not in e for e in events), f"in-band error: {events}"
    first = events[0]
    assert first["id"].startswith("chatcmpl-" if chat else "cmpl-")
    obj = "chat.completion.chunk" if chat else "text_completion"
    for e in events:
        assert (e["id"], e["created"], e["model"], e["object"]) == (first["id"], first["created"], first["model"], obj)
    body = events[:-1] if include_usage else events
    if include_usage:
        usage = events[-1]
        assert usage["choices"] == [] and set(usage["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    finishes = [c["choices"][0]["finish_reason"] for c in body]
    assert finishes[-1] is not None and all(f is None for f in finishes[:-1]), finishes
    assert all(len(c["choices"]) == 1 and c["choices"][0]["index"] == 0 for c in body)
    if chat:
        assert body[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all("role" not in c["choices"][0]["delta"] for c in body[1:])
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in body)
    else:
        text = "".join(c["choices"][0]["text"] for c in body)
    return text, finishes[-1]


class Admin:
    """Synchronous reads of a stack's admin API, plus the bounded waits the tests need."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"}

    def state(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/admin/state", headers=self.headers, timeout=5).json()

    def requests(self) -> list[dict[str, Any]]:
        return httpx.get(f"{self.url}/admin/requests", headers=self.headers, timeout=5).json()["requests"]

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """Any admin request with the token (``path`` below ``/admin``)."""
        return httpx.request(method, f"{self.url}/admin{path}", headers=self.headers, timeout=5, **kwargs)

    def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> float:
        """Seconds until ``pred(state)`` held; fails the test after ``timeout`` (a hang guard)."""
        t0 = time.monotonic()
        while True:
            state = self.state()
            if pred(state):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                pytest.fail(f"state did not reach the condition within {timeout}s: {state}")
            time.sleep(0.01)

    def decoding(self, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until exactly one request is live and has produced a token; return it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = self.requests()
            if len(live) == 1 and live[0]["completion_tokens"] > 0:
                return live[0]
            time.sleep(0.01)
        pytest.fail(f"no single decoding request within {timeout}s: {self.requests()}")

    def wait_idle(self, timeout: float = 5.0) -> float:
        return self.wait(lambda s: s["num_running"] == 0 and s["num_waiting"] == 0 and s["kv_blocks_held"] == 0,
                         timeout)


def open_raw_stream(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST over a bare socket and return it unread, so the test decides when to hang up."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    head = (f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    sock.sendall(head + payload)
    return sock


@pytest.fixture
def sse() -> Any:
    class _Sse:
        parse = staticmethod(parse_sse_strict)
        check = staticmethod(check_stream)
        open_raw = staticmethod(open_raw_stream)

    return _Sse


@pytest.fixture
def admin(stack: StackProcess) -> Iterator[Admin]:
    a = Admin(stack.url, stack.admin_token)
    yield a
    a.call("DELETE", "/faults")
    a.call("DELETE", "/kv/reserve")
    a.wait_idle()  # every test leaves the shared stack idle and clean


@pytest.fixture
def queue_admin(queue_stack: StackProcess) -> Iterator[Admin]:
    a = Admin(queue_stack.url, queue_stack.admin_token)
    yield a
    a.wait_idle()


@pytest.fixture
def admin_for() -> Any:
    """``admin_for(stack)``: an ``Admin`` for a stack the test started itself."""
    return lambda proc: Admin(proc.url, proc.admin_token)
