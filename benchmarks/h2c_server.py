"""The HTTP/2 side of ``bench_load.py``'s loopback SSE server: h2c with prior knowledge, as cheap per event as
its HTTP/1.1 side (``bench_load.py --serve --h2c``; ``bench_load.py --http 2`` starts it so).

A connection whose first bytes are the client preface (``PRI * HTTP/2.0``) is HTTP/2, any other HTTP/1.1
(``Sniff``). Per event the server does no HTTP/2 work in Python: each stream's two DATA frames (an event, and
the last event with ``[DONE]`` and END_STREAM) are built once when its request arrives (9-byte header +
payload), and the shared ticker writes, for each connection, the frames of all its streams due at that tick in
one ``transport.write`` (what an HTTP/2 server does with the frames it has queued for one connection, e.g.
nginx's output queue; it is also what keeps this server cheaper than any client).

Why ``hyperframe`` and ``hpack`` and not ``h2``'s state machine: ``h2`` keeps its view of every frame it
sends, and frames written behind its back make that view wrong in two ways that break a run of any length.
Its send window is never debited for the raw DATA, while the client's WINDOW_UPDATEs keep crediting it, so it
passes 2^31-1 and ``h2`` raises FlowControlError (after about 2 GiB on one connection); and a stream ended by
a raw END_STREAM stays open in ``h2`` forever, counted against MAX_CONCURRENT_STREAMS and scanned on every new
stream (``_open_streams``: quadratic over a run). Keeping ``h2`` consistent would take a frame splitter in
front of it anyway, to keep WINDOW_UPDATEs from it; with that splitter, what ``h2`` would still add is a
SETTINGS ack and HPACK, which ``hyperframe`` (the frame layouts: padding, priority fields) and ``hpack``
(one decoder per connection, as the client's encoder indexes into its dynamic table) give directly.
Per request the server parses the client's HEADERS (and CONTINUATION), DATA, RST_STREAM, PING, GOAWAY; it
ignores WINDOW_UPDATE and PRIORITY.

Flow control, both ways, is kept out of the measurement, so this measures the client's cost per event, not
flow control: the server advertises MAX_CONCURRENT_STREAMS and a stream window of 2^31-1, opens its
connection window to 2^31-1 (topped up past 1 GiB received) and never waits for the client's window: the
client must be run with a receive window its streams never use up (``bench_load.py --stream-window``, by
default 16 MiB; a 64-event response is about 10 KB, so the client's own default, 65,535, would hold as well,
and with either it sends no stream WINDOW_UPDATE: only connection ones, past half its connection window).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from hpack import Decoder, Encoder
from hpack.struct import NeverIndexedHeaderTuple
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_WINDOW = 2**31 - 1
TOP_UP = 1 << 30  # received body bytes after which the connection window is opened again
DATA, HEADERS = 0x0, 0x1
END_STREAM, END_HEADERS = 0x1, 0x4


def frame(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """One frame, header and payload (RFC 9113 §4.1), without hyperframe's per-frame objects."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def _block(status: bytes, fields: list[tuple[bytes, bytes]]) -> bytes:
    """A response header block that leaves no trace in the client's HPACK table (never-indexed literals; an
    indexed :status), so one block serves every stream of every connection."""
    return Encoder().encode([(b":status", status), *(NeverIndexedHeaderTuple(n, v) for n, v in fields)])


SSE_BLOCK = _block(b"200", [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")])
SERVER_SETTINGS = SettingsFrame(0, settings={
    SettingsFrame.MAX_CONCURRENT_STREAMS: MAX_WINDOW,
    SettingsFrame.INITIAL_WINDOW_SIZE: MAX_WINDOW,
}).serialize() + WindowUpdateFrame(0, window_increment=MAX_WINDOW - 65_535).serialize()
SETTINGS_ACK = SettingsFrame(0, flags=["ACK"]).serialize()


def h2c_protocols(
    *, first_hold: float, token: bytes, last: bytes, holds: list[float], counts: list[int],
    max_tokens: Callable[[bytes], int], get_body: Callable[[bytes], bytes | None],
    http1: Callable[[], asyncio.Protocol],
) -> tuple[Callable[[], asyncio.Protocol], Callable[[float], Any]]:
    """The server's protocol factory (HTTP/2 or ``http1``'s, by the connection's first bytes) and the HTTP/2
    ticker (a coroutine function of the tick in seconds). ``token`` and ``last``: an event's DATA payload and
    the last one's (with ``[DONE]``); ``holds``, ``counts``, ``max_tokens``, ``get_body``: as the HTTP/1.1 side's."""
    live: set[H2Conn] = set()

    class H2Conn(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop: not a subclass
            self.buffer = b""
            self.preface = False
            self.decoder = Decoder()
            self.heads: dict[int, tuple[bytes, bool]] = {}  # a header block awaiting CONTINUATION, END_STREAM
            self.requests: dict[int, tuple[bytes, bytes, list[bytes]]] = {}  # (method, path, body) until it ends
            self.held: set[int] = set()  # streams waiting out their first hold
            self.active: dict[int, list[Any]] = {}  # stream id → [events left, event frame, last frame]
            self.received = 0
            live.add(self)

        def connection_lost(self, exc: Exception | None) -> None:
            live.discard(self)
            self.active.clear()
            self.held.clear()

        def data_received(self, data: bytes) -> None:
            buf = self.buffer + data
            if not self.preface:
                if len(buf) < len(PREFACE):
                    self.buffer = buf
                    return
                if not buf.startswith(PREFACE):
                    self.transport.close()
                    return
                self.preface = True
                buf = buf[len(PREFACE):]
                self.transport.write(SERVER_SETTINGS)
            view, at = memoryview(buf), 0
            out: list[bytes] = []
            try:
                while len(buf) - at >= 9:
                    parsed, length = Frame.parse_frame_header(view[at:at + 9])
                    if len(buf) - at - 9 < length:
                        break
                    parsed.parse_body(view[at + 9:at + 9 + length])
                    at += 9 + length
                    self._frame(parsed, out)
            except HyperframeError:
                self.transport.close()
                return
            self.buffer = buf[at:]
            if out:
                self.transport.write(b"".join(out))

        def _frame(self, f: Frame, out: list[bytes]) -> None:
            sid = f.stream_id
            if isinstance(f, HeadersFrame | ContinuationFrame):
                before, ended = self.heads.pop(sid, (b"", False))
                block, ended = before + f.data, ended or "END_STREAM" in f.flags  # CONTINUATION has no END_STREAM
                if "END_HEADERS" not in f.flags:
                    self.heads[sid] = (block, ended)
                    return
                fields = dict(self.decoder.decode(block, raw=True))
                self.requests[sid] = (fields.get(b":method", b""), fields.get(b":path", b""), [])
                if ended:
                    self._request(sid, out)
            elif isinstance(f, DataFrame):
                self.received += f.flow_controlled_length
                if self.received >= TOP_UP:
                    out.append(WindowUpdateFrame(0, window_increment=self.received).serialize())
                    self.received = 0
                request = self.requests.get(sid)
                if request is not None:
                    request[2].append(f.data)
                    if "END_STREAM" in f.flags:
                        self._request(sid, out)
            elif isinstance(f, SettingsFrame):
                if "ACK" not in f.flags:
                    out.append(SETTINGS_ACK)
            elif isinstance(f, RstStreamFrame):
                self.requests.pop(sid, None)
                self.active.pop(sid, None)
                self.held.discard(sid)
            elif isinstance(f, PingFrame):
                if "ACK" not in f.flags:
                    out.append(PingFrame(0, opaque_data=f.opaque_data, flags=["ACK"]).serialize())
            elif isinstance(f, GoAwayFrame):
                self.transport.close()

        def _request(self, sid: int, out: list[bytes]) -> None:
            method, path, body = self.requests.pop(sid)
            if method == b"GET":  # preflights and the bench's own (/events, /holds)
                payload = get_body(path.split(b"?")[0].rstrip(b"/"))
                block = _block(b"404" if payload is None else b"200",
                               [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload or b"")).encode())])
                out.append(frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, payload or b""))
                return
            tokens = max(1, max_tokens(b"".join(body)))
            counts[1] += 1
            out.append(frame(HEADERS, END_HEADERS, sid, SSE_BLOCK))
            entry = [tokens, frame(DATA, 0, sid, token), frame(DATA, END_STREAM, sid, last)]
            if first_hold > 0:
                self.held.add(sid)
                asyncio.get_running_loop().call_later(first_hold, self._first, sid, time.monotonic(), entry)
            else:
                self.active[sid] = entry

        def _first(self, sid: int, arrived: float, entry: list[Any]) -> None:
            if sid not in self.held or self.transport.is_closing():
                return  # reset by the client meanwhile, or gone
            self.held.discard(sid)
            holds.append(time.monotonic() - arrived)
            counts[0] += 1
            if entry[0] == 1:
                self.transport.write(entry[2])
                return
            self.transport.write(entry[1])
            entry[0] -= 1
            self.active[sid] = entry

    class Sniff(asyncio.Protocol):
        """A connection until its first bytes say which HTTP it speaks; then the protocol for that one."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop: not a subclass
            self.first = b""

        def data_received(self, data: bytes) -> None:
            data = self.first + data
            if len(data) < 3:  # "PRI" against "POST", "PUT", "PATCH"
                self.first = data
                return
            proto = H2Conn() if data.startswith(b"PRI") else http1()
            self.transport.set_protocol(proto)
            proto.connection_made(self.transport)
            proto.data_received(data)

    async def ticker(tick: float) -> None:
        """Every ``tick``, each stream's next event, all of one connection's in one write."""
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            for conn in list(live):  # a connection lost meanwhile leaves the set between ticks, not in one
                active = conn.active
                if not active:
                    continue
                parts, finished = [], []
                for sid, entry in active.items():
                    entry[0] -= 1
                    if entry[0] > 0:
                        parts.append(entry[1])
                    else:
                        parts.append(entry[2])
                        finished.append(sid)
                for sid in finished:
                    del active[sid]
                counts[0] += len(parts)
                conn.transport.write(b"".join(parts))

    return Sniff, ticker
