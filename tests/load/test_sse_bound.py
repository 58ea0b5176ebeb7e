"""An SSE line or event that never ends cannot grow a client's memory without bound: the parser
stops at its bound (1 MiB by default) and the client counts an SSE error and stops reading."""

from __future__ import annotations

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.load.mock import ThreadedMockServer
from chaos.load.sse import DEFAULT_MAX_EVENT_BYTES, SSEOverflow, SSEParser
from chaos.model.observations import StreamRecord

MiB = 1 << 20


def test_an_unterminated_line_stops_at_the_bound_and_keeps_the_events_before_it() -> None:
    parser = SSEParser(max_event_bytes=100)
    assert [e.data for e in parser.feed(b"data: a\n\ndata: ")] == ["a"]
    assert parser.feed(b"x" * 50) == []
    with pytest.raises(SSEOverflow) as caught:
        parser.feed(b"y" * 60)
    assert caught.value.events == []
    parser = SSEParser(max_event_bytes=100)
    with pytest.raises(SSEOverflow) as caught:
        parser.feed(b"data: b\n\n" + b"z" * 200)  # a complete event, then a runaway line in the same read
    assert [e.data for e in caught.value.events] == ["b"]


def test_an_event_of_endless_data_lines_stops_at_the_bound() -> None:
    parser = SSEParser(max_event_bytes=1000)
    with pytest.raises(SSEOverflow):
        for _ in range(100):
            parser.feed(b"data: " + b"x" * 50 + b"\n")  # lines end, the event never does


def test_the_default_bound_is_one_mebibyte_and_events_below_it_pass() -> None:
    assert DEFAULT_MAX_EVENT_BYTES == MiB
    parser = SSEParser()
    big = b"x" * (MiB - 100)
    assert [len(e.data or "") for e in parser.feed(b"data: " + big + b"\n\n")] == [len(big)]
    with pytest.raises(ValueError):
        SSEParser(max_event_bytes=0)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_the_client_counts_an_sse_error_and_hangs_up(mock_server: ThreadedMockServer) -> None:
    # 4 MiB of one line, then normal tokens: a client without a bound reads it all and ends clean
    body = {"model": "m", "stream": True, "max_tokens": 3, "mock": {"long_line": 4 * MiB, "tick_s": 0.01}}
    async with make_http_client(2) as http:
        rec = await stream_request(http, mock_server.base_url + "/completions", body, StreamRecord(id="l", phase="p"),
                                   request_timeout=20)
    assert rec.error is not None and rec.error.kind == "protocol", rec.error
    assert "1048576 bytes" in rec.error.message
    assert rec.sse_errors == 1 and not rec.complete
    assert rec.bytes_received < 3 * MiB  # it stopped reading: the rest never came in
    assert mock_server.wait_for(lambda: bool(mock_server.requests) and mock_server.requests[0].disconnected)


@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_the_bound_is_configurable_per_request(mock_server: ThreadedMockServer) -> None:
    body = {"model": "m", "stream": True, "max_tokens": 2, "mock": {"long_line": 5000}}
    async with make_http_client(2) as http:
        tight = await stream_request(http, mock_server.base_url + "/completions", body, StreamRecord(id="t", phase="p"),
                                     request_timeout=20, max_event_bytes=4096)
        loose = await stream_request(http, mock_server.base_url + "/completions", body, StreamRecord(id="u", phase="p"),
                                     request_timeout=20, max_event_bytes=8192)
    assert tight.error is not None and "4096 bytes" in tight.error.message
    assert loose.error is None  # 5,000 bytes fit: the long line just joins the first event (a JSON error)
