"""HTTP/2 on the hop's listen side (``--http 2``): h2 terminated here, each stream relayed through the
hop's own HTTP/1.1 machinery (``relay.Exchange``), so every rule and both taps act on an HTTP/2 stream as
they do on an HTTP/1.1 request.

Each stream becomes one HTTP/1.1 exchange over an in-process pipe (``StreamPipe``): the request is
written by an h11 client into a ``StreamReader`` that the hop's connection handler reads as if a socket
had delivered it, and what the exchange writes to its transport (the pipe, an ``asyncio.Transport``) is
parsed back (h11 for the head, the hop's chunked reader for the body) and sent as HEADERS, then one DATA
frame per write, then END_STREAM. The hop writes one SSE event per write, so an event is one DATA frame
(split only where the client's window or its frame size cannot take it whole). Why a pipe and not a
loopback connection to the hop's own HTTP/1.1 listener: a loopback socket merges writes that leave close
together (one event per frame could not hold), and it costs a second socket pair per stream (a hop
holding 16,384 streams would need 65,536 descriptors) and two kernel copies per event.

The response head as HTTP/2 sends it: the status as ``:status``, names lower-case, the connection-scoped
headers dropped (``upstream.HOP_BY_HOP``: ``transfer-encoding``, ``connection``, ...); the tap's
``headers_down`` is what the client got. The request as the exchange reads it: ``:method`` and ``:path``,
``host`` from ``:authority``, the cookie crumbs joined (RFC 9113 8.2.3), a body framed by its
``content-length`` or else chunked (an HTTP/2 body has no length of its own: a relay that forwards it
unframed loses it).

How a stream ends:

- the response ends by its framing: END_STREAM;
- it is cut short (a ``cut``, a ``deadline``, a broken upstream body): the bytes written, then
  RST_STREAM(INTERNAL_ERROR), as nginx does when its upstream breaks off after the head
  (``ngx_http_v2_close_stream``: a stream whose output is not closed gets RST_STREAM INTERNAL_ERROR,
  PROTOCOL_ERROR after a timeout); the connection and its other streams live on;
- the rule ``h2_rst_stream``: RST_STREAM with the rule's error code (set by the relay's cut);
- the client resets it (RST_STREAM): the exchange sees its client leave at once and closes its upstream
  connection (the abort path), as for an HTTP/1.1 client that hangs up.

Flow control, both ways, bounded:

- response: DATA goes out while the client's stream and connection windows (and the socket's send
  buffer, ``SOCKET_HIGH``) have room; otherwise it waits in the stream's queue, whose size the exchange
  reads as its socket's send buffer: past ``WRITE_HIGH`` it stops reading its upstream until the client
  grants window;
- request body: the connection's window is granted back as DATA arrives (the hop buffers it, as nginx
  buffers a body's preread), each stream's as the exchange takes what arrived, not before: an exchange
  that does not read (its upstream slow to take the body) stalls its stream alone. The hop grants both
  itself (WINDOW_UPDATE by ``increment_flow_control_window``) and writes SETTINGS_INITIAL_WINDOW_SIZE
  itself: h2 applies a smaller initial window on the client's ACK to every open stream, and a stream
  whose client sent more before it read the SETTINGS then goes below zero, which h2 takes as a
  connection error (RFC 9113 6.9.2 says to tolerate it). h2's own view stays at 64 KiB a stream, more
  lenient than what the hop advertises, never stricter.

The HTTP/2 rules (``rules.H2_KINDS``): ``h2_max_streams`` (SETTINGS_MAX_CONCURRENT_STREAMS advertised to
the connections its share takes, open or new, and enforced here with REFUSED_STREAM; h2 itself would end
the whole connection), ``h2_goaway`` (a graceful GOAWAY, written here: h2 stops sending on a connection once it
has sent one), ``h2_window`` (SETTINGS_INITIAL_WINDOW_SIZE on every connection; on the streams chosen,
no WINDOW_UPDATE until ``seconds`` after the stream opened), ``h2_header_leak`` (the head of a stream
chosen, sent while the connection carries others, loses its ``content-type`` or gets a neighbour's) and
``h2_rst_stream`` (through the relay's cut). What a connection rule did is counted on the rule, its
connections (``c3``: the hop's third HTTP/2 connection) in its ``request_ids``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import h11
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hyperframe.frame import GoAwayFrame, SettingsFrame

from .downstream import WRITE_HIGH
from .framing import BodyReader, FramingError
from .rules import MAX_REQUEST_IDS, Acting, RequestRules, Rule
from .taps import Tap, headers_kept
from .upstream import HEAD_LIMIT, HOP_BY_HOP, READ_SIZE

__all__ = ["DEFAULT_MAX_STREAMS", "DEFAULT_WINDOW", "LINGER_S", "PREFACE", "SOCKET_HIGH", "FrontHop", "H2Conn",
           "H2Front", "StreamPipe", "h1_request", "sniff"]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # what an HTTP/2 client sends first (RFC 9113 3.4)
DEFAULT_MAX_STREAMS = 100  # SETTINGS_MAX_CONCURRENT_STREAMS without a rule (nginx's and h2's default)
DEFAULT_WINDOW = 65_535  # SETTINGS_INITIAL_WINDOW_SIZE without a rule (the protocol's default)
SOCKET_HIGH = 1 << 20  # bytes in a connection's socket send buffer before its streams' DATA waits
LINGER_S = 2.0  # after a GOAWAY and its FIN, how long the hop waits for the client to close
_UNENFORCED = 2**31 - 1
_INTERNAL_ERROR = int(ErrorCodes.INTERNAL_ERROR)
_NO_BODY_STATUS = (204, 304)


class FrontHop(Protocol):
    """What the HTTP/2 side needs of its hop: the rules in force, and the relay of one exchange."""

    rules: dict[str, Rule]

    def relay_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...

    def log(self, message: str) -> None: ...


class _Settings(h2.settings.Settings):
    """The local settings, whose MAX_CONCURRENT_STREAMS is advertised but never enforced by h2: h2 takes a
    stream past it as a connection error (GOAWAY, every stream lost); the hop refuses that stream alone
    with REFUSED_STREAM (RFC 9113 5.1.2 allows either), which a client may retry elsewhere."""

    @property
    def max_concurrent_streams(self) -> int:
        return _UNENFORCED

    @max_concurrent_streams.setter
    def max_concurrent_streams(self, value: int) -> None:
        self[SettingCodes.MAX_CONCURRENT_STREAMS] = value


async def sniff(reader: asyncio.StreamReader) -> bytes:
    """The first bytes of a connection in the clear: read until they are HTTP/2's preface or cannot be
    (h2c with prior knowledge, or HTTP/1.1 on the same port); what was read, for whichever takes it."""
    data = b""
    while len(data) < len(PREFACE) and PREFACE.startswith(data):
        try:
            more = await reader.read(READ_SIZE)
        except OSError:
            return data
        if not more:
            return data
        data += more
    return data


def h1_request(headers: list[tuple[bytes, bytes]], ended: bool) -> tuple[h11.Request, bool]:
    """An HTTP/2 request head as the HTTP/1.1 request the exchange reads, and whether a body follows;
    ValueError for one the hop does not relay (no :method or :path, CONNECT)."""
    pseudo: dict[bytes, bytes] = {}
    out: list[tuple[bytes, bytes]] = []
    cookies: list[bytes] = []
    for name, value in headers:
        if name.startswith(b":"):
            pseudo[name] = value
        elif name == b"cookie":
            cookies.append(value)
        else:
            out.append((name, value))
    method, path = pseudo.get(b":method"), pseudo.get(b":path")
    if not method or not path or method == b"CONNECT":
        raise ValueError("no :method or :path, or a CONNECT: not a request this hop relays")
    if not any(name == b"host" for name, _ in out):
        out.insert(0, (b"host", pseudo.get(b":authority") or b"localhost"))
    if cookies:
        out.append((b"cookie", b"; ".join(cookies)))
    sized = any(name == b"content-length" for name, _ in out)
    if not ended and not sized:
        out.append((b"transfer-encoding", b"chunked"))
    elif ended and not sized and method in (b"POST", b"PUT", b"PATCH"):
        out.append((b"content-length", b"0"))
    return h11.Request(method=method, target=path, headers=out), not ended


def _response_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    """An HTTP/1.1 response head's headers as HTTP/2 sends them: lower-case, connection-scoped ones dropped."""
    named = {v.strip().lower() for name, value in headers if name.lower() == b"connection" for v in value.split(b",")}
    return [(name.lower(), value) for name, value in headers
            if name.lower() not in HOP_BY_HOP and name.lower() not in named]


def _note(rule: Rule, conn: H2Conn, detail: str) -> None:
    """A connection rule acted on ``conn``: counted once per connection in ``acted_on`` (its label among
    the ``request_ids``), ``detail`` every time."""
    if rule not in conn.acted:
        conn.acted.add(rule)
        rule.acted_on += 1
        if len(rule.request_ids) < MAX_REQUEST_IDS:
            rule.request_ids.append(conn.label)
    rule.count(detail)


class H2Front:
    """The hop's HTTP/2 connections and the connection rules in force over them."""

    def __init__(self, hop: FrontHop) -> None:
        self.hop = hop
        self.connections: set[H2Conn] = set()
        self.opened = 0  # connections so far: the next one is c{opened + 1}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes = b"") -> None:
        """One HTTP/2 connection until either side ends it; ``initial``: bytes already read from it."""
        self.opened += 1
        conn = H2Conn(self, reader, writer, self.opened)
        self.connections.add(conn)
        try:
            await conn.run(initial)
        finally:
            self.connections.discard(conn)
            conn.close()

    def rules_changed(self) -> None:
        for conn in list(self.connections):
            conn.apply_rules()

    def in_force(self, kind: str) -> list[Rule]:
        return [rule for rule in self.hop.rules.values() if rule.kind == kind]

    def max_streams(self, label: str) -> tuple[int, Rule | None]:
        """The concurrent streams connection ``label`` advertises, and the rule that says so (the lowest of
        those whose share takes it)."""
        rules = [rule for rule in self.in_force("h2_max_streams") if rule.selects(label)]
        if not rules:
            return DEFAULT_MAX_STREAMS, None
        rule = min(rules, key=lambda r: int(r.params["streams"]))
        return int(rule.params["streams"]), rule

    def initial_window(self) -> tuple[int, Rule | None]:
        """The initial stream window every connection advertises, and the rule that says so (the first put)."""
        rules = self.in_force("h2_window")
        return (int(rules[0].params["bytes"]), rules[0]) if rules else (DEFAULT_WINDOW, None)

    def status(self) -> dict[str, int]:
        return {"connections": len(self.connections), "opened": self.opened,
                "streams": sum(len(c.streams) for c in self.connections)}


class H2Conn:
    """One HTTP/2 connection: its h2 state, its streams, and the connection rules as they act on it."""

    def __init__(self, front: H2Front, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 number: int) -> None:
        self.front, self.reader, self.writer = front, reader, writer
        self.transport = writer.transport
        self.label = f"c{number}"
        self.t_open = time.monotonic_ns()
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.max_streams, max_rule = front.max_streams(self.label)
        self.h2.local_settings = _Settings(client=False, initial_values={
            SettingCodes.MAX_CONCURRENT_STREAMS: self.max_streams,
            SettingCodes.MAX_HEADER_LIST_SIZE: h2.connection.H2Connection.DEFAULT_MAX_HEADER_LIST_SIZE})
        self.window = DEFAULT_WINDOW  # the initial stream window advertised (a rule's: after the first SETTINGS)
        self.streams: dict[int, StreamPipe] = {}  # open on the hop's side: no END_STREAM or RST_STREAM sent yet
        self.waiting: dict[int, StreamPipe] = {}  # streams whose DATA waits for window or the socket
        self.highest = 0  # the highest stream id accepted (a GOAWAY's last stream id)
        self.accepted = 0  # streams accepted so far
        self.last_stream: int | None = None  # a GOAWAY went out: the last stream this connection serves
        self.goaway_rule: Rule | None = None
        self.plain_type: bytes | None = None  # the last content-type other than an event stream sent here
        self.acted: set[Rule] = set()  # the connection rules that acted on it (counted once each)
        self.closed = False
        self.write_closed = False  # a FIN went out after the GOAWAY: nothing more is written
        self.drainer: asyncio.Task[None] | None = None
        if max_rule is not None:
            _note(max_rule, self, "settings_sent")

    async def run(self, initial: bytes) -> None:
        self.h2.initiate_connection()
        self.apply_rules()
        data = initial
        while not self.closed:
            if data:
                self._receive(data)
                if self.closed:
                    break
            try:
                data = await self.reader.read(READ_SIZE)
            except OSError:
                data = b""
            if not data:
                break

    # -- the rules that act on connections ---------------------------------------------------------------
    def apply_rules(self) -> None:
        """Bring the connection in line with the rules in force: its advertised settings, a GOAWAY due."""
        if self.closed:
            return
        limit, rule = self.front.max_streams(self.label)
        if limit != self.max_streams:
            self.max_streams = limit
            self.h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: limit})
            if rule is not None:
                _note(rule, self, "settings_sent")
        window, window_rule = self.front.initial_window()
        if window != self.window:
            # in a SETTINGS frame of its own after the connection's first, written here (the module's
            # docstring): a client may send 64 KiB on its first stream before it reads any of them
            self.window = window
            frame = SettingsFrame(0)
            frame.settings = {SettingCodes.INITIAL_WINDOW_SIZE: window}
            self.flush()
            self._write(frame.serialize())
            if window_rule is not None:
                window_rule.count("settings_sent")
        self._goaway_due()
        self.flush()

    def _goaway_due(self) -> None:
        if self.last_stream is not None:
            return
        for rule in self.front.in_force("h2_goaway"):
            if not rule.selects(self.label):
                continue
            after = rule.params["after_streams"]
            # without after_streams: the connections open when the rule was put, once
            due = self.t_open < rule.t_active if after is None else self.accepted >= after
            if due:
                self.goaway(rule)
                return

    def goaway(self, rule: Rule) -> None:
        """A graceful GOAWAY (NO_ERROR): the streams accepted so far finish, later ones are refused, the
        connection closes when the last one ends. Written here, beside h2: once h2 has sent a GOAWAY it
        refuses to send anything more, the in-flight streams' DATA included."""
        self.flush()
        frame = GoAwayFrame(0)
        frame.last_stream_id = self.highest
        frame.error_code = int(ErrorCodes.NO_ERROR)
        self.last_stream, self.goaway_rule = self.highest, rule
        self._write(frame.serialize())
        _note(rule, self, "goaway_sent")
        self.maybe_close()

    # -- frames in ---------------------------------------------------------------------------------------
    def _receive(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self.front.hop.log(f"HTTP/2 connection {self.label}: {exc!r}; closed")
            self.flush()  # h2 queued a GOAWAY that says why
            self.close()
            return
        for event in events:
            self._event(event)
        self.flush()

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.DataReceived):
            size = event.flow_controlled_length or 0
            self.grant(None, size)  # the connection's window: the bytes are the hop's now
            pipe = self.streams.get(event.stream_id)
            if pipe is not None:
                pipe.request_data(event.data or b"", size)
        elif isinstance(event, h2.events.StreamEnded):
            pipe = self.streams.get(event.stream_id)
            if pipe is not None:
                pipe.request_end()
        elif isinstance(event, h2.events.StreamReset):
            pipe = self.streams.get(event.stream_id)
            if pipe is not None:
                pipe.client_reset()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self.send_waiting()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # the client's GOAWAY: h2 sends nothing more on this connection, so its streams end here
            self.close()

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        assert sid is not None and event.headers is not None
        if self.last_stream is not None and sid > self.last_stream:
            self._refuse(sid, self.goaway_rule)  # after our GOAWAY: the client retries on a new connection
            return
        if len(self.streams) >= self.max_streams:
            self._refuse(sid, self.front.max_streams(self.label)[1])
            return
        try:
            request, body = h1_request(list(event.headers), bool(event.stream_ended))
        except (ValueError, h11.LocalProtocolError) as exc:
            self.front.hop.log(f"HTTP/2 connection {self.label} stream {sid}: {exc}; reset")
            with contextlib.suppress(h2.exceptions.StreamClosedError):  # the client reset it in the same read
                self.h2.reset_stream(sid, ErrorCodes.PROTOCOL_ERROR)
            return
        pipe = StreamPipe(self, sid, request, body)
        self.streams[sid] = pipe
        self.highest = max(self.highest, sid)
        self.accepted += 1
        _, rule = self.front.max_streams(self.label)
        if rule is not None:
            rule.details["most_open"] = max(rule.details.get("most_open", 0), len(self.streams))
        if pipe.start():
            self.front.hop.relay_stream(pipe.reader, pipe.writer)
        self._goaway_due()

    def _refuse(self, sid: int, rule: Rule | None) -> None:
        try:
            self.h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
        except h2.exceptions.StreamClosedError:
            # the client reset it in the same read as it opened it (a client that read our GOAWAY after
            # sending the stream cancels it): already closed, nothing to refuse
            return
        if rule is not None:
            _note(rule, self, "streams_refused")

    # -- frames out --------------------------------------------------------------------------------------
    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self._write(data)

    def _write(self, data: bytes) -> None:
        if not self.write_closed and not self.transport.is_closing():
            self.writer.write(data)

    def grant(self, sid: int | None, size: int) -> None:
        """WINDOW_UPDATE of ``size`` bytes for stream ``sid`` (None: the connection)."""
        if size <= 0 or self.closed:
            return
        try:
            self.h2.increment_flow_control_window(size, stream_id=sid)
        except (h2.exceptions.ProtocolError, KeyError, ValueError):  # the stream is closed, or gone
            pass

    def room(self, sid: int) -> int:
        """Bytes of DATA stream ``sid`` may send now (-1: the stream or the connection is gone)."""
        if self.closed:
            return -1
        if self.transport.get_write_buffer_size() > SOCKET_HIGH:
            self._wait_socket()
            return 0
        try:
            # a window may go below zero (RFC 9113 6.9.2: a client that lowers its initial window): nothing
            # fits until its WINDOW_UPDATE, which is waiting, not a stream gone
            return max(0, int(self.h2.local_flow_control_window(sid)))
        except h2.exceptions.ProtocolError:
            return -1

    def send_data(self, sid: int, data: bytes, end: bool) -> bool:
        """``data`` as DATA frames (one, unless it is larger than the client's frame size), END_STREAM with
        the last when ``end``; False when the stream is gone."""
        try:
            if not data:
                if end:
                    self.h2.end_stream(sid)
            else:
                size = self.h2.max_outbound_frame_size
                for at in range(0, len(data), size):
                    self.h2.send_data(sid, data[at:at + size], end_stream=end and at + size >= len(data))
        except h2.exceptions.ProtocolError:
            return False
        self.flush()
        return True

    def send_waiting(self) -> None:
        for pipe in list(self.waiting.values()):
            pipe.send_pending()
        self.flush()

    def _wait_socket(self) -> None:
        if self.drainer is None:
            self.drainer = asyncio.get_running_loop().create_task(self._drained())

    async def _drained(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self.drainer = None
        self.send_waiting()

    # -- ends --------------------------------------------------------------------------------------------
    def stream_over(self, pipe: StreamPipe) -> None:
        self.streams.pop(pipe.sid, None)
        self.waiting.pop(pipe.sid, None)
        self.maybe_close()

    def maybe_close(self) -> None:
        """After a GOAWAY: close once the last stream it lets finish has ended. In the clear, by a FIN
        after what is queued, then the client's own close (or ``LINGER_S``): a socket closed with unread
        bytes in it is reset, and a reset may reach the client before the GOAWAY it should read."""
        if self.last_stream is None or self.streams or self.closed or self.write_closed:
            return
        self.flush()
        if not self.transport.can_write_eof():  # TLS: its close_notify follows what is queued
            self.close()
            return
        self.write_closed = True
        self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_S, self.close)

    def close(self) -> None:
        """The connection ends: its streams still open end as their clients' hang-ups."""
        if self.closed:
            return
        self.closed = True
        for pipe in list(self.streams.values()):
            pipe.client_reset()
        if self.drainer is not None:
            self.drainer.cancel()
        self.flush()
        self.writer.close()


class StreamPipe(asyncio.Transport):
    """One HTTP/2 stream as the hop's HTTP/1.1 machinery sees it: a reader with the request, and this
    transport, whose writes are the response (see the module's docstring)."""

    def __init__(self, conn: H2Conn, sid: int, request: h11.Request, has_body: bool) -> None:
        super().__init__()
        self.conn, self.sid, self.request, self.has_body = conn, sid, request, has_body
        self.t_open = time.monotonic()
        self.reader = asyncio.StreamReader(limit=READ_SIZE)
        self.protocol = asyncio.StreamReaderProtocol(self.reader)
        self.protocol.connection_made(self)
        self.writer = asyncio.StreamWriter(self, self.protocol, self.reader, asyncio.get_running_loop())
        # the exchange's peer: writes the request, reads the response
        self.h1 = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)
        self.body: BodyReader | None = None  # the response body's framing, once its head was sent
        self.pending: deque[tuple[bytes, bool]] = deque()  # DATA waiting for window: (bytes, END_STREAM)
        self.pending_bytes = 0
        self.high, self.low = WRITE_HIGH, WRITE_HIGH // 4
        self.writing_paused = self.reading_paused = False
        self.request_done = False  # the request's end went to the exchange
        self.complete = False  # the response's END_STREAM is queued
        self.finished = False  # END_STREAM or RST_STREAM sent, or the client reset it: over on the hop's side
        self.closing = False  # the exchange closed this transport
        self.gone = False  # the client reset the stream (or the connection ended)
        self.reset_code = _INTERNAL_ERROR  # RST_STREAM's code if the response is cut short (relay.H2Side)
        self.bound = False  # the exchange took its rules (``bind``)
        self.tap: Tap | None = None
        self.leak: Acting | None = None
        self.starve: Acting | None = None
        self.starving: asyncio.TimerHandle | None = None
        self.stalled = False  # the client ran out of window while this stream was starved
        self.unacked = 0  # request-body bytes received and not yet granted back

    # -- the request, from the client -----------------------------------------------------------------
    def start(self) -> bool:
        """Hand the request head (and its end, if it has no body) to the exchange; False when it cannot be."""
        try:
            data = self.h1.send(self.request) or b""
            if not self.has_body:
                data += self.h1.send(h11.EndOfMessage()) or b""
                self.request_done = True
        except h11.LocalProtocolError:  # a content-length the body cannot have (none follows)
            self._reset(int(ErrorCodes.PROTOCOL_ERROR))
            return False
        self.reader.feed_data(data)
        return True

    def request_data(self, data: bytes, size: int) -> None:
        if self.gone or self.closing or self.request_done:
            return
        try:
            out = self.h1.send(h11.Data(data=data)) if data else b""
        except h11.LocalProtocolError:  # more body than its content-length said
            self._reset(int(ErrorCodes.PROTOCOL_ERROR))
            return
        if out:
            self.reader.feed_data(out)
        self.unacked += size
        self._check_stall()
        self.grant()

    def _check_stall(self) -> None:
        if self.starving is not None and not self.stalled and self.unacked >= self.conn.window:
            # nothing granted yet, and all the window advertised is used: the client has to wait for the grant
            self.stalled = True
            assert self.starve is not None
            self.starve.act("streams_stalled")

    def request_end(self) -> None:
        if self.request_done or self.gone or self.closing:
            return
        self.request_done = True
        try:
            out = self.h1.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:  # less body than its content-length said
            self._reset(int(ErrorCodes.PROTOCOL_ERROR))
            return
        if out:
            self.reader.feed_data(out)

    def grant(self) -> None:
        """Window back for what the exchange has taken: not while its reader is full, not before it has
        taken its rules (an h2_window rule may withhold it), not while this stream is starved."""
        if not self.unacked or self.reading_paused or not self.bound or self.starving is not None:
            return
        size, self.unacked = self.unacked, 0
        if not self.request_done:  # after its END_STREAM a stream takes no more body: no window to give
            self.conn.grant(self.sid, size)
            self.conn.flush()

    def bind(self, rules: RequestRules, tap: Tap) -> None:
        """The exchange's rules and tap (``relay.H2Side``): the HTTP/2 ones act here."""
        self.bound, self.tap = True, tap
        self.leak = rules.get("h2_header_leak")
        starve = rules.get("h2_window")
        if starve is not None and self.has_body:
            delay = self.t_open + float(starve.params["seconds"]) - time.monotonic()
            if delay > 0:
                self.starve = starve
                self.starving = asyncio.get_running_loop().call_later(delay, self._fed)
                self._check_stall()
        self.grant()

    def _fed(self) -> None:
        self.starving = None
        if self.starve is not None and self.unacked:
            self.starve.rule.count("bytes_granted_late", self.unacked)
        self.grant()

    def client_reset(self) -> None:
        """The client reset the stream (or its connection ended): the exchange sees its client leave."""
        if self.gone:
            return
        self.gone = True
        self._drop_pending()
        self._finish()
        self.reader.feed_eof()

    # -- the response, from the exchange ------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.finished or self.complete or self.closing:
            return
        if self.body is None:
            self._head(bytes(data))
        else:
            self._data(bytes(data))

    def _head(self, data: bytes) -> None:
        self.h1.receive_data(data)
        while self.body is None:
            try:
                event = self.h1.next_event()
            except h11.RemoteProtocolError:
                self._reset(_INTERNAL_ERROR)
                return
            if event is h11.NEED_DATA:
                return
            if type(event) is h11.InformationalResponse:
                if event.status_code != 101:
                    self._send_head(event.status_code, list(event.headers.raw_items()), informational=True)
                continue
            if type(event) is not h11.Response:
                self._reset(_INTERNAL_ERROR)
                return
            self._response(event)
            rest = self.h1.trailing_data[0]
            if rest:
                self._data(bytes(rest))
            elif self.body is not None and self.body.done:
                self._queue(b"", True)

    def _response(self, response: h11.Response) -> None:
        raw = list(response.headers.raw_items())
        headers = _response_headers(raw)
        ctype = next((v for n, v in headers if n == b"content-type"), None)
        sse = ctype is not None and ctype.lower().startswith(b"text/event-stream")
        if sse and self.leak is not None:
            headers = self._leaked(headers)
        elif ctype is not None and not sse:
            self.conn.plain_type = ctype
        code = response.status_code
        framing = {n.lower(): v for n, v in raw}
        if self.request.method == b"HEAD" or code in _NO_BODY_STATUS:
            self.body = BodyReader("length", 0)
        elif framing.get(b"transfer-encoding", b"").lower().rstrip().endswith(b"chunked"):
            self.body = BodyReader("chunked")
        elif b"content-length" in framing:
            self.body = BodyReader("length", int(framing[b"content-length"]))
        else:
            self.body = BodyReader("close")
        self._send_head(code, headers)

    def _send_head(self, code: int, headers: list[tuple[bytes, bytes]], informational: bool = False) -> None:
        if not informational and self.tap is not None:
            self.tap.headers_down = headers_kept(headers)  # what the client got, not the HTTP/1.1 head
        try:
            self.conn.h2.send_headers(self.sid, [(b":status", str(code).encode()), *headers])
        except (h2.exceptions.ProtocolError, ValueError, TypeError) as exc:
            self.conn.front.hop.log(f"HTTP/2 connection {self.conn.label} stream {self.sid}: head refused: {exc}")
            self._reset(_INTERNAL_ERROR)
            return
        self.conn.flush()

    def _leaked(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """h2_header_leak: a head sent while the connection carries other streams loses its content-type,
        or takes a neighbour's (the last non-event-stream one sent on this connection, else JSON's)."""
        assert self.leak is not None
        if len(self.conn.streams) < 2:
            self.leak.rule.count("alone")  # chosen, but alone on its connection: nothing to mix it up with
            return headers
        rest = [(n, v) for n, v in headers if n != b"content-type"]
        if self.leak.params["how"] == "drop":
            self.leak.act("content_type_dropped")
            return rest
        self.leak.act("content_type_replaced")
        return [*rest, (b"content-type", self.conn.plain_type or b"application/json")]

    def _data(self, data: bytes) -> None:
        assert self.body is not None
        try:
            chunk = self.body.feed(data)
        except FramingError:
            self._reset(_INTERNAL_ERROR)
            return
        if chunk or self.body.done:
            self._queue(chunk, self.body.done)

    def _queue(self, data: bytes, end: bool) -> None:
        if end:
            self.complete = True  # is_closing() from now on: the exchange's connection handler lets it go
        self.pending.append((data, end))
        self.pending_bytes += len(data)
        self.send_pending()
        if self.pending_bytes > self.high and not self.writing_paused:
            self.writing_paused = True
            self.protocol.pause_writing()

    def send_pending(self) -> None:
        """What waits, in order, as far as the client's windows and the socket allow."""
        while self.pending and not self.finished:
            data, end = self.pending[0]
            room = self.conn.room(self.sid)
            if room < 0:
                self._drop_pending()
                break
            if data and room == 0:
                break
            if len(data) > room:  # a write larger than the window left: as much as fits, the rest later
                self.pending[0] = (data[room:], end)
                self.pending_bytes -= room
                self.conn.send_data(self.sid, data[:room], False)
                break
            self.pending.popleft()
            self.pending_bytes -= len(data)
            if not self.conn.send_data(self.sid, data, end):
                self._drop_pending()
                self._finish()
            elif end:
                self._finish()
        if self.pending and not self.finished:
            self.conn.waiting[self.sid] = self
        else:
            self.conn.waiting.pop(self.sid, None)
        if self.writing_paused and self.pending_bytes <= self.low:
            self.writing_paused = False
            self.protocol.resume_writing()

    def _drop_pending(self) -> None:
        self.pending.clear()
        self.pending_bytes = 0
        if self.writing_paused:
            self.writing_paused = False
            self.protocol.resume_writing()

    # -- ends --------------------------------------------------------------------------------------------
    def _reset(self, code: int) -> None:
        if self.finished:
            return
        self._drop_pending()
        try:
            self.conn.h2.reset_stream(self.sid, code)
        except h2.exceptions.ProtocolError:
            pass
        self._finish()
        self.conn.flush()

    def _finish(self) -> None:
        """The stream is over on the hop's side (the connection's window was granted as its bytes came)."""
        if self.finished:
            return
        self.finished = True
        if self.starving is not None:
            self.starving.cancel()
            self.starving = None
        self.unacked = 0
        self.conn.stream_over(self)

    def _closed(self, reset: bool) -> None:
        """The exchange closed (or aborted) its transport: a response not complete by then is cut short."""
        if self.closing:
            return
        self.closing = True
        if not self.complete and not self.finished:
            if not reset and self.body is not None and self.body.mode == "close":
                self._queue(b"", True)  # a body to the connection's end: this is its end
            else:
                self._reset(self.reset_code if reset else _INTERNAL_ERROR)
        self.reader.feed_eof()
        asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    # -- the rest of asyncio.Transport -------------------------------------------------------------------
    def close(self) -> None:
        self._closed(reset=False)

    def abort(self) -> None:
        self._closed(reset=True)

    def is_closing(self) -> bool:
        return self.closing or self.gone or self.complete

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "h2_stream":
            return self
        if name in ("peername", "sockname"):
            return self.conn.writer.get_extra_info(name, default)
        return default  # no socket: nodelay and a linger reset have nothing to set

    def get_write_buffer_size(self) -> int:
        return self.pending_bytes

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.low, self.high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = WRITE_HIGH if high is None else high
        self.low = self.high // 4 if low is None else low

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False
        self.grant()

    def is_reading(self) -> bool:
        return not self.reading_paused

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise NotImplementedError("an HTTP/2 stream's pipe keeps its protocol")
