"""The HTTP/2 load client (chaos.load.http2) under chaos.load.client, against a real h2 server on loopback
(tests/load/h2_server.py: h2c, or TLS with ALPN), asserting on what the server itself observed; and the
connection fields every record carries, HTTP/1.1's included."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from h2.errors import ErrorCodes

from chaos.host.certs import CertPair, make_local_certs
from chaos.host.tls import server_context, trust
from chaos.load.client import stream_request
from chaos.load.http1 import H1Client
from chaos.load.http2 import H2Client, negotiate
from chaos.load.limits import HEAD_FIELDS
from chaos.load.mock import ThreadedMockServer
from chaos.model.context import ClientPlan
from chaos.model.observations import StreamRecord
from tests.load.h2_server import H2TestServer

pytestmark = [pytest.mark.timeout(30)]  # async tests run as asyncio ones (asyncio_mode auto)


def body(**knobs: Any) -> dict[str, Any]:
    return {"stream": True, "h2test": knobs}


async def fetch(http: Any, url: str, rid: str, plan: ClientPlan | None = None, **knobs: Any) -> StreamRecord:
    return await stream_request(http, url, body(**knobs), StreamRecord(id=rid, phase="p"), plan=plan,
                                request_timeout=10, headers={"X-Request-Id": rid})


async def until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``predicate`` every 10 ms, for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


@pytest.fixture
def certs(tmp_path: Path) -> CertPair:
    pair = make_local_certs(tmp_path / "tls")
    trust(pair.ca)
    return pair


async def test_fifty_streams_share_one_connection() -> None:
    server = H2TestServer(events=5, interval_s=0.01)
    async with server as url:
        async with H2Client(64, streams_per_connection=64) as http:
            recs = await asyncio.gather(*(fetch(http, url, f"r{i}") for i in range(50)))
            assert http.connects == 1
    assert all(r.complete and r.error is None for r in recs), [r.error for r in recs if not r.complete]
    assert {r.protocol for r in recs} == {"h2"} and {r.connection for r in recs} == {"c1"}
    assert len({r.stream_id for r in recs}) == 50
    assert len(server.conns) == 1 and server.conns[0].max_open > 1  # they were in flight together
    for rec in recs:
        [seen] = server.by_request(rec.id)
        assert rec.stream_id == seen.stream_id
        assert rec.read_count == seen.data_frames == 7  # one read per DATA frame: 5 events, the finish, [DONE]
        # each content event is stamped by the read that carried its frame, never before the server sent it
        assert all(t >= sent for t, sent in zip(rec.t_content, seen.sends, strict=False))
        assert rec.t_sent is not None and rec.t_request is not None and rec.t_sent <= rec.t_request
    first = [r for r in recs if not r.reused]
    assert first and all(r.t_connected is not None and r.t_tls is None for r in first)


async def test_tls_with_alpn_h2_and_a_server_that_offers_only_http11(certs: CertPair,
                                                                     mock_server: ThreadedMockServer) -> None:
    server = H2TestServer(tls=server_context(certs.cert, certs.key, alpn=("h2",)), events=3)
    async with server as url:
        assert await negotiate(url) == "2"
        async with H2Client(4) as http:
            recs = await asyncio.gather(*(fetch(http, url, f"t{i}") for i in range(3)))
            assert http.connects == 1
    for rec in recs:
        assert rec.complete and rec.protocol == "h2" and rec.connection == "c1", rec.error
    first = next(r for r in recs if not r.reused)
    assert first.t_sent is not None and first.t_connected is not None and first.t_tls is not None
    assert first.t_sent <= first.t_connected <= first.t_tls <= (first.t_request or 0)

    h1_only = H2TestServer(tls=server_context(certs.cert, certs.key, alpn=("http/1.1",)))
    async with h1_only as url:
        assert await negotiate(url) == "1.1"
        async with H2Client(1) as http:
            rec = await fetch(http, url, "h1")
    assert rec.error is not None and rec.error.kind == "connect", rec.error
    assert "did not select HTTP/2 by ALPN" in rec.error.message and "HTTP/1.1" in rec.error.message
    assert not h1_only.streams

    assert await negotiate(mock_server.base_url + "/completions") == "1.1"  # http://: no ALPN to ask
    async with H2Client(1, connect_timeout=3) as http:  # h2c prior knowledge to an HTTP/1.1-only server
        rec = await fetch(http, mock_server.base_url + "/completions", "c")
    assert rec.error is not None and rec.error.kind == "connect", rec.error
    assert "does not speak h2c" in rec.error.message, rec.error


async def test_rst_stream_fails_its_stream_and_spares_the_neighbours() -> None:
    server = H2TestServer(events=8, interval_s=0.02)
    async with server as url:
        async with H2Client(8) as http:
            recs = await asyncio.gather(fetch(http, url, "cut", reset_after=3),
                                        *(fetch(http, url, f"n{i}") for i in range(4)))
            assert http.connects == 1
    cut, neighbours = recs[0], recs[1:]
    assert cut.error is not None and cut.error.kind == "read" and cut.error.cause == "reset", cut.error
    assert "RST_STREAM CANCEL" in cut.error.message and cut.text == "abc"
    assert all(r.complete and r.connection == cut.connection for r in neighbours), [r.error for r in neighbours]
    assert server.by_request("cut")[0].reset_code is None  # the server ended it; the client sent no reset back


async def test_a_response_head_past_its_bound_fails_its_stream_only() -> None:
    server = H2TestServer(events=5, interval_s=0.02)
    async with server as url:
        async with H2Client(4) as http:
            big, fine = await asyncio.gather(fetch(http, url, "big", header_fields=HEAD_FIELDS + 1),
                                             fetch(http, url, "fine"))
    assert big.error is not None and big.error.kind == "protocol" and big.error.cause == "header_overflow", big.error
    assert f"{HEAD_FIELDS} header fields" in big.error.message
    assert server.by_request("big")[0].reset_code == ErrorCodes.CANCEL  # a stream error: RST_STREAM, not GOAWAY
    assert fine.complete and fine.connection == big.connection


async def test_goaway_drains_the_connection_and_refused_streams_are_sent_again() -> None:
    server = H2TestServer(events=10, interval_s=0.03, goaway_after=3)
    async with server as url:
        async with H2Client(8) as http:
            first = await asyncio.gather(*(fetch(http, url, f"g{i}") for i in range(4)))
            assert http.connects == 2
            later = await fetch(http, url, "later")
            assert http.connects == 2
    assert all(r.complete and r.error is None for r in [*first, later]), [r.error for r in first]
    goaway = server.conns[0].t_goaway
    assert goaway is not None
    on_first = [s for s in server.streams if s.conn == 0]
    refused = [s for s in on_first if s.ignored]
    served = [s for s in on_first if not s.ignored]
    assert refused and served and len(refused) + len(served) == 4
    records = {r.id: r for r in first}
    for stream in served:  # taken before the GOAWAY: finished on the draining connection after it
        assert records[stream.request_id or ""].connection == "c1"
        assert stream.ended and stream.sends[-1] > goaway
    for stream in refused:  # never processed: sent once more, on the new connection, and completed there
        rec = records[stream.request_id or ""]
        assert rec.connection == "c2" and [s.conn for s in server.by_request(rec.id)] == [0, 1]
        assert rec.t_sent is not None and rec.t_sent < goaway  # its stamps stay those of the first send
    assert later.connection == "c2"


async def test_a_stream_refused_twice_fails_as_refused() -> None:
    server = H2TestServer(refuse_all=True)
    async with server as url:
        async with H2Client(2) as http:
            rec = await fetch(http, url, "twice")
    assert rec.error is not None and rec.error.kind == "connect" and rec.error.cause == "refused", rec.error
    assert "REFUSED_STREAM" in rec.error.message and "twice" in rec.error.message
    assert len(server.by_request("twice")) == 2  # the first send and one retry, no more


async def test_a_lowered_max_concurrent_streams_is_honoured() -> None:
    server = H2TestServer(events=5, interval_s=0.02, lower_streams_to=2)
    async with server as url:
        async with H2Client(16, streams_per_connection=64) as http:
            long = asyncio.create_task(fetch(http, url, "long", events=30))
            assert await until(lambda: bool(server.conns) and server.conns[0].lowered_acked is not None)
            rest = await asyncio.gather(*(fetch(http, url, f"m{i}") for i in range(6)))
            recs = [await long, *rest]
            assert http.connects >= 2  # what the first connection could not take went to others
    assert all(r.complete for r in recs), [r.error for r in recs]
    first = server.conns[0]
    # once the client acknowledged the limit of 2, never more than 2 open there, and 2 reached (the limit used)
    assert first.max_open_after_ack == 2, first
    assert not any(c.violations for c in server.conns), [c.violations for c in server.conns]


async def test_a_server_that_allows_no_stream_fails_each_request_at_once_and_keeps_no_connection() -> None:
    """SETTINGS_MAX_CONCURRENT_STREAMS 0 (stream.h2_max_streams with streams: 0): nothing can be sent, so each
    request fails saying so, after one connection that is closed, never left open unlisted (a leak of up to
    4 connections a request, found in review)."""
    server = H2TestServer(max_streams=0)
    async with server as url:
        async with H2Client(4) as http:
            recs = await asyncio.gather(*(fetch(http, url, f"z{i}") for i in range(3)))
            assert not http._open, http._open  # every connection it opened is closed
            assert http.connects <= 3
    for rec in recs:
        assert rec.error is not None and rec.error.kind == "connect"
        assert "SETTINGS_MAX_CONCURRENT_STREAMS 0" in rec.error.message, rec.error


async def _slow_and_neighbour(connection_window: int | None) -> tuple[H2TestServer, StreamRecord, StreamRecord]:
    server = H2TestServer()
    async with server as url:
        async with H2Client(4, connection_window=connection_window) as http:
            slow, neighbour = await asyncio.gather(
                fetch(http, url, "slow", ClientPlan(read_rate_bps=32_000), events=12, event_bytes=8192),
                fetch(http, url, "neighbour", events=40, interval_s=0.02, event_bytes=200))
            assert http.connects == 1
    return server, slow, neighbour


async def test_a_paused_stream_stalls_only_itself() -> None:
    server, slow, neighbour = await _slow_and_neighbour(None)
    assert slow.complete and neighbour.complete, (slow.error, neighbour.error)
    assert slow.connection == neighbour.connection
    [s], [n] = server.by_request("slow"), server.by_request("neighbour")
    # the slow reader withheld WINDOW_UPDATE: the server found the stream's window at 0 and waited
    assert s.blocked and s.unblocked, s
    blocked, reopened = s.blocked[0], s.unblocked[0]
    assert reopened - blocked > 0.5e9
    # meanwhile its neighbour on the same connection streamed on, never blocked
    assert sum(blocked < t < reopened for t in n.sends) >= 10 and not n.blocked
    assert n.sends[-1] < reopened


async def test_a_small_connection_window_lets_a_paused_stream_starve_its_neighbour() -> None:
    """The control of the test above: what the default connection window prevents."""
    server, slow, neighbour = await _slow_and_neighbour(65_535)
    assert slow.complete and neighbour.complete, (slow.error, neighbour.error)
    [n] = server.by_request("neighbour")
    # the connection's window ran out on the slow stream's unread bytes, until its reader caught up
    assert n.blocked and n.unblocked and n.unblocked[0] - n.blocked[0] > 0.5e9, n


async def test_closing_a_stream_sends_rst_stream_cancel() -> None:
    server = H2TestServer(events=50, interval_s=0.02)
    async with server as url:
        async with H2Client(4) as http:
            gone, stayed = await asyncio.gather(fetch(http, url, "gone", ClientPlan(hangup_after_tokens=2)),
                                                fetch(http, url, "stayed", events=10))
            [seen] = server.by_request("gone")
            assert await until(lambda: seen.reset_code is not None, 3.0)
    assert gone.hangup is not None and gone.error is None, gone
    assert seen.reset_code == ErrorCodes.CANCEL and not seen.ended
    assert stayed.complete and stayed.connection == gone.connection


async def test_a_lost_connection_fails_every_open_stream_on_it() -> None:
    server = H2TestServer(events=20, interval_s=0.02)
    async with server as url:
        async with H2Client(4) as http:
            recs = await asyncio.gather(fetch(http, url, "dropper", drop_after=3),
                                        *(fetch(http, url, f"o{i}") for i in range(2)))
    for rec in recs:  # a clean close mid-body, as HTTP/1.1 words it
        assert rec.error is not None and rec.error.kind == "read" and rec.error.cause == "bare_eof", rec.error
        assert rec.connection == "c1"


async def test_closing_the_client_fails_its_streams_and_leaves_nothing_running() -> None:
    server = H2TestServer(events=50, interval_s=0.02)
    async with server as url:
        http = H2Client(4)
        tasks = [asyncio.create_task(fetch(http, url, f"a{i}")) for i in range(2)]
        assert await until(lambda: len(server.streams) == 2 and all(s.data_frames >= 2 for s in server.streams))
        await http.aclose()
        recs = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert await until(lambda: server.conns[0].t_lost is not None, 3.0)  # GOAWAY, then the close
    for rec in recs:
        assert rec.error is not None and rec.error.kind == "read", rec.error
        assert rec.error.message == "the client closed the connection"
    assert http.closed and not http._open and not http._tasks


async def test_a_body_larger_than_the_window_is_sent_as_it_opens_with_the_sdk_headers() -> None:
    server = H2TestServer(events=2)
    prompt = "x" * 200_000  # three times the server's initial stream window of 65,535 bytes
    async with server as url:
        async with H2Client(1, api_key="k") as http:
            rec = await stream_request(http, url, {"stream": True, "prompt": prompt}, StreamRecord(id="big", phase="p"),
                                       request_timeout=10, headers={"X-Request-Id": "big"})
    assert rec.complete, rec.error
    [seen] = server.by_request("big")
    assert len(seen.body) > 200_000 and seen.body.endswith(b'"}')
    names = [name for name, _ in seen.headers]
    assert names[:4] == [":method", ":scheme", ":authority", ":path"]
    fields = dict(seen.headers)
    assert fields[":authority"] == url.split("/")[2] and fields[":path"] == "/v1/completions"
    assert fields["content-length"] == str(len(seen.body)) and fields["content-type"] == "application/json"
    assert fields["authorization"] == "Bearer k" and fields["user-agent"].startswith("OpenAI/Python")
    assert all(name == name.lower() for name in names) and "connection" not in fields


def test_the_client_runs_on_uvloop(certs: CertPair) -> None:
    """The load processes run uvloop (chaos.load.loop): its TLS transport over a connected socket too."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[list[StreamRecord], int]:
        async with H2TestServer(tls=server_context(certs.cert, certs.key, alpn=("h2",)), events=3) as url:
            async with H2Client(8) as http:
                recs = await asyncio.gather(*(fetch(http, url, f"u{i}") for i in range(8)))
                return recs, http.connects

    recs, connects = uvloop.run(main())
    assert connects == 1 and all(r.complete and r.t_tls is not None or r.reused for r in recs)


# ---- the record's connection fields over HTTP/1.1 --------------------------------------------------


@pytest.fixture
async def h1_tls_url(certs: CertPair) -> AsyncIterator[str]:
    """A one-response-per-request HTTP/1.1 server over TLS (ALPN http/1.1), keep-alive."""
    sse = (b'data: {"choices":[{"index":0,"text":"a","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                              if k.lower() == b"content-length")
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             + f"Content-Length: {len(sse)}\r\n\r\n".encode() + sse)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_context(certs.cert, certs.key))
    try:
        yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
    finally:
        server.close()


async def test_http11_records_name_their_connection(mock_server: ThreadedMockServer, h1_tls_url: str) -> None:
    url = mock_server.base_url + "/completions"
    request = {"stream": True, "max_tokens": 2, "mock": {"tick_s": 0.01}}
    async with H1Client(1) as http:
        first = await stream_request(http, url, request, StreamRecord(id="a", phase="p"), request_timeout=10)
        second = await stream_request(http, url, request, StreamRecord(id="b", phase="p"), request_timeout=10)
        assert http.connects == 1
    assert first.complete and second.complete
    for rec in (first, second):
        assert (rec.protocol, rec.connection, rec.stream_id) == ("http/1.1", "c1", None)
    assert first.reused is False and first.t_connected is not None and first.t_tls is None
    assert first.t_sent is not None and first.t_request is not None
    assert first.t_sent <= first.t_connected <= first.t_request <= (first.t_headers or 0)
    assert second.reused is True and second.t_connected is None and (second.t_sent or 0) <= (second.t_request or 0)

    async with H1Client(2) as http:
        tls = await stream_request(http, h1_tls_url, request, StreamRecord(id="s", phase="p"), request_timeout=10)
    assert tls.complete and tls.t_connected is not None and tls.t_tls is not None, tls.error
    assert (tls.t_sent or 0) <= tls.t_connected < tls.t_tls <= (tls.t_request or 0)
