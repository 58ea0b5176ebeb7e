"""A hostile target cannot make one stream unbounded (issue 41, point 4): a real server on loopback, in
its own thread, streams endless tiny events, endless keep-alive comments, huge texts, an endless
response head, too many header fields or endless interim heads; the load client cuts each at its
stated limit (``chaos.load.limits``) as a ``protocol`` error naming the cause, at once, with its loop
never lagging and its memory bounded. And what a record keeps of a target's words stays small and
writable: deep JSON, a lone surrogate, a huge usage object or header value."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from chaos.host.journal_file import JournalFile
from chaos.load.client import make_http_client, stream_request
from chaos.load.limits import HEAD_BYTES, ContentLimits
from chaos.model.observations import StreamRecord, from_json, to_json

pytestmark = [pytest.mark.timeout(20)]  # async tests run under asyncio_mode = "auto"

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"  # no length: the body ends at EOF
TOKEN = b'data: {"choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
TIMEOUT_S = 4.0  # what today's client reads an endless stream for before it gives up

Behaviour = Callable[[socket.socket], None]


def endless(head: bytes, piece: bytes) -> Behaviour:
    """Send ``head``, then ``piece`` 64 KiB at a time until the client goes away."""
    block = piece * max(1, (64 << 10) // len(piece))

    def run(sock: socket.socket) -> None:
        sock.sendall(head)
        while True:
            sock.sendall(block)
    return run


def once(payload: bytes) -> Behaviour:
    def run(sock: socket.socket) -> None:
        sock.sendall(payload)
    return run


@contextmanager
def hostile(behaviour: Behaviour) -> Iterator[str]:
    """A server on 127.0.0.1 in its own thread: reads each request (head and body), then runs
    ``behaviour`` on the socket; its completions URL is yielded."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(int(v) for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                              if k.strip().lower() == b"content-length")
                while len(body) < length:
                    body += conn.recv(65536)
                behaviour(conn)
            except OSError:
                pass  # the client cut the stream: what these servers wait for

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1/completions"
    finally:
        stop.set()
        thread.join(2)
        listener.close()


async def fetch(url: str, max_tokens: int = 16) -> StreamRecord:
    body = {"model": "m", "prompt": "hi", "stream": True, "max_tokens": max_tokens}
    async with make_http_client(1) as http:
        return await stream_request(http, url, body, StreamRecord(id="h", phase="p", max_tokens=max_tokens),
                                    request_timeout=TIMEOUT_S)


class LagProbe:
    """The event loop's worst lateness while it runs: a 5 ms ticker."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.005)
            self.worst = max(self.worst, time.perf_counter() - t - 0.005)

    def __enter__(self) -> LagProbe:
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def overflow(rec: StreamRecord, cause: str) -> str:
    """Assert ``rec`` was cut as a protocol error with ``cause``; its message."""
    assert rec.error is not None and rec.error.kind == "protocol" and rec.error.cause == cause, rec.error
    assert not rec.complete
    return rec.error.message


# ---- the limits -------------------------------------------------------------------------------------------


def test_the_limits_are_multiples_of_max_tokens_with_floors() -> None:
    small, big = ContentLimits.for_tokens(16), ContentLimits.for_tokens(4096)
    assert (small.events, small.body_bytes, small.text_chars) == (128, 2 << 20, 8192)
    assert (big.events, big.body_bytes, big.text_chars) == (16448, (64 << 10) + 4096 * 4096, 4096 + 256 * 4096)
    assert ContentLimits.for_tokens(None) == ContentLimits.for_tokens(0) == ContentLimits.for_tokens(131_072)


async def test_a_legitimate_chatty_stream_is_never_cut() -> None:
    """One token per event with a role event, an empty delta beside every token (three per token is the
    margin), a finish event, a usage event and [DONE]: not cut, every count exact."""
    tokens = 64
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    empty = b'data: {"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}\n\n'
    word = b'data: {"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":64,"total_tokens":67}}\n\n'
    body = role + (empty * 3 + word) * tokens + finish + usage + b"data: [DONE]\n\n"
    with hostile(once(SSE_HEAD + body)) as url:
        rec = await fetch(url, tokens)
    assert rec.error is None and rec.complete, rec.error
    assert rec.events == 4 * tokens + 4 and len(rec.t_content) == tokens and rec.text == " tok" * tokens


# ---- the cuts ---------------------------------------------------------------------------------------------


async def test_endless_tiny_events_are_cut_at_four_times_max_tokens_plus_64() -> None:
    with hostile(endless(SSE_HEAD, TOKEN)) as url, LagProbe() as lag:
        t0 = time.monotonic()
        rec = await fetch(url, 16)
        took = time.monotonic() - t0
    message = overflow(rec, "content_overflow")
    assert "128" in message and "max_tokens 16" in message
    assert rec.events == 129 and len(rec.t_content) == 128 and rec.text == "x" * 128
    assert took < 3.0 and lag.worst < 1.0, (took, lag.worst)


async def test_endless_keepalive_comments_are_cut_at_the_byte_budget() -> None:
    with hostile(endless(SSE_HEAD, b": keep-alive\n")) as url:
        rec = await fetch(url, 16)
    message = overflow(rec, "content_overflow")
    assert rec.events == 0 and (2 << 20) < rec.bytes_received < (3 << 20), rec.bytes_received
    assert "2097152 bytes" in message


async def test_text_past_what_max_tokens_can_carry_is_cut() -> None:
    huge = b'data: {"choices":[{"index":0,"text":"' + b"y" * 3000 + b'"}]}\n\n'
    with hostile(endless(SSE_HEAD, huge)) as url:
        rec = await fetch(url, 16)
    overflow(rec, "content_overflow")
    assert len(rec.text) <= 8192 and rec.text == "y" * 6000 and len(rec.t_content) == 2


async def test_the_byte_budget_counts_what_a_compressed_body_inflates_to() -> None:
    """8 MiB of keep-alive comments gzipped into a few KiB: cut at 2 MiB decoded, not read to the end."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    body = packer.compress(b": keep-alive\n" * ((8 << 20) // 13)) + packer.flush()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n\r\n"
    with hostile(once(head + body)) as url:
        rec = await fetch(url, 16)
    assert "2097152 bytes" in overflow(rec, "content_overflow")
    assert rec.bytes_received < 64 << 10, rec.bytes_received


async def test_four_hostile_streams_keep_the_runner_small() -> None:
    """Four streams at once from a target streaming tiny events as fast as it can, each stream sent
    again as soon as it ends (a closed loop) for a second: the records stay small and the memory the
    client allocated stays within a few MB (today: the first four streams alone grow past 100 MB)."""
    tracemalloc.start()
    try:
        with hostile(endless(SSE_HEAD, TOKEN)) as url:
            deadline = time.monotonic() + 1.0
            records: list[StreamRecord] = []

            async def slot() -> None:
                while time.monotonic() < deadline:
                    records.append(await fetch(url, 16))
            await asyncio.wait_for(asyncio.gather(*(slot() for _ in range(4))), 2 * TIMEOUT_S)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(records) >= 4 and all(r.error is not None and r.error.cause == "content_overflow" for r in records)
    assert max(len(to_json(r)) for r in records) < 8_000
    assert peak < 30 << 20, f"{peak / 1e6:.1f} MB"


# ---- the response head ------------------------------------------------------------------------------------


async def test_an_endless_header_is_cut_at_64_kib_without_lagging_the_loop() -> None:
    with hostile(endless(b"HTTP/1.1 200 OK\r\nX-Endless: ", b"a" * 1024)) as url, LagProbe() as lag:
        t0 = time.monotonic()
        rec = await fetch(url)
        took = time.monotonic() - t0
    assert str(HEAD_BYTES) in overflow(rec, "header_overflow") and rec.status is None
    assert took < 3.0 and lag.worst < 1.0, (took, lag.worst)


async def test_too_many_header_fields_are_cut() -> None:
    fields = b"".join(b"X-F%d: v\r\n" % i for i in range(101))
    with hostile(once(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n" + TOKEN)) as url:
        rec = await fetch(url)
    assert "100 header fields" in overflow(rec, "header_overflow")


async def test_one_read_carrying_a_whole_oversized_head_is_cut() -> None:
    head = b"HTTP/1.1 200 OK\r\nX-Big: " + b"b" * (HEAD_BYTES + 10) + b"\r\n\r\n"
    with hostile(once(head + TOKEN)) as url:
        rec = await fetch(url)
    assert str(HEAD_BYTES) in overflow(rec, "header_overflow") and rec.status is None


async def test_endless_interim_heads_are_cut() -> None:
    with hostile(endless(b"", b"HTTP/1.1 100 Continue\r\n\r\n")) as url, LagProbe() as lag:
        rec = await fetch(url)
    assert str(HEAD_BYTES) in overflow(rec, "header_overflow") and rec.status is None
    assert lag.worst < 1.0, lag.worst


# ---- what a record keeps ----------------------------------------------------------------------------------


async def test_a_targets_words_stay_small_and_writable_in_the_record(tmp_path: Path) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    nested = b'{"a":' * 400 + b"1" + b"}" * 400
    events = [
        b"data: " + deep + b"\n\n",  # a RecursionError in json.loads today: the stream raised out of the client
        b'data: {"choices":[{"index":0,"text":"bad \\ud800 char"}]}\n\n',  # a lone surrogate: no UTF-8 file holds it
        b'data: {"choices":[],"usage":{"completion_tokens":2,"deep":' + nested + b',"junk":"' + b"j" * 50_000
        + b'","prompt_tokens_details":{"cached_tokens":1}}}\n\n',
        b'data: {"error":{"message":"' + b"m" * 100_000 + b'"}}\n\n',
        b'data: {"choices":[{"index":0,"text":"z","finish_reason":"' + b"f" * 10_000 + b'"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nServer: " + b"s" * 50_000 + b"\r\n\r\n"
    with hostile(once(head + b"".join(events))) as url:
        rec = await fetch(url)
    assert rec.error is None, rec.error
    assert rec.json_errors == 1 and rec.text == "bad \ufffd charz"
    assert rec.usage == {"completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}}
    assert rec.in_band_error == "m" * 500 and rec.finish_reason == "f" * 64 and rec.server == "s" * 256
    line = to_json(rec)
    assert len(line) < 4_000
    journal = JournalFile(tmp_path / "j.jsonl", create=True)
    journal.write(line, durable=True)
    journal.close()
    back = from_json(json.loads((tmp_path / "j.jsonl").read_text(encoding="utf-8")))
    assert isinstance(back, StreamRecord) and back.text == rec.text


async def test_an_http_error_message_with_a_lone_surrogate_is_scrubbed_and_the_journal_keeps_writing(
        tmp_path: Path) -> None:
    """A 500 whose JSON error message holds a raw ``\\ud800`` escape: the record says U+FFFD in its place,
    and the journal writes it and every line after it (before: UnicodeEncodeError, and the bad line,
    held, failed every later write of the run, fault revert records included)."""
    body = b'{"error":{"message":"bad \\ud800 thing"}}'
    head = b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    with hostile(once(head % len(body) + body)) as url:
        rec = await fetch(url)
    assert rec.error is not None and rec.error.kind == "http" and rec.error.status == 500, rec.error
    assert rec.error.message == "bad \ufffd thing", rec.error
    journal = JournalFile(tmp_path / "j.jsonl", create=True)
    journal.write(to_json(rec), hold=True)
    journal.write({"type": "fault_revert", "fault": "f"}, durable=True)
    journal.close()
    lines = (tmp_path / "j.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["type"] == "fault_revert", lines
    back = from_json(json.loads(lines[0]))
    assert isinstance(back, StreamRecord) and back.error is not None and back.error.message == "bad \ufffd thing"
