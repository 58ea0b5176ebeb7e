"""How a stream was cut, as the load client records it (``ErrorInfo.cause``), against real loopback
servers: a bare EOF in the middle of a chunked 200, a TCP reset, a clean end without ``[DONE]``, a close
before any response; and ``early_close`` naming each cause, while the whole stream passes."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable

import pytest

import sla
from chaos.load.client import make_http_client, stream_request
from chaos.model.observations import Observations, StreamRecord
from tests.load.conftest import loopback_server

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
FINISH = b'data: {"choices":[{"index":0,"text":"b","finish_reason":"stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def two_events(w: asyncio.StreamWriter) -> None:
    w.write(HEAD + chunk(EVENT) + chunk(EVENT))
    await w.drain()


async def bare_eof(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await two_events(w)  # then the handler closes the connection: a FIN with no chunked terminator


async def reset(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await two_events(w)
    sock = w.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends an RST
    w.transport.abort()


async def clean_without_done(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    await two_events(w)
    w.write(b"0\r\n\r\n")  # the body ends properly, but no finish reason and no [DONE] came
    await w.drain()


async def no_response(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    return None  # closed before any response head


async def whole(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    w.write(HEAD + chunk(EVENT) + chunk(FINISH) + chunk(DONE) + b"0\r\n\r\n")
    await w.drain()


async def fetch(reply: Reply, rid: str) -> StreamRecord:
    async with loopback_server(lambda _head, r, w: reply(r, w)) as url, make_http_client(2) as http:
        return await stream_request(http, url, {"stream": True}, StreamRecord(id=rid, phase="p"), request_timeout=10)


async def test_a_bare_eof_mid_body_is_told_from_a_reset() -> None:
    eof = await fetch(bare_eof, "eof")
    assert eof.status == 200 and eof.text == "aa" and not eof.complete
    assert eof.error is not None and eof.error.kind == "read" and eof.error.cause == "bare_eof", eof.error
    rst = await fetch(reset, "rst")
    assert rst.status == 200 and not rst.complete
    assert rst.error is not None and rst.error.kind == "read" and rst.error.cause == "reset", rst.error


async def test_a_clean_end_without_done_is_no_error_and_a_close_before_the_head_no_response() -> None:
    clean = await fetch(clean_without_done, "clean")
    assert clean.status == 200 and clean.error is None and not clean.done_seen and not clean.complete
    gone = await fetch(no_response, "gone")
    assert gone.status is None and gone.error is not None and gone.error.cause == "no_response", gone.error


async def test_early_close_names_each_cause_and_the_whole_stream_passes() -> None:
    records = [await fetch(reply, name) for name, reply in
               (("eof", bare_eof), ("rst", reset), ("clean", clean_without_done), ("whole", whole))]
    assert records[-1].complete and records[-1].error is None
    obs = Observations(experiment="cuts", streams=records)
    verdict = sla.judge(obs, "early_close", {})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(0.75)
    assert {o["id"]: o["cause"] for o in verdict.evidence["offenders"]} == {
        "eof": "bare_eof", "rst": "reset", "clean": "eof_without_done"}
    # the disarmed form: the same server sending the whole stream passes
    assert sla.judge(Observations(experiment="cuts", streams=records[-1:]), "early_close", {}).status == "pass"


def _causes_under_uvloop() -> dict[str, str | None]:
    uvloop = pytest.importorskip("uvloop")

    async def causes() -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for name, reply in (("eof", bare_eof), ("rst", reset), ("gone", no_response)):
            rec = await fetch(reply, name)
            out[name] = rec.error.cause if rec.error else None
        return out

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(causes())


async def test_the_causes_are_the_same_under_uvloop() -> None:
    """The load's own processes run uvloop (chaos.load.loop): its transports report a reset the same way."""
    assert await asyncio.to_thread(_causes_under_uvloop) == {"eof": "bare_eof", "rst": "reset", "gone": "no_response"}
