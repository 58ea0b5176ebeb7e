"""Hostile and broken shards against a real coordinator (issue 41, points 2 and 3, and two LOWs).

Each "shard" here is a small asyncio client in the test: it connects to a real ``ShardPool`` on
127.0.0.1, with or without the run's token, and misbehaves — a number JSON cannot hold, nesting
deeper than the protocol, silence after its clock was measured, a record with the wrong field
types, a hello that never ends, a crowd of connections that never say hello. None may hang the
coordinator, kill a reader while the shard stays counted alive, put an ill-typed record in front of
the verifiers, or hold the runner's memory before proving anything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from chaos.load import shard_pool
from chaos.load.shard_pool import UNAUTHENTICATED_MAX, ShardPool, merge_journal_shard
from chaos.load.shard_process import TOKEN_ENV, run_shard
from chaos.load.wire import MAX_LINE_BYTES, PROTOCOL_VERSION, ProtocolError, decode, encode, read_message
from chaos.load.workload import LoadTarget
from chaos.model.context import ClientPolicy
from chaos.model.errors import SetupFailed
from chaos.model.experiment import LoadSpec, PromptSpec
from chaos.model.observations import Note, StreamRecord, to_json

pytestmark = [pytest.mark.timeout(30)]  # async tests run under asyncio_mode = "auto"

TOKEN = "hostile-test-token-0123456789"
Misbehave = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Coroutine[Any, Any, None]]


def _spec(**overrides: Any) -> LoadSpec:
    values: dict[str, Any] = {"concurrency": 1, "max_tokens": (4, 4), "request_timeout": 5.0, "shards": 1,
                              "shard_launch": "external", "shard_listen": "127.0.0.1:0", "shard_connect_timeout": 8.0,
                              "prompts": PromptSpec(min_chars=16, max_chars=32)}
    values.update(overrides)
    return LoadSpec(**values)


@pytest.fixture(autouse=True)
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    return TOKEN


def _port(pool: ShardPool) -> int:
    return int(pool.address.rsplit(":", 1)[1])


async def _listening(pool: ShardPool) -> asyncio.Task[None]:
    opening = asyncio.create_task(pool.open())
    while not pool.address:
        await asyncio.sleep(0.01)
    return opening


async def _join(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client with the token: hello, welcome, the clock round trips answered until the phase comes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=MAX_LINE_BYTES)
    writer.write(encode({"op": "hello", "token": TOKEN, "index": 0, "count": 1, "version": PROTOCOL_VERSION,
                         "pid": 1, "host": "hostile"}))
    welcome = await read_message(reader)
    assert welcome is not None and welcome["op"] == "welcome", welcome
    while True:
        message = await read_message(reader)
        assert message is not None
        if message["op"] == "ping":
            now = time.monotonic_ns()
            writer.write(encode({"op": "pong", "seq": message["seq"], "t0": message["t0"], "t1": now, "t2": now}))
        elif message["op"] == "phase":
            return reader, writer


async def _answer_lag(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer the one ``lag`` call ``ready`` makes, as a shard does."""
    message = await read_message(reader)
    assert message is not None and message["cmd"] == "lag", message
    writer.write(encode({"op": "reply", "seq": message["seq"], "ok": True, "value": None, "lag": [], "stats": {}}))


@asynccontextmanager
async def _pool_with(misbehave: Misbehave, records: list[StreamRecord] | None = None,
                     notes: list[Note] | None = None, tmp: Path | None = None) -> AsyncIterator[ShardPool]:
    """A pool of one shard, that shard the test's client; it misbehaves once its clock is measured."""
    sink = records.append if records is not None else (lambda r: None)
    pool = ShardPool(_spec(), LoadTarget("http://127.0.0.1:9/v1", "m", 1), policy=ClientPolicy(), sink=sink,
                     run_dir=tmp or Path("."), notes=notes.append if notes is not None else None, run_id="hostile")
    pool.call_grace_s = 1.0
    opening = await _listening(pool)
    reader, writer = await _join(_port(pool))
    await opening
    acting = asyncio.create_task(misbehave(reader, writer))
    try:
        yield pool
    finally:
        await asyncio.wait_for(pool.aclose(), 10)  # bounded, however the shard behaves
        acting.cancel()
        writer.close()


async def _silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)  # connected, its clock measured, and then nothing: no reply, no read


@pytest.mark.parametrize("line", [
    b'{"op":"activity","stamps":[1e999]}\n',  # inf: int() raised OverflowError in the reader
    b'{"op":"activity","stamps":' + b"[" * 5000 + b"]" * 5000 + b"}\n",  # RecursionError in json.loads
], ids=["1e999", "deep"])
async def test_a_message_that_killed_the_reader_now_loses_the_shard_and_fails_its_call_at_once(
        line: bytes, tmp_path: Path) -> None:
    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(line)
        await asyncio.sleep(3600)

    async with _pool_with(send, tmp=tmp_path) as pool:
        await asyncio.sleep(0.3)  # the line has arrived
        started = time.monotonic()
        # before: the reader died, the shard stayed "alive", and this call waited for it forever
        with pytest.raises(SetupFailed, match="not JSON within|nested more than"):
            await asyncio.wait_for(pool.ready(), 5)
        assert time.monotonic() - started < 0.9  # lost already: no deadline (1 s here) to wait out
        assert 0 in pool._dead


async def test_a_silent_shard_misses_its_deadline_and_is_lost_and_teardown_is_bounded(tmp_path: Path) -> None:
    notes: list[Note] = []

    async def answer_then_fall_silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _answer_lag(reader, writer)
        await asyncio.sleep(3600)  # nor reads: what the coordinator writes piles up unread

    async with _pool_with(answer_then_fall_silent, notes=notes, tmp=tmp_path) as pool:
        await asyncio.wait_for(pool.ready(), 5)
        started = time.monotonic()
        # what the runner's teardown calls first: before, it waited for this shard forever (SIGTERM ignored)
        with pytest.raises(SetupFailed, match="did not answer 'drain' within"):
            await asyncio.wait_for(pool.drain(0.0), 5)
        assert 0.9 < time.monotonic() - started < 3.0  # its own 0 s and the 1 s grace
        with pytest.raises(SetupFailed, match="every load shard is gone"):
            await pool.stop("x")
        started = time.monotonic()
    assert time.monotonic() - started < 6.0  # aclose: the lost shard is not waited for again
    (note,) = notes
    assert "did not answer 'drain'" in note.data["shards"]["0"]["lost"]


async def test_a_record_with_wrong_field_types_loses_the_shard_and_never_reaches_the_verifiers(tmp_path: Path) -> None:
    records: list[StreamRecord] = []
    bad = {"type": "stream", "id": "0-1", "phase": "p", "status": "200", "events": "many"}  # judged: "200" < 400

    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(encode({"op": "record", "record": bad}))
        await asyncio.sleep(3600)

    async with _pool_with(send, records=records, tmp=tmp_path) as pool:
        await asyncio.sleep(0.3)
        with pytest.raises(SetupFailed, match="field status is str '200'"):
            await asyncio.wait_for(pool.ready(), 5)
    assert records == []


async def test_a_journal_shard_s_bad_lines_are_dropped_and_counted_never_a_traceback(tmp_path: Path) -> None:
    good = StreamRecord(id="0-1", phase="p", t_sent=10, t_content=[11, 12], t_end=13, status=200)
    path = tmp_path / "journal.shard-0.jsonl"
    path.write_text("\n".join([
        json.dumps({"type": "shard", "index": 0, "run_id": "r"}),
        to_json(good),
        json.dumps({"type": "stream", "id": "0-2", "phase": "p", "status": "200"}),
        '{"type":"stream","id":"0-3","phase":"p","t_sent":1e999}',
        '{"type":"stream","id":"0-4","phase":"p","usage":' + "[" * 3000 + "]" * 3000 + "}",
        '{"type":"stream","id":["0-5"],"phase":"p"}',
    ]) + "\n", encoding="utf-8")
    records, why = merge_journal_shard(path, 0, set(), "r")  # before: a RecursionError traceback
    assert why is None and records == [good]
    shard = shard_pool.read_journal_shard(path, 0, set(), "r")
    assert shard.dropped == 4 and shard.dropped_why is not None and "status" in shard.dropped_why


async def test_a_hello_that_never_ends_is_cut_at_16_KiB_not_buffered_to_8_MiB(tmp_path: Path) -> None:
    pool = ShardPool(_spec(shard_connect_timeout=3.0), LoadTarget("http://127.0.0.1:9/v1", "m", 1),
                     policy=ClientPolicy(), sink=lambda r: None, run_dir=tmp_path, run_id="h")
    opening = await _listening(pool)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(pool))
        writer.write(b'{"op":"hello","token":"' + b"x" * (256 * 1024))  # no newline, no token
        started = time.monotonic()
        try:  # before: read on to 8 MiB or for 10 s, all of it held in the runner's memory
            end = await asyncio.wait_for(reader.read(), 3)
        except ConnectionError:  # closed with our bytes unread: a reset
            end = b""
        assert end == b"" and time.monotonic() - started < 2.0
        writer.close()
    finally:
        opening.cancel()
        await pool.aclose()


async def test_connections_that_never_say_hello_are_capped_and_a_shard_still_gets_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shard_pool, "HELLO_TIMEOUT_S", 1.5)
    pool = ShardPool(_spec(), LoadTarget("http://127.0.0.1:9/v1", "m", 1), policy=ClientPolicy(),
                     sink=lambda r: None, run_dir=tmp_path, run_id="cap")
    opening = await _listening(pool)
    crowd: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(UNAUTHENTICATED_MAX + 8):
            crowd.append(await asyncio.open_connection("127.0.0.1", _port(pool)))
            crowd[-1][1].write(b"{")  # started a hello, never finishes it
        await asyncio.sleep(0.3)
        # the ones past the cap were closed unread at once (before: all held, up to 8 MiB each, for 10 s)
        over = [r for r, _ in crowd[UNAUTHENTICATED_MAX:]]
        ends = await asyncio.gather(*(asyncio.wait_for(r.read(), 0.5) for r in over), return_exceptions=True)
        assert all(end == b"" or isinstance(end, ConnectionError) for end in ends), ends
        # a real shard dialling now is closed unread too, dials again, and is welcomed once the crowd's
        # hellos time out (1.5 s here)
        shard = asyncio.create_task(run_shard(f"127.0.0.1:{_port(pool)}", index=0, count=1, token=TOKEN,
                                              journal_dir=tmp_path, connect_timeout=8.0))
        await asyncio.wait_for(opening, 8)  # every shard connected and its clock measured
        await asyncio.wait_for(pool.ready(), 5)
    finally:
        opening.cancel()
        await pool.aclose()
        for _, writer in crowd:
            writer.close()
    assert await asyncio.wait_for(shard, 10) == "closed"


async def _echo_server(key_seen: list[str]) -> asyncio.Server:
    """A target that echoes the request's Authorization header in its streamed text."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        headers = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
        length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
        await reader.readexactly(length)
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        key_seen.append(auth)
        event = {"choices": [{"index": 0, "text": f"you sent {auth}", "finish_reason": "stop"}]}
        body = f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                     b"Connection: close\r\n\r\n" + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_a_shard_journal_keeps_no_echoed_api_key(tmp_path: Path) -> None:
    key = "sk-shard-echo-0123456789abcdef"
    seen: list[str] = []
    server = await _echo_server(seen)
    port = server.sockets[0].getsockname()[1]
    records: list[StreamRecord] = []
    pool = ShardPool(_spec(max_requests=1), LoadTarget(f"http://127.0.0.1:{port}/v1", "m", 1), policy=ClientPolicy(),
                     sink=records.append, run_dir=tmp_path, run_id="echo")
    opening = await _listening(pool)
    shard = asyncio.create_task(run_shard(pool.address, index=0, count=1, token=TOKEN, journal_dir=tmp_path,
                                          api_key=key, connect_timeout=5.0))
    try:
        await asyncio.wait_for(opening, 8)
        pool.phase = "p"
        await asyncio.wait_for(pool.run(time.monotonic_ns() + 2_000_000_000), 8)
        await asyncio.wait_for(pool.drain(3), 6)
    finally:
        await pool.aclose()
        server.close()
    await asyncio.wait_for(shard, 5)
    assert seen == [f"Bearer {key}"]  # the target did get the key, and echoed it
    journal = (tmp_path / "journal.shard-0.jsonl").read_text(encoding="utf-8")
    assert "you sent Bearer [redacted]" in journal and key not in journal  # before: the key, in clear
    assert records and all(key not in r.text for r in records)  # nor sent on to the coordinator


# ---- lone surrogates, made-up clocks, a hello that fails (issue 41 review) -----------------------------


@pytest.mark.parametrize("line", [
    rb'{"op":"record","record":{"text":"bad \ud800 char"}}',  # a high half alone
    rb'{"op":"reply","seq":1,"ok":false,"value":"\uDFFF"}',  # a low half alone, upper case
    rb'{"op":"reply","seq":1,"ok":true,"value":null,"send_delay":{"k\udc00":[1]}}',  # in a key
    rb'{"op":"hello","token":"x","host":"\ude00\ud83d"}',  # both halves, in the wrong order
])
def test_decode_refuses_a_lone_surrogate_anywhere_in_a_message(line: bytes) -> None:
    with pytest.raises(ProtocolError, match="lone UTF-16 surrogate"):  # before: decoded, and later unwritable
        decode(line)


def test_decode_keeps_a_surrogate_pair_and_an_escaped_backslash() -> None:
    assert decode(rb'{"op":"x","t":"\ud83d\ude00"}') == {"op": "x", "t": "\U0001f600"}
    assert decode(rb'{"op":"x","t":"\\ud800"}') == {"op": "x", "t": "\\ud800"}  # text, no surrogate


async def test_a_record_with_a_lone_surrogate_loses_the_shard_and_never_reaches_the_journal(tmp_path: Path) -> None:
    records: list[StreamRecord] = []

    async def send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b'{"op":"record","record":{"type":"stream","id":"0-1","phase":"p","text":"bad \\ud800"}}\n')
        await asyncio.sleep(3600)

    async with _pool_with(send, records=records, tmp=tmp_path) as pool:
        await asyncio.sleep(0.3)
        with pytest.raises(SetupFailed, match="lone UTF-16 surrogate"):
            await asyncio.wait_for(pool.ready(), 5)
    assert records == []  # before: a record whose text no UTF-8 journal can hold, written on


async def _clock_liar(port: int, stamp: int) -> None:
    """A client with the token that answers every ping with ``stamp`` as its own clock."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=MAX_LINE_BYTES)
    writer.write(encode({"op": "hello", "token": TOKEN, "index": 0, "count": 1, "version": PROTOCOL_VERSION,
                         "pid": 1, "host": "liar"}))
    try:
        while (message := await read_message(reader)) is not None:
            if message["op"] == "ping":
                writer.write(encode({"op": "pong", "seq": message["seq"], "t0": message["t0"], "t1": stamp,
                                     "t2": stamp}))
    except (ConnectionError, ProtocolError):
        pass
    finally:
        writer.close()


@pytest.mark.parametrize(("stamp", "said"), [
    (10**400, "not ints within"),  # before: an offset of 400 digits, OverflowError in the report's (t - t0) / NS
    (2**62 - 1, "answered with a clock"),  # a stamp within bounds, an offset of 73 years: made up
], ids=["400-digits", "73-years"])
async def test_pong_stamps_that_make_a_clock_up_lose_the_shard(tmp_path: Path, stamp: int, said: str) -> None:
    pool = ShardPool(_spec(shard_connect_timeout=8.0), LoadTarget("http://127.0.0.1:9/v1", "m", 1),
                     policy=ClientPolicy(), sink=lambda r: None, run_dir=tmp_path, run_id="clock")
    opening = await _listening(pool)
    liar = asyncio.create_task(_clock_liar(_port(pool), stamp))
    try:
        deadline = time.monotonic() + 4.0
        while 0 not in pool._dead:  # before: measured, welcomed to the run with that offset, never lost
            assert time.monotonic() < deadline and not opening.done(), "the clock liar was not lost"
            await asyncio.sleep(0.02)
        assert said in pool._dead[0], pool._dead
    finally:
        opening.cancel()
        await pool.aclose()
        await asyncio.wait_for(liar, 5)


async def _hello_closed(port: int, hello: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(hello)
    try:
        return await asyncio.wait_for(reader.read(), 3)
    except ConnectionError:
        return b""
    finally:
        writer.close()


async def test_a_hello_that_fails_is_closed_with_one_line_and_never_a_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool = ShardPool(_spec(shard_connect_timeout=5.0), LoadTarget("http://127.0.0.1:9/v1", "m", 1),
                     policy=ClientPolicy(), sink=lambda r: None, run_dir=tmp_path, run_id="h")
    opening = await _listening(pool)
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            # a token with a lone surrogate: before, .encode() raised in the connection's callback
            lone = b'{"op":"hello","token":"\\ud800","index":0,"count":1,"version":%d}\n' % PROTOCOL_VERSION
            assert await _hello_closed(_port(pool), lone) == b""
            assert "Unhandled exception" not in caplog.text
            assert capsys.readouterr().err == ""  # refused by the decoder: nothing to say

            def broken(*args: Any) -> None:
                raise RuntimeError("a bug of ours")
            monkeypatch.setattr(pool, "_admit", broken)  # any error of ours in a hello
            hello = encode({"op": "hello", "token": TOKEN, "index": 0, "count": 1, "version": PROTOCOL_VERSION})
            for _ in range(2):
                assert await _hello_closed(_port(pool), hello) == b""
            await asyncio.sleep(0.05)
        assert "Unhandled exception" not in caplog.text and "Traceback" not in caplog.text, caplog.text
        err = capsys.readouterr().err
        assert err.splitlines() == ["load shard coordinator: a connection's hello failed: RuntimeError: a bug of ours"]
    finally:
        opening.cancel()
        await pool.aclose()


def test_a_token_with_a_lone_surrogate_is_a_wrong_token_not_an_error(tmp_path: Path) -> None:
    """What the decoder lets through elsewhere (a hello read some other way): compared, refused, no raise."""
    class Writer:
        said = b""

        def write(self, data: bytes) -> None:
            self.said += data

        def close(self) -> None:
            pass

    pool = ShardPool(_spec(), LoadTarget("http://127.0.0.1:9/v1", "m", 1), policy=ClientPolicy(),
                     sink=lambda r: None, run_dir=tmp_path, run_id="t")
    writer = Writer()
    hello = {"op": "hello", "token": "\ud800", "index": 0, "count": 1, "version": PROTOCOL_VERSION}
    assert pool._admit(hello, None, writer) is None  # type: ignore[arg-type]  # before: UnicodeEncodeError
    assert b"wrong shard token" in writer.said
