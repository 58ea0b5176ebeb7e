"""Connection limits of the builtin server (issue 11, finding 8): slowloris and idle connections are
closed within their timeouts, the connection cap answers 503 and closes, and a slow *reader* is
still served (the response phase has no deadline on purpose).

Every socket read is bounded by its socket timeout (``HANG_GUARD_S``); on the old server these
connections stayed open for good, so each test fails there at that bound.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(90)

HANG_GUARD_S = 10.0  # far above the 1 s timeouts the stack below runs with; only stops a hang
LIMIT_ARGS = ("--header-timeout", "1s", "--body-timeout", "1s", "--keep-alive-timeout", "1s", "--max-connections", "32")


@pytest.fixture(scope="module")
def short_stack() -> Iterator[StackProcess]:
    with StackProcess.start(*LIMIT_ARGS) as proc:
        yield proc


def _connect(stack: StackProcess) -> socket.socket:
    host, port = stack.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=HANG_GUARD_S)


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; fails the test if it is still open after the guard."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {HANG_GUARD_S:g}s; it sent {data[:200]!r}")
    except ConnectionResetError:
        pass
    return data


def test_a_connection_that_sends_nothing_is_closed(short_stack: StackProcess) -> None:
    with _connect(short_stack) as sock:
        assert _read_until_closed(sock) == b""  # nothing was asked, so nothing is answered


def test_a_partial_header_gets_408_and_is_closed(short_stack: StackProcess) -> None:
    with _connect(short_stack) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # slowloris: the headers never end
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 408


def test_a_short_body_gets_408_and_is_closed(short_stack: StackProcess) -> None:
    with _connect(short_stack) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"model\": \"tiny\"")
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]


def test_an_idle_keep_alive_connection_is_closed(short_stack: StackProcess) -> None:
    with _connect(short_stack) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 200 "), reply[:200]  # answered, then closed once idle


def test_a_slow_reader_is_still_served(short_stack: StackProcess) -> None:
    """The request is in, so no deadline applies while the client takes its time reading the stream."""
    body = json.dumps({"model": "tiny", "prompt": "slow", "max_tokens": 64, "ignore_eos": True,
                       "stream": True}).encode()
    with _connect(short_stack) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(2.5)  # past every timeout of this stack before reading a byte
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 200 ") and b"data: [DONE]" in reply and reply.endswith(b"0\r\n\r\n"), \
        reply[-200:]


def test_the_connection_cap_answers_503_and_closes() -> None:
    with StackProcess.start("--max-connections", "4") as stack:
        held = [_connect(stack) for _ in range(4)]
        try:
            time.sleep(0.2)  # let the server accept all four
            with _connect(stack) as fifth:
                reply = _read_until_closed(fifth)
            assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in reply, reply[:200]
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + HANG_GUARD_S
        while True:  # the freed slots take new connections again
            with _connect(stack) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if _read_until_closed(sock).startswith(b"HTTP/1.1 200 "):
                    break
            assert time.monotonic() < deadline, "the server never took connections again"
            time.sleep(0.05)


def test_the_server_ignores_x_forwarded_for() -> None:
    """uvicorn trusts X-Forwarded-For from 127.0.0.1 unless told not to; the builtin server is."""
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from chaos.stack.guard import DEFAULT_LIMITS
    from chaos.stack.serve import uvicorn_config

    async def app(scope: object, receive: object, send: object) -> None:  # pragma: no cover - never called
        return None

    config = uvicorn_config(app, DEFAULT_LIMITS)
    config.load()
    assert not config.proxy_headers and not isinstance(config.loaded_app, ProxyHeadersMiddleware)
