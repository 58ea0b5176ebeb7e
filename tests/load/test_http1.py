"""The HTTP/1.1 client under the load generator (chaos.load.http1) against real loopback servers:
framing it must accept, responses it must reject, and its limits."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.load.http1 import parse_target
from chaos.load.mock import ThreadedMockServer
from chaos.model.observations import StreamRecord
from tests.load.conftest import loopback_server

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

EVENTS = (b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
          b'data: {"choices":[{"index":0,"text":"b","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')


def raw_server(reply: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
               ) -> AbstractAsyncContextManager[str]:
    """A one-behaviour HTTP server on loopback: ``reply`` gets each connection after its request."""
    return loopback_server(lambda _head, reader, writer: reply(reader, writer))


async def fetch(url: str, **kwargs: object) -> StreamRecord:
    async with make_http_client(2) as http:
        return await stream_request(http, url, {"stream": True}, StreamRecord(id="h", phase="p"),
                                    request_timeout=10, **kwargs)  # type: ignore[arg-type]


async def test_a_body_without_length_or_chunks_ends_with_the_connection() -> None:
    async def reply(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + EVENTS)
        await w.drain()

    async with raw_server(reply) as url:
        rec = await fetch(url)
    assert rec.complete and rec.text == "ab" and rec.error is None, rec


async def test_a_content_length_body_is_framed_by_its_length() -> None:
    async def reply(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                + f"Content-Length: {len(EVENTS)}\r\n\r\n".encode() + EVENTS)
        await w.drain()
        await asyncio.sleep(5)  # keeps the connection open: the length alone ends the response

    async with raw_server(reply) as url:
        rec = await asyncio.wait_for(fetch(url), 4)
    assert rec.complete and rec.text == "ab", rec


async def test_a_malformed_status_line_is_a_protocol_error() -> None:
    async def reply(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 2x0 Broken\r\n\r\n")
        await w.drain()
        await asyncio.sleep(1)

    async with raw_server(reply) as url:
        rec = await fetch(url)
    assert rec.error is not None and rec.error.kind == "protocol", rec.error
    assert "malformed HTTP response" in rec.error.message


async def test_a_server_that_hangs_up_without_answering_is_a_read_error() -> None:
    async def reply(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        return None

    async with raw_server(reply) as url:
        rec = await fetch(url)
    assert rec.error is not None and rec.error.kind == "read" and "without sending a response" in rec.error.message


async def test_urls_and_headers_it_cannot_send_are_clear_errors(mock_server: ThreadedMockServer) -> None:
    rec = await fetch("ftp://127.0.0.1/v1/completions")
    assert rec.error is not None and rec.error.kind == "protocol" and "http:// or https://" in rec.error.message
    rec = await fetch(mock_server.base_url + "/completions", headers={"X-Evil": "a\r\nInjected: 1"})
    assert rec.error is not None and rec.error.kind == "protocol" and "CR, LF" in rec.error.message
    assert not mock_server.requests  # nothing was sent
    target = parse_target("http://[::1]:8000/v1/completions?x=1")
    assert (target.host, target.port, target.host_header, target.path) \
        == ("::1", 8000, "[::1]:8000", "/v1/completions?x=1")


async def test_closing_the_client_fails_its_open_streams(mock_server: ThreadedMockServer) -> None:
    http = make_http_client(2)
    body = {"stream": True, "max_tokens": 100, "mock": {"tick_s": 0.1}}
    task = asyncio.create_task(stream_request(http, mock_server.base_url + "/completions", body,
                                              StreamRecord(id="c", phase="p"), request_timeout=20))
    assert await mock_server.until(lambda: bool(mock_server.requests) and mock_server.requests[0].tokens_sent >= 1)
    await http.aclose()
    rec = await asyncio.wait_for(task, 5)
    assert rec.error is not None and rec.error.kind == "read", rec.error
    assert mock_server.wait_for(lambda: mock_server.requests[0].disconnected)


async def test_requests_beyond_the_limit_wait_for_a_slot(mock_server: ThreadedMockServer) -> None:
    body = {"stream": True, "max_tokens": 5, "mock": {"tick_s": 0.02}}
    async with make_http_client(1) as http:
        recs = await asyncio.gather(*(stream_request(http, mock_server.base_url + "/completions", body,
                                                     StreamRecord(id=f"l{i}", phase="p"), request_timeout=20)
                                      for i in range(3)))
        assert http.connects == 1  # one slot, one connection, taken in turn
    assert all(r.complete for r in recs) and mock_server.server.max_active == 1
    # the wait for the slot is the client's: each t_sent is after the previous stream ended
    ordered = sorted(recs, key=lambda r: r.t_sent or 0)
    assert all((a.t_end or 0) <= (b.t_sent or 0) for a, b in zip(ordered, ordered[1:], strict=False))


async def test_an_idle_connection_is_reused_only_within_the_keepalive_expiry(mock_server: ThreadedMockServer) -> None:
    """Past the expiry the client connects afresh instead of racing the server's own idle timer (which,
    frozen or not, may close the connection as the request arrives: lost unread). The default stays
    below uvicorn's 5 s keep-alive minus a 2 s freeze."""
    from chaos.load.http1 import KEEPALIVE_EXPIRY_S, H1Client

    assert KEEPALIVE_EXPIRY_S + 2.0 < 5.0
    body = {"stream": True, "max_tokens": 2, "mock": {"tick_s": 0.01}}

    async def one(http: H1Client, n: int) -> StreamRecord:
        return await stream_request(http, mock_server.base_url + "/completions", body,
                                    StreamRecord(id=f"k{n}", phase="p"), request_timeout=20)

    http = H1Client(1, keepalive_expiry=0.3)
    try:
        assert (await one(http, 0)).complete
        assert (await one(http, 1)).complete and http.connects == 1  # at once: the same connection
        await asyncio.sleep(0.5)
        assert (await one(http, 2)).complete and http.connects == 2  # idle past the expiry: a new one
    finally:
        await http.aclose()
