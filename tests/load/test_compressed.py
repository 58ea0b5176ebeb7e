"""The load client sends what the OpenAI Python SDK sends (Accept-Encoding: gzip, deflate among it)
and decodes compressed streams read by read, each read's events keeping that read's stamp; real
loopback servers that compress with zlib as nginx does (a sync flush per forwarded piece)."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import pytest

from chaos.load.client import make_http_client, stream_request
from chaos.load.generator import LoadGenerator
from chaos.load.workload import LoadSettings, LoadTarget
from chaos.model.context import ClientPlan, ClientPolicy
from chaos.model.observations import StreamRecord
from chaos.model.request_ids import run_tag, wire_id
from tests.load.conftest import loopback_server

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

Reply = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


def _event(text: str, finish: str | None = None) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]},
                                  ensure_ascii=False).encode() + b"\n\n"


EVENTS = [_event("a"), _event("b"), _event("c", "stop"), b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _compressor(coding: str) -> zlib._Compress:
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS, "raw-deflate": -zlib.MAX_WBITS}[coding]
    return zlib.compressobj(6, zlib.DEFLATED, wbits)


def server(reply: Reply) -> AbstractAsyncContextManager[str]:
    """A loopback HTTP server: ``reply`` gets each request's head and the connection's writer."""
    return loopback_server(lambda head, _reader, writer: reply(head, writer))


def streamer(coding: str, *, apart_s: float = 0.03, status: int = 200, events: list[bytes] = EVENTS) -> Reply:
    """Each event compressed and sync-flushed in its own chunk, ``apart_s`` apart (as nginx's gzip
    filter sends what an unbuffered upstream flushes)."""
    async def reply(_head: bytes, w: asyncio.StreamWriter) -> None:
        name = "deflate" if coding == "raw-deflate" else coding
        w.write(f"HTTP/1.1 {status} X\r\nContent-Type: text/event-stream\r\nContent-Encoding: {name}\r\n"
                "Server: nginx/1.22.1\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        comp = _compressor(coding)
        for event in events:
            w.write(_chunk(comp.compress(event) + comp.flush(zlib.Z_SYNC_FLUSH)))
            await w.drain()
            await asyncio.sleep(apart_s)
        w.write(_chunk(comp.flush()) + b"0\r\n\r\n")
        await w.drain()
    return reply


async def fetch(url: str, plan: ClientPlan | None = None) -> StreamRecord:
    async with make_http_client(2) as http:
        return await stream_request(http, url, {"stream": True}, StreamRecord(id="g", phase="p"), request_timeout=10,
                                    plan=plan)


async def test_the_default_request_carries_the_openai_python_sdks_headers() -> None:
    heads: list[bytes] = []

    async def reply(head: bytes, w: asyncio.StreamWriter) -> None:
        heads.append(head)
        await streamer("gzip", apart_s=0)(head, w)

    async with server(reply) as url:
        await fetch(url)
    lines = {k.strip().lower(): v.strip()
             for k, _, v in (ln.decode().partition(":") for ln in heads[0].split(b"\r\n")[1:] if ln)}
    assert lines["accept-encoding"] == "gzip, deflate"
    assert lines["accept"] == "application/json"
    assert lines["user-agent"].startswith("OpenAI/Python ")
    assert lines["x-stainless-lang"] == "python" and lines["x-stainless-async"] == "async:asyncio"
    assert lines["content-type"] == "application/json"


@pytest.mark.parametrize("coding", ["gzip", "deflate", "raw-deflate"])
async def test_a_compressed_stream_is_decoded_read_by_read(coding: str) -> None:
    async with server(streamer(coding)) as url:
        rec = await fetch(url)
    assert rec.error is None and rec.complete, rec
    assert rec.text == "abc" and rec.done_seen and rec.finish_reason == "stop"
    assert len(set(rec.t_content)) == 3  # each event decoded from its own read, with that read's stamp
    assert rec.content_encoding == ("deflate" if coding == "raw-deflate" else coding) and rec.server == "nginx/1.22.1"
    assert rec.sse_errors == 0 and rec.utf8_errors == 0


async def test_a_stream_compressed_whole_arrives_as_one_read() -> None:
    """What nginx's gzip filter does to a buffered stream: every event comes with the last read."""
    async def reply(_head: bytes, w: asyncio.StreamWriter) -> None:
        body = gzip.compress(b"".join(EVENTS))
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await w.drain()

    async with server(reply) as url:
        rec = await fetch(url)
    assert rec.complete and rec.text == "abc", rec
    assert len(rec.t_content) == 3 and len(set(rec.t_content)) == 1


async def test_a_paced_reader_decodes_too() -> None:
    async with server(streamer("gzip", apart_s=0.01)) as url:
        rec = await fetch(url, ClientPlan(read_delay_s=0.001))
    assert rec.complete and rec.text == "abc", rec


async def test_a_multibyte_character_split_across_compressed_reads_is_reassembled() -> None:
    event = _event("é漢😀", "stop")
    cut = event.index("漢".encode()) + 1  # inside the 3-byte character
    async with server(streamer("gzip", events=[event[:cut], event[cut:], b"data: [DONE]\n\n"])) as url:
        rec = await fetch(url)
    assert rec.complete and rec.text == "é漢😀" and rec.utf8_errors == 0 and rec.split_chars == 1, rec


async def test_a_corrupt_compressed_body_is_a_protocol_error() -> None:
    async def reply(_head: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(b"this is not gzip at all") + b"0\r\n\r\n")
        await w.drain()

    async with server(reply) as url:
        rec = await fetch(url)
    assert rec.error is not None and rec.error.kind == "protocol" and "gzip" in rec.error.message, rec


async def test_an_encoding_never_announced_is_a_protocol_error() -> None:
    async def reply(_head: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: br\r\n"
                b"Content-Length: 4\r\n\r\nabcd")
        await w.drain()

    async with server(reply) as url:
        rec = await fetch(url)
    assert rec.error is not None and rec.error.kind == "protocol" and "'br'" in rec.error.message, rec


async def test_a_compressed_error_body_gives_its_message() -> None:
    async def reply(_head: bytes, w: asyncio.StreamWriter) -> None:
        body = gzip.compress(json.dumps({"error": {"message": "model overloaded"}}).encode())
        w.write(b"HTTP/1.1 503 Busy\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        await w.drain()

    async with server(reply) as url:
        rec = await fetch(url)
    assert rec.error is not None and rec.error.status == 503 and rec.error.message == "model overloaded", rec


async def test_a_compression_bomb_meets_the_sse_bound_not_the_clients_memory() -> None:
    """64 MiB with no line end, in ~64 KiB of gzip: the stream fails at the 1 MiB line bound."""
    async def reply(_head: bytes, w: asyncio.StreamWriter) -> None:
        comp = _compressor("gzip")
        bomb = comp.compress(b"data: " + b"x" * (64 << 20)) + comp.flush(zlib.Z_SYNC_FLUSH)
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + _chunk(bomb))
        await w.drain()
        await asyncio.sleep(5)  # the client must give up on its own

    async with server(reply) as url:
        rec = await fetch(url)
    assert rec.error is not None and rec.error.kind == "protocol" and "without a line end" in rec.error.message, rec
    assert rec.sse_errors == 1


async def test_the_load_sends_load_headers_over_the_sdks() -> None:
    heads: list[bytes] = []

    async def reply(head: bytes, w: asyncio.StreamWriter) -> None:
        heads.append(head)
        await streamer("gzip", apart_s=0)(head, w)

    headers = (("accept-encoding", "identity"), ("X-Team", "chaos"), ("X-Stainless-Lang", None))
    spec = LoadSettings(concurrency=1, max_requests=2, max_tokens=(4, 4), request_timeout=10.0, headers=headers)
    records: list[StreamRecord] = []
    async with server(reply) as url:
        gen = LoadGenerator(spec, LoadTarget(url.rsplit("/", 1)[0], "m", 1), policy=ClientPolicy(), sink=records.append)
        await gen.run(time.monotonic_ns() + 5_000_000_000)
        await gen.drain(5)
        await gen.aclose()
    assert len(heads) == 2 and all(r.text == "abc" for r in records), records
    text = heads[0].decode().lower()
    assert "\r\naccept-encoding: identity\r\n" in text and "gzip, deflate" not in text
    assert "\r\nx-team: chaos\r\n" in text and "x-stainless-lang" not in text
    assert f"\r\nx-request-id: {wire_id('0-0', run_tag(1))}\r\n" in text  # its own id, UUID-shaped
    assert "\r\nuser-agent: openai/python " in text
