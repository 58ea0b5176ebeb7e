"""When the load client keeps a connection for the slot's next request (``chaos.load.http1.may_reuse``),
and how a request lost on a kept connection the server had closed is recorded (``stale_connection``)."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.load.http1 import H1Client, may_reuse
from chaos.model.observations import StreamRecord

pytestmark = pytest.mark.timeout(30)

EVENTS = (b'data: {"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
IN_BAND = (b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
           b'data: {"error":{"message":"engine failed","type":"server_error","code":500}}\n\ndata: [DONE]\n\n')
ERROR = b'{"error":{"message":"injected","type":"server_error","code":500}}'

Answer = Callable[[int, asyncio.StreamWriter], Awaitable[bool]]  # request number -> keep the connection?


def _response(status: str, body: bytes, content_type: bytes = b"text/event-stream") -> bytes:
    return (f"HTTP/1.1 {status}\r\n".encode() + b"Content-Type: " + content_type + b"\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


@asynccontextmanager
async def keepalive_server(answer: Answer) -> AsyncIterator[tuple[str, list[int]]]:
    """A keep-alive HTTP/1.1 server on loopback: each request (numbered across connections) goes to
    ``answer``, which writes the response and says whether to read the next one on that connection.
    Yields the completions URL and the number of connections accepted so far (a one-item list)."""
    count = [0]
    accepted = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                              if k.lower() == b"content-length")
                await reader.readexactly(length)
                n, count[0] = count[0], count[0] + 1
                if not await answer(n, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions", accepted
    finally:
        server.close()


async def _one(http: H1Client, url: str, n: int) -> StreamRecord:
    return await stream_request(http, url, {"stream": True}, StreamRecord(id=f"s{n}", phase="p"), request_timeout=10)


def test_a_connection_is_kept_only_after_a_response_that_ended_clean() -> None:
    assert may_reuse(200, keep_alive=True, complete=True)
    assert may_reuse(204, keep_alive=True, complete=True)
    assert not may_reuse(500, keep_alive=True, complete=True)  # the server may be closing it
    assert not may_reuse(429, keep_alive=True, complete=True)
    assert not may_reuse(404, keep_alive=True, complete=True)
    assert not may_reuse(200, keep_alive=True, complete=True, in_band_error=True)  # an error event
    assert not may_reuse(200, keep_alive=False, complete=True)  # Connection: close
    assert not may_reuse(200, keep_alive=True, complete=False)  # the body did not end where it said
    assert not may_reuse(0, keep_alive=True, complete=False)  # no response at all


@pytest.mark.asyncio
@pytest.mark.parametrize("failure", ["status", "in_band"])
async def test_the_request_after_an_error_goes_on_a_new_connection(failure: str) -> None:
    """The server keeps the connection after its error and answers the next request there too; the
    client opens a new one anyway (a server that fails a request may be closing the connection)."""
    async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
        if n == 0:
            writer.write(_response("500 Internal Server Error", ERROR, b"application/json") if failure == "status"
                         else _response("200 OK", IN_BAND))
        else:
            writer.write(_response("200 OK", EVENTS))
        await writer.drain()
        return True

    async with keepalive_server(answer) as (url, accepted), make_http_client(1) as http:
        first = await _one(http, url, 0)
        assert first.error is not None or first.in_band_error is not None, first
        second, third = await _one(http, url, 1), await _one(http, url, 2)
        assert second.complete and second.error is None and third.complete, (second, third)
        assert http.connects == 2 and accepted[0] == 2  # the error's connection closed; the clean one kept


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["eof", "reset"])
async def test_a_request_lost_on_a_kept_connection_is_charged_to_the_response_before(how: str) -> None:
    """The server answers, then closes the connection as the next request arrives on it, unanswered:
    that request's error says the connection was stale and names the response that left it so."""
    async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
        if n != 1:  # request 1 is lost; the one after it, on a new connection, is answered
            writer.write(_response("200 OK", EVENTS))
            await writer.drain()
            return True
        if how == "reset":  # SO_LINGER 0: the close sends a TCP reset
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        return False

    async with keepalive_server(answer) as (url, _), make_http_client(1) as http:
        first = await _one(http, url, 0)
        lost = await _one(http, url, 1)
        fresh = await _one(http, url, 2)
    assert first.complete and fresh.error is None and http.connects == 2
    assert lost.error is not None and lost.error.kind == "read", lost
    assert lost.error.cause == "stale_connection", lost.error
    assert "previous response was HTTP 200 to request s0" in lost.error.message, lost.error.message


@pytest.mark.asyncio
async def test_a_first_request_closed_unanswered_is_no_stale_connection() -> None:
    async def answer(n: int, writer: asyncio.StreamWriter) -> bool:
        return False

    async with keepalive_server(answer) as (url, _), make_http_client(1) as http:
        lost = await _one(http, url, 0)
    assert lost.error is not None and lost.error.cause == "no_response", lost.error


@pytest.mark.asyncio
async def test_a_call_made_ahead_is_written_at_once_on_a_kept_connection_and_read_by_its_run() -> None:
    """``StreamCall.send_now`` (the open loop's write from its timer's wake-up): with a kept connection idle
    it stamps ``t_sent`` and writes the request bytes made ahead before returning, no await between; its
    ``run()`` then reads the response on that connection. With none idle it takes nothing and ``run()``
    connects as always; a call sent now whose run never starts gives its slot and connection back."""
    from chaos.load.client import StreamCall

    async def answer(_n: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(_response("200 OK", EVENTS))
        await writer.drain()
        return True

    async with keepalive_server(answer) as (url, accepted), make_http_client(1) as http:
        target = http.target(url)
        cold = StreamCall(http, url, {"stream": True}, StreamRecord(id="c", phase="p"), request_timeout=10,
                          payload=http.encode(target, {"stream": True}))
        assert not cold.send_now() and cold.record.t_sent is None  # nothing idle yet: left to run()
        assert (await cold.run()).complete and http.connects == 1
        record = StreamRecord(id="w", phase="p")
        warm = StreamCall(http, url, {"stream": True}, record, request_timeout=10,
                          payload=http.encode(target, {"stream": True}))
        assert warm.send_now() and record.t_sent is not None  # written on the kept connection, synchronously
        assert not http.take_slot()  # the client's one slot is the warm call's
        sent_at = record.t_sent
        assert (await warm.run()).complete and record.t_sent == sent_at and record.text == "a"
        assert http.connects == 1 and accepted[0] == 1
        gone = StreamCall(http, url, {"stream": True}, StreamRecord(id="g", phase="p"), request_timeout=10,
                          payload=http.encode(target, {"stream": True}))
        assert gone.send_now()
        gone.abandon()  # its task was cancelled before its first step
        assert http.take_slot()  # the slot came back
        http.release_slot()
