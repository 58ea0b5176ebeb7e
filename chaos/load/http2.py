"""An HTTP/2 client for streamed responses: one asyncio ``Protocol`` per connection, ``h2`` for framing.

The same surface as ``chaos.load.http1`` (``H2Client`` for ``H1Client``, ``H2Stream`` for ``Connection``),
so ``chaos.load.client`` sends and reads a request the same way over either. What HTTP/2 changes:

- Many streams share one connection: up to ``streams_per_connection``, and never more than the server's
  ``SETTINGS_MAX_CONCURRENT_STREAMS`` (as it stands now: a server that lowers it mid-run gets no new
  stream on that connection until it has room; new requests go to another connection, or a new one).
  ``idle_connection`` hands out a stream on an open connection with room in O(1) (a per-origin dict of
  connections with room, newest first); requests that find none share the one connection being opened
  instead of opening one each.
- Every callback carries the stamp of the socket read that delivered its bytes (``time.monotonic_ns()``
  taken in ``data_received`` before ``h2`` parses), and ``on_body`` is called once per DATA frame.
- A slow reader is slow per stream: ``pause_reading`` stops acknowledging the stream's DATA, so no
  WINDOW_UPDATE reopens its window and the server stalls on that stream alone, as it would for a slow
  browser tab; the connection's window stays open (see ``H2Client``), so the stream's neighbours stream on.
- A GOAWAY drains the connection (RFC 9113 §6.8): the streams the server took (id <= its last_stream_id)
  finish, no new one is opened there, and those it never processed, or refused with RST_STREAM
  REFUSED_STREAM, are sent again once on another connection (§8.7: they are safe to retry).
- A stream ends on its own: RST_STREAM from the server fails that stream alone (cause ``reset``);
  ``close()`` sends RST_STREAM CANCEL, which is how the server learns that this client left.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, GoAwayFrame

from chaos.host.tls import tls_context
from chaos.load.http1 import (
    KEEPALIVE_EXPIRY_S,
    ConnectionClosed,
    ExchangeSlots,
    ResponseSink,
    Target,
    _check_header,
    _lost,
    open_transport,
    parse_target,
)
from chaos.load.limits import HEAD_BYTES, HEAD_FIELDS, head_message
from chaos.load.sdk_headers import openai_python_headers

__all__ = ["CONNECTION_WINDOW", "H2Client", "H2Request", "H2Stream", "H2Unavailable", "negotiate"]

# The connection-level receive window: at least this, and at least every stream's full window at once
# (``H2Client``). RFC 9113's default (65,535 for the whole connection) would let one stream that is not
# read stall all the others; browsers open theirs to 15 MiB (Chrome) or more.
CONNECTION_WINDOW = 16 << 20
_MAX_WINDOW = 2**31 - 1  # RFC 9113 §6.9.1
_PLACEMENTS = 4  # a request tries at most this many connections before it fails (a server shrinking its limit)
# hpack's own bound on a decoded header list (RFC 9113 counts 32 bytes per field on top of name and value):
# one that passes it passes HEAD_BYTES or HEAD_FIELDS too, and the stream fails on ours (a stream error);
# past hpack's the connection's compression state is lost, so the whole connection fails
_HEADER_LIST_SIZE = HEAD_BYTES + 32 * HEAD_FIELDS
# RFC 9113 §8.2.2: connection-specific header fields are malformed in HTTP/2 (TE only as "trailers")
_CONNECTION_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})


class H2Unavailable(ConnectionClosed):
    """The server does not speak HTTP/2 here: ALPN chose something else, or no HTTP/2 SETTINGS came back."""


@dataclass(frozen=True, slots=True)
class H2Request:
    """One encoded request (``H2Client.encode``): its header list, pseudo-headers first, and its body."""

    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


def _code(code: int) -> str:
    """An HTTP/2 error code by its name (``CANCEL``), or its number when it has none."""
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"0x{code:x}"


class _H2State(h2.connection.H2Connection):
    """``h2``'s connection, with RFC 9113 §6.8's graceful drain.

    h2 4.4 takes a received GOAWAY as the end of the whole connection: its state turns CLOSED and the DATA
    still owed on the streams the server did take (id <= last_stream_id) raises ``ProtocolError``
    (python-hyper/h2 #1181, open). Here a GOAWAY only reports itself (``ConnectionTerminated``); the client
    opens no stream on the connection from then on and lets the others finish."""

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list[Frame], list[h2.events.Event]]:
        event = h2.events.ConnectionTerminated()
        event.error_code = frame.error_code
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class H2Stream:
    """One request's stream ("connection" in ``chaos.load.client``'s sense): it holds a slot on its HTTP/2
    connection from ``idle_connection``/``connect`` until ``H2Client.release`` or ``close``."""

    __slots__ = (
        "client", "conn", "target", "sink", "request", "stream_id", "status", "headers", "complete", "closed",
        "attached", "paused", "held", "retried", "refusal", "label", "reused", "t_request", "head_fields",
        "head_bytes", "offset", "done_local", "task",
    )

    protocol = "h2"

    def __init__(self, conn: _Connection) -> None:
        self.client = conn.client
        self.conn = conn
        self.target = conn.target
        self.sink: ResponseSink | None = None
        self.request: H2Request | None = None
        self.stream_id: int | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False  # the response ended (END_STREAM)
        self.closed = False  # ended otherwise, or given back: nothing more reaches a sink
        self.attached = True  # holds a slot on ``conn``
        conn.active += 1
        self.paused = False
        self.held = 0  # flow-controlled bytes read while paused, not yet acknowledged to the server
        self.retried = False  # sent again once after the server refused it unprocessed (GOAWAY, REFUSED_STREAM)
        self.refusal = ""  # that first refusal, in words
        self.label = ""  # the request (its id), for messages
        self.reused = True  # False: the request waited for its connection to open (``H2Client.connect``)
        self.t_request: int | None = None  # monotonic ns: its HEADERS were written (the first time)
        self.head_fields = 0
        self.head_bytes = 0
        self.offset = 0  # body bytes sent so far (the rest waits for the server's window)
        self.done_local = False  # our END_STREAM is sent
        self.task: asyncio.Task[None] | None = None  # the re-send after a refusal, while it connects

    # ---- what chaos.load.client reads ------------------------------------------------------------

    @property
    def keep_alive(self) -> bool:
        """The connection takes new streams (False once the server sent GOAWAY, or it closed)."""
        return self.conn.usable

    @property
    def reusable(self) -> bool:
        return self.conn.usable

    @property
    def served(self) -> int:
        return self.conn.served

    @property
    def conn_label(self) -> str:
        return self.conn.label

    @property
    def t_connected(self) -> int | None:
        return self.conn.t_connected

    @property
    def t_tls(self) -> int | None:
        return self.conn.t_tls

    # ---- use by the request side -----------------------------------------------------------------

    def send(self, payload: H2Request, sink: ResponseSink, label: str = "") -> None:
        """Open the stream: HEADERS, then the body as far as the server's windows allow (the rest as they open)."""
        self.sink = sink
        self.request = payload
        self.label = label
        if self.t_request is None:
            self.t_request = time.monotonic_ns()
        self.conn.start(self)

    def pause_reading(self) -> None:
        """Stop acknowledging this stream's DATA: its window runs out and the server stalls on it."""
        self.paused = True

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            if self.held and self.attached:
                held, self.held = self.held, 0
                self.conn.acknowledge(held, self.stream_id)
                self.conn.flush()

    def close(self) -> None:
        """RST_STREAM CANCEL (the server sees the client leave); a response still attached fails as a cut
        read, in the words of an HTTP/1.1 connection closed under it."""
        self._end(time.monotonic_ns(), "read", "the client closed the connection", None, ErrorCodes.CANCEL)

    # ---- the connection's side ---------------------------------------------------------------------

    def _end(self, t: int, kind: str, message: str, cause: str | None, reset: ErrorCodes | None) -> None:
        """End the stream (``reset``: the RST_STREAM code to send, if it is still open) and fail its sink."""
        sink, self.sink = self.sink, None
        if self.closed:
            return
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self.client._resending.discard(self)
        if reset is not None and self.stream_id is not None and self.attached and not (
                self.complete and self.done_local):
            self.conn.reset(self.stream_id, reset)
        self.detach()
        if sink is not None and not self.complete:
            sink.on_failed(t, kind, message, cause)

    def detach(self) -> None:
        """Give the slot back; what was read and held is acknowledged (the connection's window, at least)."""
        if not self.attached:
            return
        self.attached = False
        conn = self.conn
        conn.active -= 1
        if self.stream_id is not None:
            conn.streams.pop(self.stream_id, None)
            conn.blocked.pop(self.stream_id, None)
            if self.held:
                held, self.held = self.held, 0
                conn.acknowledge(held, self.stream_id)
                conn.flush()
        conn.slot_freed()

    def refused(self, why: str) -> None:
        """The server did not process the stream (``why``): send it again once on another connection; a
        second refusal fails it (kind ``connect``, cause ``refused``)."""
        if self.closed:
            return
        if self.retried or self.client.closed or self.sink is None or self.request is None:
            self._end(time.monotonic_ns(), "connect",
                      f"the server refused the stream unprocessed twice: {self.refusal or why}, then {why} "
                      "(RFC 9113 §8.7 allows one retry)" if self.retried else f"the server refused the stream: {why}",
                      "refused", None)
            return
        self.retried = True
        self.refusal = why
        self.detach()
        self.stream_id = None
        self.status = 0
        self.headers = {}
        self.head_fields = self.head_bytes = self.offset = 0
        self.done_local = False
        self.paused = False
        self.client._resending.add(self)
        self.task = self.client._spawn(self._resend())

    async def _resend(self) -> None:
        client = self.client
        refused_by = self.conn
        try:
            fresh = client.idle_connection(self.target)
            if fresh is not None and fresh.conn is refused_by:  # not where it was just refused
                fresh.detach()
                fresh = None
            if fresh is None:
                fresh = await client.connect(self.target)
        except asyncio.CancelledError:
            raise
        except (OSError, ConnectionClosed) as exc:  # TimeoutError and ssl.SSLError are OSErrors
            self.task = None
            self._end(time.monotonic_ns(), "connect",
                      f"sending again the stream refused by {self.refusal} failed: {type(exc).__name__}: {exc}",
                      None, None)
            return
        self.task = None
        client._resending.discard(self)
        if self.closed:  # closed while connecting
            fresh.detach()
            return
        # take over the fresh stream's slot: this object is the one chaos.load.client holds
        fresh.attached = False
        self.conn, self.attached, self.reused = fresh.conn, True, fresh.reused
        self.conn.start(self)


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection (TCP, or TLS with ALPN h2) and the streams on it."""

    __slots__ = (
        "client", "target", "origin", "label", "h2", "transport", "streams", "blocked", "active", "cap", "settings",
        "ready", "draining", "closed", "served", "idle_since", "t_connected", "t_tls", "first_bytes", "goaway",
    )

    def __init__(self, client: H2Client, target: Target) -> None:
        self.client = client
        self.target = target
        self.origin = target.origin
        self.label = ""  # "c7" once open
        # outbound headers are checked once where they are made (``H2Client.encode``, ``_header``): h2's own
        # validation and normalisation of every request's ~15 headers cost 0.5 ms of CPU per 1,000 events at
        # 1,024 streams (benchmarks/bench_load.py --http 2, docs/measured.md)
        self.h2 = _H2State(h2.config.H2Configuration(client_side=True, header_encoding=None,
                                                     validate_outbound_headers=False,
                                                     normalize_outbound_headers=False))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, H2Stream] = {}  # sent, by stream id
        self.blocked: dict[int, H2Stream] = {}  # sent, with body bytes waiting for the server's window
        self.active = 0  # streams holding a slot: reserved (not sent yet) or sent
        # how many streams it may carry: ours, and the server's SETTINGS_MAX_CONCURRENT_STREAMS once known
        # (until then what the origin's last connection said, so a crowd waiting on a connect is sized right)
        self.cap = min(client.streams_per_connection, client._caps.get(self.origin, client.streams_per_connection))
        loop = asyncio.get_running_loop()
        self.settings: asyncio.Future[None] = loop.create_future()  # the server's first SETTINGS
        self.ready: asyncio.Future[None] = loop.create_future()  # open for streams, or why not
        self.ready.add_done_callback(_retrieved)
        self.settings.add_done_callback(_retrieved)
        self.draining = False  # GOAWAY received: no new stream here
        self.closed = False
        self.served = 0  # responses completed on it
        self.idle_since = time.monotonic()
        self.t_connected: int | None = None
        self.t_tls: int | None = None
        self.first_bytes = b""  # what came before the server's SETTINGS (for the error when it is not HTTP/2)
        self.goaway = ""  # the GOAWAY received, in words

    @property
    def usable(self) -> bool:
        """Takes new streams: open, not draining."""
        return not self.closed and not self.draining and self.transport is not None \
            and not self.transport.is_closing()

    # ---- opening ---------------------------------------------------------------------------------

    def begin(self) -> None:
        """Our preface: SETTINGS (our stream window, header list bound, no push), the connection window opened."""
        client = self.client
        self.h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,  # what the server may open to us: push is off
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: client.stream_window,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: _HEADER_LIST_SIZE,
        })
        self.h2.decoder.max_header_list_size = _HEADER_LIST_SIZE
        self.h2.initiate_connection()
        if client.connection_window > 65_535:
            self.h2.increment_flow_control_window(client.connection_window - 65_535)
        self.flush()

    # ---- streams ---------------------------------------------------------------------------------

    def start(self, stream: H2Stream) -> None:
        """Send ``stream``'s request here, or, when this connection can no longer take it, elsewhere."""
        request = stream.request
        assert request is not None
        if not self.usable:
            stream.refused(f"connection {self.label or '(opening)'} stopped taking streams before the request "
                           f"went out ({self.goaway or 'closed'})")
            return
        try:
            stream_id = self.h2.get_next_available_stream_id()
            self.h2.send_headers(stream_id, request.headers, end_stream=not request.body)
        except h2.exceptions.NoAvailableStreamIDError:
            self.draining = True  # 2^31 streams: a new connection for the next ones
            self.client._drop_room(self)
            stream.refused(f"connection {self.label} ran out of stream ids")
            return
        except h2.exceptions.TooManyStreamsError:  # the server's limit fell below our count of its streams
            stream.refused(f"connection {self.label} is at the server's SETTINGS_MAX_CONCURRENT_STREAMS "
                           f"{self.h2.remote_settings.max_concurrent_streams}")
            return
        stream.stream_id = stream_id
        stream.done_local = not request.body
        self.streams[stream_id] = stream
        if request.body:
            self.send_body(stream)
        self.flush()

    def send_body(self, stream: H2Stream) -> None:
        """As much of the body as the stream's and the connection's send windows allow (END_STREAM on the last)."""
        request, stream_id = stream.request, stream.stream_id
        assert request is not None and stream_id is not None
        body = request.body
        while stream.offset < len(body):
            try:
                window = self.h2.local_flow_control_window(stream_id)
            except h2.exceptions.StreamClosedError:
                self.blocked.pop(stream_id, None)
                return
            size = min(window, self.h2.max_outbound_frame_size, len(body) - stream.offset)
            if size <= 0:
                self.blocked[stream_id] = stream  # sent on as WINDOW_UPDATEs arrive
                return
            end = stream.offset + size == len(body)
            self.h2.send_data(stream_id, body[stream.offset:stream.offset + size], end_stream=end)
            stream.offset += size
            stream.done_local = end
        self.blocked.pop(stream_id, None)

    def reset(self, stream_id: int, code: ErrorCodes) -> None:
        if self.closed:
            return
        try:
            self.h2.reset_stream(stream_id, code)
        except h2.exceptions.ProtocolError:
            return  # closed in h2 already (both ends done, or reset)
        self.flush()

    def acknowledge(self, size: int, stream_id: int | None) -> None:
        """Hand ``size`` received bytes back to the server's windows (the stream's while it is open)."""
        if size <= 0 or stream_id is None or self.closed:
            return
        try:
            self.h2.acknowledge_received_data(size, stream_id)
        except h2.exceptions.ProtocolError:
            pass  # a stream h2 has already forgotten: nothing to hand back for it

    def slot_freed(self) -> None:
        if self.active == 0:
            self.idle_since = time.monotonic()
            if (self.draining or self.cap == 0) and not self.closed:
                # drained: all it owed is delivered; or a server that allows no stream here: useless, and
                # listed nowhere a request looks, so nothing else would ever close it
                self.close()
                return
        self.client._offer_room(self)

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self, kind: str = "read", message: str = "the client closed the connection",
              cause: str | None = None) -> None:
        """GOAWAY, then close the transport; every stream still open fails (``kind``, ``message``, ``cause``:
        by default as closed by the client)."""
        if self.closed:
            return
        self.closed = True  # first: a stream given back below must not close it again
        self.client._forget(self)
        t = time.monotonic_ns()
        for stream in list(self.streams.values()):
            stream._end(t, kind, message, cause, None)
        if not self.settings.done():  # still opening: ``H2Client._open_connection`` settles ``ready``
            self.settings.set_exception(ConnectionClosed("the HTTP client was closed while connecting"))
        if self.transport is not None:
            if self.h2.state_machine.state != h2.connection.ConnectionState.CLOSED:  # h2 sent one for an error
                self.h2.close_connection()
            data = self.h2.data_to_send()
            if data:
                self.transport.write(data)
            self.transport.close()

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        t = time.monotonic_ns()
        if self.closed:
            return
        self.closed = True
        self.client._forget(self)
        if not self.settings.done():
            self.settings.set_exception(self._not_h2(exc))
        for stream in list(self.streams.values()):
            if not stream.complete:
                message, cause = _lost(exc, bool(stream.status))
                stream._end(t, "read", message, cause, None)

    def _not_h2(self, exc: BaseException | None) -> H2Unavailable:
        where = f"{self.target.scheme}://{self.target.host_header}"
        if self.first_bytes.startswith(b"HTTP/1."):
            return H2Unavailable(f"the server at {where} answered the HTTP/2 preface (h2c, prior knowledge) in "
                                 f"HTTP/1.1 ({self.first_bytes[:40]!r}): it does not speak h2c")
        if self.first_bytes:
            return H2Unavailable(f"the server at {where} did not answer in HTTP/2: its first bytes were "
                                 f"{self.first_bytes[:40]!r} ({exc})")
        how = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        return H2Unavailable(f"the server at {where} closed the connection before its HTTP/2 SETTINGS{how}")

    def data_received(self, data: bytes) -> None:
        t = time.monotonic_ns()  # the stamp of this read, before anything is parsed
        if not self.settings.done() and len(self.first_bytes) < 64:
            self.first_bytes += data[:64]
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._broken(exc)
            return
        handlers = _HANDLERS
        for event in events:
            handler = handlers.get(type(event))
            if handler is not None:
                handler(self, t, event)
        self.flush()

    def _broken(self, exc: h2.exceptions.ProtocolError) -> None:
        """The server broke HTTP/2 (or does not speak it): every stream fails, the connection closes."""
        if not self.settings.done():
            self.settings.set_exception(self._not_h2(exc))
        if isinstance(exc, h2.exceptions.DenialOfServiceError):
            # hpack's bound on a header list (HEAD_BYTES and HEAD_FIELDS with its per-field overhead): the
            # compression state the streams share is lost with the head, so none of them can go on
            self.close("protocol", head_message(f"{_HEADER_LIST_SIZE} bytes of HPACK header list") +
                       " (the HTTP/2 connection under it, which every stream on it shares, was closed)",
                       "header_overflow")
        else:
            self.close("protocol", f"the server broke the HTTP/2 protocol: {exc}")  # with h2's GOAWAY for it

    # ---- h2 events (from inside data_received; ``t``: the read's stamp) ------------------------------

    def _on_response(self, t: int, event: h2.events.ResponseReceived) -> None:
        stream = self.streams.get(event.stream_id or 0)
        if stream is None or stream.closed:
            return
        status = 0
        headers: dict[str, str] = {}
        for name, value in event.headers or ():
            if name[:1] == b":":
                if name == b":status":
                    try:
                        status = int(value)
                    except ValueError:  # h2 does not check it: one stream's garbage, not the connection's
                        stream._end(t, "protocol", f"the server sent :status {bytes(value)[:32]!r}, not a number",
                                    None, ErrorCodes.PROTOCOL_ERROR)
                        return
                continue
            stream.head_fields += 1
            stream.head_bytes += len(name) + len(value) + 4  # counted as HTTP/1.1's ": " and CRLF
            headers[bytes(name).decode("latin-1")] = bytes(value).decode("latin-1")
        if self._head_overflow(t, stream):
            return
        stream.status = status
        stream.headers = headers
        if stream.sink is not None:
            stream.sink.on_headers(t, status, headers)

    def _on_interim(self, t: int, event: h2.events.InformationalResponseReceived) -> None:
        stream = self.streams.get(event.stream_id or 0)
        if stream is None or stream.closed:
            return
        for name, value in event.headers or ():  # an interim head counts towards the bound, as in HTTP/1.1
            if name[:1] != b":":
                stream.head_fields += 1
                stream.head_bytes += len(name) + len(value) + 4
        self._head_overflow(t, stream)

    def _head_overflow(self, t: int, stream: H2Stream) -> bool:
        if stream.head_fields > HEAD_FIELDS:
            what = f"{HEAD_FIELDS} header fields"
        elif stream.head_bytes > HEAD_BYTES:
            what = f"{HEAD_BYTES} bytes"
        else:
            return False
        stream._end(t, "protocol", head_message(what), "header_overflow", ErrorCodes.CANCEL)
        return True

    def _on_data(self, t: int, event: h2.events.DataReceived) -> None:
        stream_id = event.stream_id or 0
        size = event.flow_controlled_length or 0
        stream = self.streams.get(stream_id)
        if stream is None or stream.sink is None:
            self.acknowledge(size, stream_id)  # a stream given back: its bytes still count against the connection
            return
        if event.data:
            stream.sink.on_body(t, event.data)
        if stream.paused and stream.attached:
            stream.held += size  # acknowledged when the reader resumes (``resume_reading``) or lets go
        else:
            self.acknowledge(size, stream_id)

    def _on_end(self, t: int, event: h2.events.StreamEnded) -> None:
        stream = self.streams.get(event.stream_id or 0)
        if stream is None or stream.closed or stream.complete:
            return
        stream.complete = True
        self.served += 1
        sink, stream.sink = stream.sink, None
        if sink is not None:
            sink.on_complete(t)

    def _on_reset(self, t: int, event: h2.events.StreamReset) -> None:
        stream = self.streams.get(event.stream_id or 0)
        if stream is None or stream.closed or stream.complete:
            return  # after a complete response, a reset only stops what is left of our upload
        code = event.error_code or 0
        if event.remote_reset and code == ErrorCodes.REFUSED_STREAM and not stream.status:
            stream.refused(f"RST_STREAM REFUSED_STREAM on connection {self.label}")
            return
        if event.remote_reset:
            stream._end(t, "read", f"the server reset the stream (RST_STREAM {_code(code)})", "reset", None)
        else:
            stream._end(t, "protocol", f"the stream broke HTTP/2 (h2 reset it: {_code(code)})", None, None)

    def _on_window(self, _t: int, event: h2.events.WindowUpdated) -> None:
        if not self.blocked:
            return
        if event.stream_id:
            stream = self.blocked.get(event.stream_id)
            if stream is not None:
                self.send_body(stream)
            return
        for stream in list(self.blocked.values()):  # the connection's window: every blocked body may go on
            self.send_body(stream)

    def _on_settings(self, _t: int, event: h2.events.RemoteSettingsChanged) -> None:
        client = self.client
        limit = self.h2.remote_settings.max_concurrent_streams
        self.cap = max(0, min(client.streams_per_connection, limit))
        client._caps[self.origin] = self.cap
        if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
            for stream in list(self.blocked.values()):
                self.send_body(stream)
        if not self.settings.done():
            self.settings.set_result(None)
        elif self.ready.done():
            client._offer_room(self)  # a raised limit makes room; a lowered one is checked as streams are placed

    def _on_goaway(self, _t: int, event: h2.events.ConnectionTerminated) -> None:
        last = event.last_stream_id if event.last_stream_id is not None else 2**31 - 1
        self.goaway = f"GOAWAY {_code(event.error_code or 0)}, last_stream_id {last}"
        self.draining = True
        self.client._drop_room(self)
        for stream_id, stream in list(self.streams.items()):
            if stream_id > last:  # never processed by the server (RFC 9113 §6.8): safe to send again
                self.reset(stream_id, ErrorCodes.CANCEL)  # closes it in h2; the server ignores it
                stream.refused(f"{self.goaway} on connection {self.label}")
        if self.active == 0:
            self.close()


_HANDLERS: dict[type[h2.events.Event], Callable[[_Connection, int, Any], None]] = {
    h2.events.ResponseReceived: _Connection._on_response,
    h2.events.InformationalResponseReceived: _Connection._on_interim,
    h2.events.DataReceived: _Connection._on_data,
    h2.events.StreamEnded: _Connection._on_end,
    h2.events.StreamReset: _Connection._on_reset,
    h2.events.WindowUpdated: _Connection._on_window,
    h2.events.RemoteSettingsChanged: _Connection._on_settings,
    h2.events.ConnectionTerminated: _Connection._on_goaway,
}


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a connection future's exception as seen: every waiter may have been cancelled before it came."""
    if not future.cancelled():
        future.exception()


class H2Client(ExchangeSlots):
    """HTTP/2 connections per origin, many streams each, O(1) to hand a stream out and take it back.

    ``connections`` bounds the exchanges in flight at once (slots, as ``H1Client``'s). A connection carries
    up to ``streams_per_connection`` streams, fewer where the server's SETTINGS_MAX_CONCURRENT_STREAMS says
    so; a connection opens only when none has room, so the connections kept (idle ones included) never
    outnumber the exchanges in flight at the busiest moment, at most ``connections``. One that carried no
    stream for ``keepalive_expiry`` is closed when next found, as HTTP/1.1's are.

    Flow control: each stream's receive window is ``stream_window`` (our SETTINGS_INITIAL_WINDOW_SIZE); the
    connection's is ``connection_window``, by default ``CONNECTION_WINDOW`` or every stream's full window at
    once if more. A paused stream (``H2Stream.pause_reading``) holds back the acknowledgement of its bytes
    for both windows (h2's ``acknowledge_received_data`` updates the two together), but since the connection
    window covers every stream's window at once, paused streams can never use it up: a slow reader stalls
    its own stream only. A smaller ``connection_window`` lets slow readers starve their neighbours, as a
    browser's small connection window would.
    """

    def __init__(
        self,
        connections: int,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10.0,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
        headers: Mapping[str, str] | None = None,
        streams_per_connection: int = 100,
        stream_window: int = 65_535,
        connection_window: int | None = None,
    ) -> None:
        super().__init__(connections)
        if not 1 <= stream_window <= _MAX_WINDOW:
            raise ValueError(f"stream_window {stream_window}: an HTTP/2 window is 1 to {_MAX_WINDOW} bytes")
        if connection_window is not None and not 65_535 <= connection_window <= _MAX_WINDOW:
            raise ValueError(f"connection_window {connection_window}: 65535 to {_MAX_WINDOW} bytes")
        self.connect_timeout = connect_timeout
        self.keepalive_expiry = keepalive_expiry
        self.streams_per_connection = max(1, streams_per_connection)
        self.stream_window = stream_window
        self.connection_window = connection_window if connection_window is not None else \
            min(_MAX_WINDOW, max(CONNECTION_WINDOW, self.streams_per_connection * stream_window))
        # what a real client sends (default: the OpenAI Python SDK's), lower-cased as HTTP/2 requires
        sent = dict(openai_python_headers(600.0) if headers is None else headers)
        sent["content-type"] = "application/json"
        if api_key:
            sent["authorization"] = f"Bearer {api_key}"
        self._base_headers = tuple(_header(name, value) for name, value in sent.items())
        self._room: dict[tuple[str, str, int], dict[_Connection, None]] = {}  # open connections with room
        self._connecting: dict[tuple[str, str, int], _Connection] = {}  # the one a crowd of requests waits on
        self._caps: dict[tuple[str, str, int], int] = {}  # the server's stream limit, as last heard per origin
        self._open: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._resending: set[H2Stream] = set()
        self.connects = 0  # connections opened, for tests and benchmarks
        self.closed = False

    def encode(self, target: Target, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> H2Request:
        """One JSON POST (compact JSON, UTF-8, as httpx encodes it): pseudo-headers, then the base headers,
        ``headers`` and Content-Length."""
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        fields = [(b":method", b"POST"), (b":scheme", target.scheme.encode()),
                  (b":authority", target.host_header.encode("latin-1")), (b":path", target.path.encode("latin-1"))]
        fields += self._base_headers
        for name, value in (headers or {}).items():
            fields.append(_header(name, value))
        fields.append((b"content-length", str(len(payload)).encode()))
        return H2Request(tuple(fields), payload)

    # ---- streams -----------------------------------------------------------------------------------

    def idle_connection(self, target: Target) -> H2Stream | None:
        """A new stream on an open connection to ``target``'s origin with room, or None (no await)."""
        room = self._room.get(target.origin)
        if not room:
            return None
        now = time.monotonic()
        while room:
            conn = next(reversed(room))
            if not conn.usable or conn.active >= conn.cap:
                del room[conn]
                continue
            if conn.active == 0 and now - conn.idle_since >= self.keepalive_expiry:
                del room[conn]
                conn.close()  # idle past the expiry: the server's own idle timer may be about to close it
                continue
            stream = H2Stream(conn)
            if conn.active >= conn.cap:
                del room[conn]
            return stream
        return None

    async def connect(self, target: Target) -> H2Stream:
        """A stream on a new connection: the one already opening for this origin while it has room for one
        more, else a new one (raises ``OSError``, ``TimeoutError`` after ``connect_timeout``, or
        ``H2Unavailable`` for a server that does not speak HTTP/2)."""
        origin = target.origin
        for _ in range(_PLACEMENTS):
            if self.closed:
                raise ConnectionClosed("the HTTP client is closed")
            conn = self._connecting.get(origin)
            if conn is None or conn.active >= conn.cap or conn.ready.done():
                conn = self._connecting[origin] = _Connection(self, target)
                self._open.add(conn)
                self._spawn(self._open_connection(conn))
            stream = H2Stream(conn)
            try:
                await asyncio.shield(conn.ready)
            except BaseException:
                stream.detach()
                raise
            if conn.usable and conn.active <= conn.cap:
                stream.reused = False
                return stream
            # the server allows fewer streams than were waiting for this connection: the last ones move on
            stream.detach()
            if conn.cap == 0:  # it allows none: another connection to it would allow none either
                conn.close()
                raise ConnectionClosed(
                    f"the server at {target.host_header} allows no stream on a new HTTP/2 connection "
                    f"(SETTINGS_MAX_CONCURRENT_STREAMS 0{'; ' + conn.goaway if conn.goaway else ''})")
            moved = self.idle_connection(target)
            if moved is not None:
                return moved
        limit = self._caps.get(origin)
        # a server that refuses connections (a GOAWAY as it opens) says why
        said = f"; the last said {conn.goaway}" if conn is not None and conn.goaway else ""
        raise ConnectionClosed(f"no HTTP/2 connection to {target.host_header} had room for the stream after "
                               f"{_PLACEMENTS} tries (the server allows {limit} streams per connection{said})")

    async def _open_connection(self, conn: _Connection) -> None:
        """Open ``conn`` (its own task: the requests waiting on it may be cancelled one by one) and settle
        ``conn.ready`` either way."""
        try:
            await self._handshake(conn)
        except BaseException as exc:
            self._not_opened(conn, exc if isinstance(exc, Exception) else
                             ConnectionClosed("the HTTP client was closed while connecting"))
            if not isinstance(exc, Exception):
                raise  # cancelled (``aclose``)
            return
        self.connects += 1
        conn.label = f"c{self.connects}"
        if self.closed or conn.closed:  # the client closed, or the server hung up, while it was opening
            self._not_opened(conn, ConnectionClosed("the HTTP client was closed while connecting") if self.closed
                             else conn._not_h2(None))
            return
        if self._connecting.get(conn.origin) is conn:
            del self._connecting[conn.origin]
        conn.ready.set_result(None)
        self._offer_room(conn)

    async def _handshake(self, conn: _Connection) -> None:
        """TCP, TLS with ALPN h2 (https) and the server's first SETTINGS, within ``connect_timeout``."""
        target = conn.target
        ssl_ctx: ssl.SSLContext | None = tls_context(("h2",)) if target.scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout):
                transport, conn.t_connected, conn.t_tls = await open_transport(
                    lambda: conn, target.host, target.port, ssl_ctx)
                if ssl_ctx is not None:
                    tls = transport.get_extra_info("ssl_object")
                    selected = tls.selected_alpn_protocol() if tls is not None else None
                    if selected != "h2":
                        raise H2Unavailable(
                            f"the server at {target.host_header} did not select HTTP/2 by ALPN (it selected "
                            f"{selected or 'nothing, so HTTP/1.1'}); use HTTP/1.1 for it (load.http version 1.1 "
                            "or auto)")
                conn.begin()
                await asyncio.shield(conn.settings)  # proof it speaks HTTP/2, and its stream limit
        except TimeoutError:
            if conn.transport is not None and not conn.settings.done():
                raise H2Unavailable(f"the server at {target.host_header} accepted the connection but sent no "
                                    f"HTTP/2 SETTINGS within {self.connect_timeout:g}s (does it speak "
                                    f"{'h2' if ssl_ctx else 'h2c, HTTP/2 with prior knowledge'}?)") from None
            raise

    def _not_opened(self, conn: _Connection, exc: Exception) -> None:
        """``conn`` did not open: closed, and ``exc`` for every request waiting on it."""
        if self._connecting.get(conn.origin) is conn:
            del self._connecting[conn.origin]
        if conn.transport is not None:
            conn.transport.close()
        conn.closed = True
        self._forget(conn)
        if not conn.ready.done():
            conn.ready.set_exception(exc)

    def release(self, stream: H2Stream, *, in_band_error: bool = False) -> None:
        """Take back a stream after its response: its slot is free for the next. Its connection stays open
        whatever the stream carried (``in_band_error`` is HTTP/1.1's concern: one stream's error says
        nothing of its neighbours', and closing the connection would cut them); a stream whose response or
        request did not end is reset (RST_STREAM CANCEL)."""
        stream.sink = None
        if stream.closed:
            return
        stream.closed = True
        if stream.task is not None:
            stream.task.cancel()
            stream.task = None
        self._resending.discard(stream)
        if stream.attached and stream.stream_id is not None and not (stream.complete and stream.done_local):
            stream.conn.reset(stream.stream_id, ErrorCodes.CANCEL)
        stream.detach()

    def _offer_room(self, conn: _Connection) -> None:
        """List ``conn`` (newest first) where requests look for a stream, if it has room."""
        if conn.usable and conn.ready.done() and conn.active < conn.cap:
            room = self._room.setdefault(conn.origin, {})
            room.pop(conn, None)
            room[conn] = None

    def _drop_room(self, conn: _Connection) -> None:
        room = self._room.get(conn.origin)
        if room is not None:
            room.pop(conn, None)

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        self._drop_room(conn)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Close every connection (GOAWAY, then the transport): every open stream fails; nothing keeps running."""
        self.closed = True
        for stream in list(self._resending):
            stream.close()
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._room.clear()
        self._connecting.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # let the transports run their close callbacks


def _header(name: str, value: str) -> tuple[bytes, bytes]:
    """One request header field as HTTP/2 sends it (name lower-cased); ValueError for one it cannot send."""
    _check_header(name, value)
    lower = name.lower()
    if lower in _CONNECTION_HEADERS or (lower == "te" and value.strip().lower() != "trailers"):
        raise ValueError(f"header {name!r} is specific to an HTTP/1.1 connection and not allowed in HTTP/2")
    return lower.encode("latin-1"), value.encode("latin-1")


async def negotiate(url: str, connect_timeout: float = 10.0) -> str:
    """Which HTTP the server at ``url`` speaks to this client: "2" when its TLS handshake selects ``h2`` by
    ALPN from our offer of h2 and http/1.1, else "1.1" (always for http://: h2c has no negotiation but the
    Upgrade dance no streaming client uses). One connection, closed at once; raises what a connect raises."""
    target = parse_target(url)
    if target.scheme != "https":
        return "1.1"
    async with asyncio.timeout(connect_timeout):
        transport, _connected, _tls = await open_transport(asyncio.Protocol, target.host, target.port,
                                                           tls_context(("h2", "http/1.1")))
    try:
        tls = transport.get_extra_info("ssl_object")
        selected = tls.selected_alpn_protocol() if tls is not None else None
    finally:
        transport.close()
    return "2" if selected == "h2" else "1.1"
