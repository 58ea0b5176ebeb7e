"""One request through the hop, both sides (``Exchange``), and how a response body is relayed: an event
stream event by event (``SseBody``), a gzip- or deflate-encoded one read by read with its events
decoded for the tap only (``EncodedBody``), anything else as it comes (``RawBody``).

The hot path, per upstream read: h11 takes the bytes, the body bytes of the read are joined and parsed
once (``EventParser.feed``), each whole event is classified, digested, stamped and written at once;
nothing is queued unless a rule paused the response. Three things end a response early, each from its
own side: a rule's cut (in order, from the relay), a ``deadline`` timer, and the client hanging up
(a task that watches the downstream socket); the last two close the upstream connection at once and
cancel the relay wherever it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
import zlib
from typing import Protocol

import h11

from .downstream import QUEUE_LIMIT, WRITE_HIGH, Down, GzipOut
from .framing import BodyReader, FramingError
from .rules import H2_ERRORS, SPLIT_PAUSE_S, Acting, RequestRules, Rule
from .sse import DONE_EVENT, EventParser, carries_reasoning, classify, digest
from .taps import Tap, headers_kept
from .upstream import (
    HEAD_LIMIT,
    HOP_BY_HOP,
    READ_SIZE,
    Origin,
    UpstreamConn,
    UpstreamFailed,
    forwarded_request_headers,
)

__all__ = ["DECODE_LIMIT", "ERROR_EVENT", "EVENT_LIMIT", "ClientGone", "Exchange", "H2Side", "HopState"]

EVENT_LIMIT = 1 << 20  # bytes of one unfinished SSE event; past it the rest of the body is relayed raw
DECODE_LIMIT = 64 << 20  # decoded bytes of an encoded body the tap parses; past it the tap stops
DISCARD_LIMIT = 1 << 20  # request-body bytes read and dropped before a rule's status answer
ERROR_EVENT = b'data: {"error": {"message": "stream cut by streamchaos", "type": "stream_cut"}}\n\n'
_DATA_KINDS = frozenset({"data", "usage", "finish", "error"})
_FRAME_KINDS = frozenset({"h2_header_leak", "h2_window"})  # request rules h2front applies, not the relay
_ERROR_DIGEST = digest(ERROR_EVENT[6:-2])
_DONE_DIGEST = digest(b"[DONE]")


class HopState(Protocol):
    """What an exchange needs of the hop it runs in."""

    name: str
    origin: Origin
    max_events: int
    in_flight: int
    requests: int
    rules: dict[str, Rule]


class H2Side(Protocol):
    """What an exchange asks of the HTTP/2 stream it runs on (``h2front.StreamPipe``, the transport's
    ``get_extra_info("h2_stream")``); on an HTTP/1.1 connection there is none."""

    reset_code: int  # the RST_STREAM error code the stream ends with if the response is cut short

    def bind(self, rules: RequestRules, tap: Tap) -> None: ...


class ClientGone(Exception):
    """The downstream client closed its connection before its request was read."""


def _header(headers: h11._headers.Headers, name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return bytes(value)
    return None


def _json_error(message: str, kind: str, code: int | None = None) -> bytes:
    error: dict[str, object] = {"message": message, "type": kind}
    if code is not None:
        error["code"] = code
    return json.dumps({"error": error}).encode()


def _log(message: str) -> None:
    print(f"streamhop: {message}", file=sys.stderr, flush=True)


class Exchange:
    """One request and its response; ``await run()`` → whether the downstream connection stays open."""

    def __init__(self, hop: HopState, conn: h11.Connection, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, request: h11.Request, upstream: UpstreamConn | None) -> None:
        now = time.monotonic_ns()
        hop.requests += 1
        hop.in_flight += 1
        self.hop, self.conn, self.reader, self.writer, self.request = hop, conn, reader, writer, request
        rid = _header(request.headers, b"x-request-id")
        self.request_id = rid.decode("latin-1") if rid else None
        self.tap = Tap(hop.name, hop.requests, self.request_id, request.target.decode("latin-1"), now,
                       hop.max_events)
        if (trace := _header(request.headers, b"traceparent")) is not None:
            self.tap.traceparent = trace.decode("latin-1")[:64]
        self.h2: H2Side | None = writer.get_extra_info("h2_stream")  # an HTTP/2 stream of h2front, or None
        self.rules = RequestRules(hop.rules.values(), self.request_id, hop.requests, hop.in_flight,
                                  http2=self.h2 is not None)
        if self.h2 is not None:  # its HTTP/2 rules act where the frames are (h2front)
            self.h2.bind(self.rules, self.tap)
        self.down = Down(writer, conn, self.tap)
        self.up = upstream
        self.stopped: str | None = None  # "deadline" | "client_gone": ended from outside the relay
        self.pump: asyncio.Task[None] | None = None
        self.watcher: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.pipelined: list[bytes] = []
        self.client_eof = False
        self.parked: h11.Response | None = None  # a head held back by a hold with headers: hold
        self.held = False
        self.finished = False
        self.deadline_rule: Acting | None = None
        self.upstream_keep_alive = False
        self.body_over: asyncio.Future[None] | None = None
        self.flow: asyncio.Task[None] | None = None

    # -- the whole request ---------------------------------------------------------------------------
    async def run(self) -> bool:
        status = self.rules.get("status")
        try:
            if status is not None:
                await self._answer_status(status)
            else:
                await self._relay()
        except ClientGone:
            self._client_gone()
        return self._keep_alive()

    async def _relay(self) -> None:
        self._arm_deadline()
        self.pump = asyncio.get_running_loop().create_task(self._pump())
        try:
            await self.pump
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.stopped is None or (current is not None and current.cancelling()):
                raise  # the hop is stopping: the connection's handler ends the exchange
        finally:
            if self.deadline is not None:
                self.deadline.cancel()
            if self.flow is not None:
                self.flow.cancel()
            if self.watcher is not None and not self.watcher.done():
                self.watcher.cancel()  # and let it go before anyone reads the socket again
                with contextlib.suppress(asyncio.CancelledError):
                    await self.watcher
        if self.stopped == "deadline":
            self._deadline_end()

    async def _pump(self) -> None:
        try:
            await self._forward_request()
            self.watcher = asyncio.get_running_loop().create_task(self._watch_client())
            response = await self._read_head()
        except UpstreamFailed as exc:
            self._bad_gateway(exc)
            return
        body = self._start_response(response)
        await self._relay_body(body, self._framing(response))
        await self.down.done()

    # -- the request side --------------------------------------------------------------------------------
    async def _next_down(self) -> h11.Event:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ClientGone(str(exc)) from exc
            if event is h11.NEED_DATA:
                try:
                    data = await self.reader.read(READ_SIZE)
                except OSError:
                    data = b""
                if not data:
                    raise ClientGone("closed during the request")
                self.conn.receive_data(data)
                continue
            if type(event) is h11.ConnectionClosed or not isinstance(event, h11.Event):
                raise ClientGone("closed during the request")
            return event

    async def _forward_request(self) -> None:
        origin = self.hop.origin
        if self.up is None or self.up.closed:
            self.up = await UpstreamConn.open(origin)
        up = self.up
        self.tap.t_upstream_open = time.monotonic_ns()
        self.tap.up_end = "open"
        headers = forwarded_request_headers(list(self.request.headers.raw_items()), origin)
        if self.conn.they_are_waiting_for_100_continue:  # answered here: the body comes before the upstream's head
            self.down.transport.write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            headers = [(n, v) for n, v in headers if n.lower() != b"expect"]
        up.send(h11.Request(method=self.request.method, target=origin.prefix.encode() + self.request.target,
                            headers=headers))
        while True:
            event = await self._next_down()
            if type(event) is h11.Data:
                up.send(h11.Data(data=event.data))
                await up.drain()
            elif type(event) is h11.EndOfMessage:
                up.send(h11.EndOfMessage())
                return

    async def _discard_body(self) -> bool:
        """Read the request body and drop it (a rule answers instead of the upstream); False when it was
        longer than ``DISCARD_LIMIT`` (the connection then closes after the answer)."""
        seen = 0
        while True:
            event = await self._next_down()
            if type(event) is h11.EndOfMessage:
                return True
            if type(event) is h11.Data:
                seen += len(event.data)
                if seen > DISCARD_LIMIT:
                    return False

    async def _watch_client(self) -> None:
        """Read the downstream socket while the response runs: an end of file is the client hanging up;
        bytes are a pipelined next request, kept for the connection (up to a head's worth)."""
        held = 0
        while held <= HEAD_LIMIT:
            try:
                data = await self.reader.read(READ_SIZE)
            except OSError:
                data = b""
            if not data:
                if self.down.complete or self.finished or self.down.closed:  # over, or we closed it ourselves
                    self.client_eof = True
                else:
                    self._client_gone()
                return
            self.pipelined.append(data)
            held += len(data)

    # -- the response head -----------------------------------------------------------------------------
    async def _read_head(self) -> h11.Response:
        assert self.up is not None
        while True:
            event = await self.up.read_head()
            if type(event) is h11.Response:
                return event
            if type(event) is h11.InformationalResponse and event.status_code != 101:
                self.down.transport.write(self.conn.send(event) or b"")
                continue
            raise UpstreamFailed(f"the upstream answered {type(event).__name__} where a response head belongs")

    def _start_response(self, response: h11.Response) -> SseBody | EncodedBody | RawBody:
        tap = self.tap
        tap.t_upstream_head = time.monotonic_ns()
        tap.status_up = response.status_code
        raw = list(response.headers.raw_items())
        tap.headers_up = headers_kept(raw)
        ctype = (_header(response.headers, b"content-type") or b"").lower()
        encoding = (_header(response.headers, b"content-encoding") or b"identity").strip().lower()
        sse = ctype.startswith(b"text/event-stream")
        headers = [(n, v) for n, v in raw if n.lower() not in HOP_BY_HOP]
        rewrite = self.rules.get("rewrite")
        if rewrite is not None:
            headers = self._rewritten(headers, rewrite, encoding != b"identity")
        if sse or self.down.gzip is not None:  # events may change length: the body is framed again
            headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
        self.down.sse = sse
        head = h11.Response(status_code=response.status_code, headers=headers, reason=response.reason)
        hold = self.rules.get("hold")
        if hold is not None and hold.params["headers"] == "hold":
            self.parked = head
        else:
            self.down.head(head)
        if not sse:
            return RawBody(self)
        if encoding in (b"gzip", b"x-gzip", b"deflate"):
            return EncodedBody(self)
        if encoding != b"identity":
            return RawBody(self)
        self.pause_for(self.rules.silence_after(0))
        return SseBody(self)

    def _rewritten(self, headers: list[tuple[bytes, bytes]], acting: Acting,
                   encoded: bool) -> list[tuple[bytes, bytes]]:
        params = acting.params
        drop = {name.encode() for name in params["remove"]}
        add: list[tuple[bytes, bytes]] = []
        if params["content_type"] is not None:
            drop.add(b"content-type")
            add.append((b"content-type", params["content_type"].encode("latin-1")))
        if params["x_accel_buffering"] is not None:
            drop.add(b"x-accel-buffering")
            add.append((b"x-accel-buffering", params["x_accel_buffering"].encode("latin-1")))
        if params["gzip"] and not encoded:
            drop |= {b"content-encoding", b"content-length"}
            add.append((b"content-encoding", b"gzip"))
            self.down.gzip = GzipOut(params["gzip_buffer_bytes"])
            acting.act("gzipped")
        acting.act("rewritten")
        return [(n, v) for n, v in headers if n.lower() not in drop] + add

    # -- the response body -----------------------------------------------------------------------------
    def _framing(self, response: h11.Response) -> BodyReader:
        """How the upstream's body is framed (RFC 9112 6.3); h11 checked the head's framing headers."""
        assert self.up is not None
        code = response.status_code
        if self.request.method == b"HEAD" or code in (204, 304):
            framing = BodyReader("length", 0)
        elif (_header(response.headers, b"transfer-encoding") or b"").lower().rstrip().endswith(b"chunked"):
            framing = BodyReader("chunked")
        elif (length := _header(response.headers, b"content-length")) is not None:
            framing = BodyReader("length", int(length))
        else:
            framing = BodyReader("close")
        connection = (_header(response.headers, b"connection") or b"").lower()
        self.upstream_keep_alive = response.http_version == b"1.1" and b"close" not in connection
        return framing

    async def _relay_body(self, body: SseBody | EncodedBody | RawBody, framing: BodyReader) -> None:
        """Relay the body from the upstream connection's ``data_received`` (``_on_body``) until it ends."""
        assert self.up is not None
        self.body_over = asyncio.get_running_loop().create_future()
        self.up.start_body(lambda data: self._on_body(body, framing, data),
                           lambda how: self._on_body_end(body, framing, how))
        await self.body_over

    def _on_body(self, body: SseBody | EncodedBody | RawBody, framing: BodyReader, data: bytes) -> None:
        """One upstream read, relayed at once: the hot path."""
        if self.body_over is None or self.body_over.done():
            return
        try:
            try:
                chunk = framing.feed(data)
            except FramingError:
                self._body_ended(body, "bare_eof")
                return
            if chunk:
                tap = self.tap
                tap.reads_up += 1
                tap.bytes_up += len(chunk)
                if body.feed(chunk, time.monotonic_ns()):
                    self._body_ended(body, None)  # a cut ended it
                    return
            if framing.done:
                assert self.up is not None
                self.up.body_done = self.upstream_keep_alive and framing.mode != "close" and not framing.pending
                self._body_ended(body, "end")
                return
            self._flow()
        except Exception as exc:  # noqa: BLE001 - raised in the pump, which reports it, not in the loop
            self.body_over.set_exception(exc)

    def _on_body_end(self, body: SseBody | EncodedBody | RawBody, framing: BodyReader, how: str) -> None:
        if self.body_over is None or self.body_over.done():
            return
        state = "reset" if how == "reset" else ("end" if framing.eof() else "bare_eof")
        try:
            self._body_ended(body, state)
        except Exception as exc:  # noqa: BLE001 - as in _on_body
            self.body_over.set_exception(exc)

    def _body_ended(self, body: SseBody | EncodedBody | RawBody, state: str | None) -> None:
        assert self.body_over is not None and self.up is not None
        self.up.stop_body()
        if state is not None:
            self._upstream_ended(body, state)
        self.body_over.set_result(None)

    def _flow(self) -> None:
        """Too much waits downstream (a slow client, a long pause): stop reading upstream until it drained."""
        down = self.down
        if self.flow is None and (down.queued > QUEUE_LIMIT or (
                not down.closed and down.transport.get_write_buffer_size() > WRITE_HIGH)):
            assert self.up is not None
            self.up.pause()
            self.flow = asyncio.get_running_loop().create_task(self._resume_upstream())

    async def _resume_upstream(self) -> None:
        try:
            await self.down.settle()
        finally:
            self.flow = None
            if self.up is not None:
                self.up.resume()

    def _upstream_ended(self, body: SseBody | EncodedBody | RawBody, state: str) -> None:
        """The upstream body ended: properly (``end``), or cut short (``bare_eof``, ``reset``), which the
        client is shown the same way: a transparent hop does not make a broken stream look whole."""
        now = time.monotonic_ns()
        if body.close(now):
            return  # its last events held a cut
        if state == "end":
            self.release_parked()
            self.tap.up_end = "done" if body.last_kind == "done" else "eof"
            self.down.end("clean")
            return
        assert self.up is not None
        self.tap.closed_upstream(now, state)
        self.up.close()
        if self.parked is not None:  # nothing was sent yet: the client gets the gateway's answer
            self.parked = None
            self._answer(502, _json_error(f"streamhop {self.hop.name}: the upstream closed before its body",
                                          "bad_gateway"), close=True)
            return
        self.down.end(state)

    def release_parked(self) -> None:
        """A head a hold kept back goes out now (queued behind the hold's pause, if any)."""
        if self.parked is not None:
            self.down.head(self.parked)
            self.parked = None

    # -- rules in the body -------------------------------------------------------------------------------
    def hold_first(self, now_ns: int) -> None:
        """The first body bytes arrived: a hold parks them (and a held head) until S s after their arrival."""
        if self.held:
            return
        self.held = True
        hold = self.rules.get("hold")
        if hold is None:
            return
        hold.act("held")
        until = now_ns / 1e9 + hold.params["seconds"]
        self.down.pause(hold.params["seconds"], hold.params["keepalive_s"], hold, until=until)
        self.release_parked()

    def pause_for(self, silences: list[Acting]) -> None:
        """The silences due now (``rules.silence_after`` or ``rules.silence_before_reasoning``), in order."""
        for silence in silences:
            silence.act("silences")
            self.down.pause(silence.params["seconds"], silence.params["keepalive_s"], silence)

    def cut(self, acting: Acting, raw: bytes, now_ns: int) -> None:
        """End the response here as the cut rule says (or an h2_rst_stream rule: the HTTP/2 stream reset
        with its error code), and close the upstream connection at once."""
        how = acting.params.get("how", "rst_stream")
        acting.act(how)
        assert self.up is not None
        self.up.close()
        self.tap.closed_upstream(now_ns, "cut")
        self.release_parked()
        if how == "rst_stream":
            if self.h2 is not None:
                self.h2.reset_code = H2_ERRORS.index(acting.params["error"])
            self.down.end("reset")  # the stream's transport aborted: RST_STREAM with that code
        elif how == "error_event":
            self.down.write(ERROR_EVENT, "error", _ERROR_DIGEST)
            self.down.write(DONE_EVENT, "done", _DONE_DIGEST)
            self.down.end("clean", label="error_event")
        elif how == "fake_done":
            self.down.write(DONE_EVENT, "done", _DONE_DIGEST)
            self.down.end("clean", label="done")
        else:
            self.down.end(how, partial=raw)

    # -- ends from outside the relay ---------------------------------------------------------------------
    def _arm_deadline(self) -> None:
        acting = self.rules.get("deadline")
        if acting is None:
            return
        delay = self.tap.t_accept / 1e9 + acting.params["seconds"] - time.monotonic()
        self.deadline = asyncio.get_running_loop().call_later(max(0.0, delay), self._deadline_fired, acting)

    def _deadline_fired(self, acting: Acting) -> None:
        if acting.rule.removed or self.stopped is not None or self.down.complete or self.down.closed:
            return
        self.stopped = "deadline"
        self.deadline_rule = acting
        acting.act("fired")
        now = time.monotonic_ns()
        if self.up is not None:
            self.up.close()
            self.tap.closed_upstream(now, "cut")
        self.down.abandon()
        if self.pump is not None:
            self.pump.cancel()

    def _deadline_end(self) -> None:
        assert self.deadline_rule is not None
        how = self.deadline_rule.params["how"]
        if not self.down.head_sent:
            self.deadline_rule.act("answered_504")
            self._answer(504, _json_error(f"streamhop {self.hop.name}: deadline exceeded", "deadline"),
                         close=True, label="deadline")
            return
        self.down.finish({"clean": "clean", "reset": "reset"}.get(how, "bare_eof"), label="deadline")

    def _client_gone(self) -> None:
        if self.stopped is not None or self.down.closed:
            return
        self.stopped = "client_gone"
        now = time.monotonic_ns()
        self.tap.t_client_gone = now
        if self.up is not None and not self.up.closed:
            self.up.close()
            self.tap.closed_upstream(now, "closed")
        self.down.abandon()
        self.down.close()
        self.tap.down_end = "client_gone"
        if self.pump is not None and not self.pump.done():
            self.pump.cancel()

    def abandon(self) -> None:
        """The hop is stopping: close both sides now."""
        now = time.monotonic_ns()
        if self.up is not None and not self.up.closed:
            self.up.close()
            self.tap.closed_upstream(now, "closed")
        if not self.down.complete and not self.down.closed:
            self.down.abandon()
            self.down.close()
            self.tap.down_end = "bare_eof"

    # -- answers of the hop's own -----------------------------------------------------------------------
    async def _answer_status(self, acting: Acting) -> None:
        complete = await self._discard_body()
        params = acting.params
        acting.act("answered")
        extra = []
        if params["retry_after_s"] is not None:
            extra.append((b"retry-after", str(math.ceil(params["retry_after_s"])).encode()))
        message = f"streamhop {self.hop.name}: rule {acting.rule.name} answers {params['code']}"
        self._answer(params["code"], _json_error(message, "streamchaos_status", params["code"]), close=not complete,
                     extra=extra, label="status")

    def _bad_gateway(self, exc: UpstreamFailed) -> None:
        _log(f"request {self.tap.seq}: {exc}")
        now = time.monotonic_ns()
        if self.up is not None:
            self.up.close()
            self.tap.closed_upstream(now, "bare_eof")
        self._answer(502, _json_error(f"streamhop {self.hop.name}: {exc}", "bad_gateway"),
                     close=self.conn.their_state is not h11.DONE)

    def _answer(self, code: int, body: bytes, *, close: bool = False,
                extra: list[tuple[bytes, bytes]] | None = None, label: str | None = None) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   *(extra or [])]
        if close:
            headers.append((b"connection", b"close"))
        self.down.abandon()
        self.down.gzip = None
        self.down.send_head(h11.Response(status_code=code, headers=headers))
        self.down.write(body)
        self.down.finish("clean", label=label)

    # -- after it ------------------------------------------------------------------------------------------
    def _keep_alive(self) -> bool:
        self.finished = True
        conn = self.conn
        if self.down.closed or self.writer.is_closing():
            return False
        if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
            return False
        conn.start_next_cycle()
        if self.pipelined:
            conn.receive_data(b"".join(self.pipelined))
        if self.client_eof:
            conn.receive_data(b"")
        return True

    def next_upstream(self) -> UpstreamConn | None:
        """The upstream connection for the connection's next request, or None (then it is closed here)."""
        up, self.up = self.up, None
        if up is None or up.reusable():
            return up
        if not up.closed:
            up.close()
            self.tap.closed_upstream(time.monotonic_ns(), "closed")
        return None

    def close_out(self) -> Tap:
        """The request is over: release its rules and the in-flight count; its tap, complete."""
        self.finished = True
        self.tap.faults = self.rules.release()
        self.hop.in_flight -= 1
        if self.tap.t_end is None:
            self.tap.t_end = time.monotonic_ns()
        return self.tap


class _Body:
    """What a response body's relay shares: its exchange, and the kind of the last event seen upstream."""

    def __init__(self, exchange: Exchange) -> None:
        self.ex = exchange
        self.last_kind = ""

    def close(self, now_ns: int) -> bool:
        """The upstream body ended: relay what is still held; True when that ended the response (a cut)."""
        return False


class RawBody(_Body):
    """A body that is not an event stream: written as it comes (a hold delays its first bytes)."""

    def feed(self, data: bytes, now_ns: int) -> bool:
        if not self.ex.held:
            self.ex.hold_first(now_ns)
        self.ex.down.write(data)
        return False


class EncodedBody(_Body):
    """An encoded event stream: relayed read by read unchanged; its events, decoded, go to the tap only
    (a read's events are stamped down when that read is written). Event rules do not act on it."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(exchange)
        self.decoder = zlib.decompressobj(47)  # gzip or zlib, told apart by its header
        self.parser = EventParser()
        self.decoded = 0

    def feed(self, data: bytes, now_ns: int) -> bool:
        ex = self.ex
        if not ex.held:
            ex.hold_first(now_ns)
        entries = self._events(data, now_ns)
        ex.down.write(data)
        for kind, dg in entries:
            ex.down.tag(kind, dg)
        return False

    def _events(self, data: bytes, now_ns: int) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while data and self.decoded < DECODE_LIMIT and not self.decoder.eof:
            try:
                plain = self.decoder.decompress(data, READ_SIZE)
            except zlib.error:
                self.decoded = DECODE_LIMIT  # not what it says it is: the tap stops reading it
                break
            data = self.decoder.unconsumed_tail
            self.decoded += len(plain)
            for raw in self.parser.feed(plain):
                kind, payload = classify(raw)
                if kind:
                    dg = digest(payload)
                    self.ex.tap.event_up(now_ns, kind, dg)
                    out.append((kind, dg))
                    self.last_kind = kind
            if self.parser.buffered > EVENT_LIMIT:
                self.parser.take()
        return out


class SseBody(_Body):
    """An event stream: parsed once per read, each whole event written at once, the rules applied to it."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(exchange)
        self.parser = EventParser()
        self.raw = False  # an event outgrew EVENT_LIMIT: the rest of the body goes as it comes
        self.count = 0  # events relayed, comments not counted (cut's and silence's after_events)
        self.reasoning = 0  # reasoning events relayed (a reasoning silence's after_events)
        self.watch_reasoning = exchange.rules.watches_reasoning
        self.data_index = 0  # data events seen (drop's and duplicate's skip_first)
        # no rule acts on its events (the HTTP/2 frame-level ones act in h2front): each written as it comes
        self.plain = all(a.rule.kind in _FRAME_KINDS for a in exchange.rules.all)
        # a cut, or an HTTP/2 stream reset after N events: whichever comes first ends the response
        cuts = [a for a in (exchange.rules.get("cut"), exchange.rules.get("h2_rst_stream")) if a is not None]
        self.cut_rule = min(cuts, key=lambda a: a.params["after_events"]) if cuts else None

    def feed(self, data: bytes, now_ns: int) -> bool:
        if self.raw:
            self.ex.down.write(data)
            return False
        if self._events(self.parser.feed(data), now_ns):
            return True
        if self.parser.buffered > EVENT_LIMIT:
            self.raw = True
            self.ex.release_parked()
            self.ex.down.write(self.parser.take())
        return False

    def _events(self, events: list[bytes], now_ns: int) -> bool:
        tap, down = self.ex.tap, self.ex.down
        for raw in events:
            kind, payload = classify(raw)
            if not kind:  # blank lines between events: relayed, not an event
                down.write(raw)
                continue
            dg = digest(payload)
            tap.event_up(now_ns, kind, dg)
            self.last_kind = kind
            if self.plain:
                down.write(raw, kind, dg)
            elif self._ruled(raw, kind, dg, now_ns, payload):
                return True
        return False

    def _ruled(self, raw: bytes, kind: str, dg: str, now_ns: int, payload: bytes) -> bool:
        ex = self.ex
        countable = kind != "comment"
        if countable and self.cut_rule is not None and self.count == self.cut_rule.params["after_events"]:
            ex.cut(self.cut_rule, raw, now_ns)
            return True
        ex.hold_first(now_ns)
        if self.watch_reasoning and kind in ("data", "finish") and carries_reasoning(payload):
            # held before it: the gap lies between two reasoning events
            ex.pause_for(ex.rules.silence_before_reasoning(self.reasoning))
            self.reasoning += 1
        copies = ex.rules.decide(kind, raw, self.data_index) if ex.rules.events else [[raw]]
        if kind in _DATA_KINDS:
            self.data_index += 1
        for writes in copies:
            for piece in writes[:-1]:
                ex.down.write(piece)
                ex.down.pause(SPLIT_PAUSE_S)
            ex.down.write(writes[-1], kind, dg)
        if countable:
            self.count += 1
            ex.pause_for(ex.rules.silence_after(self.count))
        return False

    def close(self, now_ns: int) -> bool:
        if self.raw:
            return False
        events, rest = self.parser.finish()
        if self._events(events, now_ns):
            return True
        if rest:  # an unterminated last event: relayed as it came, not an event
            self.ex.release_parked()
            self.ex.down.write(rest)
        return False
