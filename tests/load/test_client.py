"""One streaming request against a real loopback server: each server behaviour fills the record right."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.load.mock import ThreadedMockServer
from chaos.model.observations import StreamRecord

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]


async def fetch(server: ThreadedMockServer, mock: dict[str, Any] | None = None, *, chat: bool = False,
                tokens: int = 4, request_timeout: float = 10.0, usage: bool = True) -> StreamRecord:
    body: dict[str, Any] = {"model": "m", "stream": True, "max_tokens": tokens}
    if usage:
        body["stream_options"] = {"include_usage": True}
    if mock:
        body["mock"] = mock
    url = server.base_url + ("/chat/completions" if chat else "/completions")
    async with make_http_client(4) as http:
        return await stream_request(http, url, body, StreamRecord(id="t-0", phase="p"), request_timeout=request_timeout)


def assert_ordered(rec: StreamRecord) -> None:
    stamps = [rec.t_sent, rec.t_headers, rec.t_first_byte, rec.t_first_event]
    assert all(s is not None for s in stamps), rec
    assert stamps == sorted(stamps)  # type: ignore[type-var]
    if rec.t_first_content is not None:
        assert rec.t_first_event <= rec.t_first_content == rec.t_content[0]  # type: ignore[operator]
        assert rec.t_content == sorted(rec.t_content)
        assert rec.t_end is not None and rec.t_content[-1] <= rec.t_end


async def test_completions_stream_is_complete_and_stamped(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"text": ["a", "b"]}, tokens=5)
    assert_ordered(rec)
    assert rec.complete and rec.done_seen and rec.finish_reason == "length"
    assert rec.status == 200 and rec.text == "ababa" and len(rec.t_content) == 5
    assert rec.usage == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    assert rec.events == 7  # 5 content + usage + [DONE]
    assert rec.bytes_received > 0 and rec.read_count >= 1
    assert (rec.utf8_errors, rec.json_errors, rec.sse_errors) == (0, 0, 0)


async def test_chat_role_chunk_is_an_event_but_not_content(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"text": "x", "first_delay_s": 0.05}, chat=True, tokens=3)
    assert_ordered(rec)
    assert rec.complete and rec.text == "xxx"
    # the role chunk is an event (first) but not content: role, 3 content, usage, [DONE]
    assert rec.events == 6 and len(rec.t_content) == 3
    # content only after the server's 50 ms prefill delay, counted from the send: a late stamp can only
    # lengthen that (the gap from the role chunk's stamp was 14 ms once, the loop busy when it came)
    assert rec.t_first_content - rec.t_sent >= 50_000_000  # type: ignore[operator]


async def test_missing_done_ends_quietly_as_incomplete(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"drop_done": True})
    assert_ordered(rec)
    assert not rec.done_seen and not rec.complete and rec.error is None
    assert rec.finish_reason == "length" and rec.t_end is not None


async def test_in_band_error_is_recorded(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"error_after": 2}, tokens=5)
    assert rec.in_band_error == "mock in-band error"
    assert rec.done_seen and not rec.complete and len(rec.t_content) == 2


async def test_non_2xx_reads_the_error_body(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"status": 429})
    assert rec.status == 429 and rec.error is not None
    assert (rec.error.kind, rec.error.status, rec.error.message) == ("http", 429, "mock error 429")
    assert rec.t_end is not None and rec.t_first_content is None


async def test_garbage_bytes_and_bad_json_are_counted(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"invalid_utf8_at": 1, "bad_json_at": 2}, tokens=4)
    assert rec.utf8_errors == 1 and rec.json_errors == 1
    assert "\ufffd" in rec.text and rec.done_seen


async def test_multibyte_split_across_writes_is_reassembled(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"text": ["你好", "🧑🏿‍💻"], "split_writes": True}, chat=True, tokens=2, usage=False)
    assert rec.text == "你好🧑🏿‍💻" and rec.complete
    assert rec.utf8_errors == 0
    assert rec.split_chars >= 6  # every multibyte character arrived one byte per chunk
    assert rec.read_count > 50


async def test_framing_variants_parse_the_same(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"crlf": True, "no_space": True, "comments": True, "text": "z"}, tokens=3)
    assert rec.complete and rec.text == "zzz" and rec.sse_errors == 0


async def test_data_after_done_is_a_framing_error(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"data_after_done": True}, tokens=2)
    assert rec.done_seen and rec.sse_errors == 1 and rec.text == "tok tok "


async def test_cut_connection_is_a_read_error(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"close_after": 2, "tick_s": 0.01}, tokens=5)
    assert rec.error is not None and rec.error.kind == "read", rec.error
    assert len(rec.t_content) == 2 and not rec.done_seen and rec.hangup is None


async def test_request_timeout_is_a_timeout_error(mock_server: ThreadedMockServer) -> None:
    rec = await fetch(mock_server, {"tick_s": 0.2}, tokens=20, request_timeout=0.3)
    assert rec.error is not None and rec.error.kind == "timeout"
    assert rec.hangup is None and rec.t_end is not None


async def test_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with make_http_client(1) as http:
        rec = await stream_request(http, f"http://127.0.0.1:{port}/v1/completions", {"stream": True},
                                   StreamRecord(id="x", phase="p"), request_timeout=5)
    assert rec.error is not None and rec.error.kind == "connect"
    assert rec.t_first_byte is None and rec.t_end is not None
