"""A small real HTTP/2 server for the HTTP/2 load client's tests (``h2`` on asyncio, h2c or TLS with ALPN).

It streams SSE completions and records what it saw, with its own stamps (``time.monotonic_ns()``), so a
test asserts on the server's view: streams per connection, the most open at once, RST_STREAM codes
received, the moments a stream's send window ran out and reopened, every DATA frame sent.

Per request, the JSON body's ``"h2test"`` object shapes the response: ``events`` (content events before
the finishing one and ``[DONE]``), ``interval_s`` (between events), ``event_bytes`` (pad each event's
text to about this size), ``header_fields`` (that many more response header fields), ``reset_after``
(RST_STREAM CANCEL after that many events) and ``drop_after`` (close the connection after that many
events). Per server:
``goaway_after`` (on the first connection, a GOAWAY whose last_stream_id is the stream before the
N-th request: that one and later ones are never processed), ``lower_streams_to`` (on the first
connection, SETTINGS_MAX_CONCURRENT_STREAMS lowered to it when its first request arrives) and
``refuse_all`` (every stream answered with RST_STREAM REFUSED_STREAM).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hyperframe.frame import GoAwayFrame

__all__ = ["ConnLog", "H2TestServer", "StreamLog"]


@dataclass
class StreamLog:
    """One stream as the server saw it."""

    conn: int  # the server's connection index (0-based, in accept order)
    stream_id: int
    request_id: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)  # as received, pseudo-headers included
    body: bytes = b""
    ignored: bool = False  # above a GOAWAY's last_stream_id, or refused: never processed
    data_frames: int = 0  # DATA frames sent with data in them
    sends: list[int] = field(default_factory=list)  # monotonic ns of each DATA frame sent
    blocked: list[int] = field(default_factory=list)  # monotonic ns: its send window was found at 0
    unblocked: list[int] = field(default_factory=list)  # monotonic ns: the window reopened after a block
    reset_code: int | None = None  # RST_STREAM from the client (its error code)
    t_reset: int | None = None
    ended: bool = False  # END_STREAM sent
    done: bool = False  # no longer open (ended or reset), counted out of ``ConnLog.open_now``


@dataclass
class ConnLog:
    index: int
    open_now: int = 0
    max_open: int = 0
    lowered_acked: int | None = None  # monotonic ns: the client acknowledged the lowered stream limit
    max_open_after_ack: int = 0  # the most streams open at once from then on
    t_goaway: int | None = None
    t_lost: int | None = None  # monotonic ns: the connection closed
    violations: list[str] = field(default_factory=list)  # protocol errors the client caused


def _event(text: str, finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class _ServerConn(asyncio.Protocol):
    def __init__(self, server: H2TestServer) -> None:
        self.server = server
        self.log = ConnLog(len(server.conns))
        server.conns.append(self.log)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.transport: asyncio.Transport | None = None
        self.windows: dict[int, asyncio.Event] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.streams: dict[int, StreamLog] = {}
        self.requests = 0
        self.last_stream_id: int | None = None  # the GOAWAY sent
        self.lowered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses
        self.server.transports.append(self.transport)
        # the limit in the connection's first SETTINGS, as a server states it (an update sent before the preface's
        # SETTINGS would be overridden, for the client, by the preface's default that follows it)
        self.h2.local_settings = h2.settings.Settings(
            client=False, initial_values={SettingCodes.MAX_CONCURRENT_STREAMS: self.server.max_streams})
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.log.t_lost = time.monotonic_ns()
        for task in list(self.tasks.values()):
            task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.log.violations.append(f"{type(exc).__name__}: {exc}")
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            self.handle(event)
        self.flush()

    def handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self.request(event)
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None:
                stream.body += event.data or b""
            self.h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None and not stream.ignored:
                self.tasks[stream.stream_id] = asyncio.get_running_loop().create_task(self.respond(stream))
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.get(event.stream_id or 0)
            if stream is not None:
                stream.reset_code, stream.t_reset = int(event.error_code or 0), time.monotonic_ns()
                task = self.tasks.pop(stream.stream_id, None)
                if task is not None:
                    task.cancel()
                self.closed(stream)
        elif isinstance(event, h2.events.WindowUpdated):
            targets = self.windows.values() if not event.stream_id else [self.windows.get(event.stream_id)]
            for waiter in targets:
                if waiter is not None:
                    waiter.set()
        elif isinstance(event, h2.events.SettingsAcknowledged):
            if self.lowered and self.log.lowered_acked is None \
                    and SettingCodes.MAX_CONCURRENT_STREAMS in event.changed_settings:
                self.log.lowered_acked = time.monotonic_ns()
                self.log.max_open_after_ack = self.log.open_now

    def request(self, event: h2.events.RequestReceived) -> None:
        server, log = self.server, self.log
        stream_id = event.stream_id or 0
        fields = [(bytes(k).decode(), bytes(v).decode()) for k, v in event.headers or ()]
        stream = StreamLog(log.index, stream_id, dict(fields).get("x-request-id"), fields)
        self.streams[stream_id] = stream
        server.streams.append(stream)
        self.requests += 1
        if self.last_stream_id is not None and stream_id > self.last_stream_id:
            stream.ignored = True  # after our GOAWAY: never processed (the client must send it elsewhere)
            return
        if server.refuse_all:
            stream.ignored = True
            self.h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        if server.goaway_after is not None and log.index == 0 and self.requests == server.goaway_after:
            # a graceful GOAWAY (RFC 9113 §6.8) written by hand: h2 would close its own state with it
            self.last_stream_id = stream_id - 2
            frame = GoAwayFrame(0)
            frame.last_stream_id = self.last_stream_id
            frame.error_code = 0
            self.flush()
            assert self.transport is not None
            self.transport.write(frame.serialize())
            log.t_goaway = time.monotonic_ns()
            stream.ignored = True
            return
        log.open_now += 1
        log.max_open = max(log.max_open, log.open_now)
        if log.lowered_acked is not None:
            log.max_open_after_ack = max(log.max_open_after_ack, log.open_now)
        if server.lower_streams_to is not None and log.index == 0 and not self.lowered:
            self.lowered = True
            self.h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: server.lower_streams_to})

    def closed(self, stream: StreamLog) -> None:
        if not stream.ignored and not stream.done:
            stream.done = True
            self.log.open_now -= 1
        if self.last_stream_id is not None and self.log.open_now == 0 and self.transport is not None:
            self.h2.close_connection()  # drained: the GOAWAY sent before had told the client so
            self.flush()
            self.transport.close()

    async def respond(self, stream: StreamLog) -> None:
        sid = stream.stream_id
        try:
            knobs: dict[str, Any] = json.loads(stream.body or b"{}").get("h2test", {})
        except ValueError:
            knobs = {}
        events = int(knobs.get("events", self.server.events))
        interval = float(knobs.get("interval_s", self.server.interval_s))
        pad = int(knobs.get("event_bytes", 0))
        reset_after = knobs.get("reset_after")
        drop_after = knobs.get("drop_after")
        extra = [(f"x-pad-{i}".encode(), b"v") for i in range(int(knobs.get("header_fields", 0)))]
        self.h2.send_headers(sid, [(b":status", b"200"), (b"content-type", b"text/event-stream"), *extra])
        self.flush()
        try:
            for i in range(events):
                if drop_after is not None and i == int(drop_after) and self.transport is not None:
                    self.transport.close()  # the whole connection, mid-stream (a FIN, no GOAWAY)
                    return
                if reset_after is not None and i == int(reset_after):
                    self.h2.reset_stream(sid, ErrorCodes.CANCEL)
                    self.flush()
                    self.closed(stream)
                    return
                await self.send(stream, _event(chr(ord("a") + i % 26) + "x" * max(0, pad - 80)))
                if interval:
                    await asyncio.sleep(interval)
            await self.send(stream, _event("", "stop"))
            await self.send(stream, b"data: [DONE]\n\n")
            self.h2.end_stream(sid)
            stream.ended = True
            self.flush()
        except h2.exceptions.StreamClosedError:
            return
        finally:
            self.tasks.pop(sid, None)
        self.closed(stream)

    async def send(self, stream: StreamLog, data: bytes) -> None:
        """One event, as one DATA frame when the windows allow, else as they open (stamped)."""
        sid = stream.stream_id
        while data:
            size = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size, len(data))
            if size <= 0:
                stream.blocked.append(time.monotonic_ns())
                waiter = self.windows[sid] = asyncio.Event()
                await waiter.wait()
                self.windows.pop(sid, None)
                stream.unblocked.append(time.monotonic_ns())
                continue
            self.h2.send_data(sid, data[:size])
            data = data[size:]
            stream.data_frames += 1
            stream.sends.append(time.monotonic_ns())
            self.flush()


class H2TestServer:
    """``async with H2TestServer(...) as url``: a loopback HTTP/2 server (h2c, or TLS with ``tls``)."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, events: int = 5, interval_s: float = 0.0,
                 max_streams: int = 100, goaway_after: int | None = None, lower_streams_to: int | None = None,
                 refuse_all: bool = False) -> None:
        self.tls = tls
        self.events = events
        self.interval_s = interval_s
        self.max_streams = max_streams
        self.goaway_after = goaway_after
        self.lower_streams_to = lower_streams_to
        self.refuse_all = refuse_all
        self.conns: list[ConnLog] = []
        self.streams: list[StreamLog] = []
        self.transports: list[asyncio.Transport] = []
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> str:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ServerConn(self), "127.0.0.1", 0, ssl=self.tls)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}/v1/completions"
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for transport in self.transports:
            transport.close()
        await asyncio.wait_for(self._server.wait_closed(), 5)

    def by_request(self, request_id: str) -> list[StreamLog]:
        return [s for s in self.streams if s.request_id == request_id]
