"""One streaming request → a filled ``StreamRecord``, shaped by the request's ``ClientPlan``.

The request goes over ``chaos.load.http1`` (an asyncio Protocol per keep-alive connection, httptools
for framing) or ``chaos.load.http2`` (one per HTTP/2 connection, ``h2`` for framing, a stream per
request): its cost per event is flat in the number of streams, where httpx's pool was O(N) per
response close. Stamps, all from ``time.monotonic_ns()``:

- ``t_sent``: when the request leaves this process: the start of the TCP connect on a new
  connection, the write of the request bytes on a kept-alive one;
- ``t_headers``, ``t_first_byte`` and every event: the socket read that delivered the bytes, taken
  in ``data_received`` before any parsing, so parsing cost never shows up as server latency.

A client that reads as the bytes come (no pacing in its plan) is fed straight from
``data_received`` and its task wakes once per request, not once per read. A slow or impatient
client (read delay, byte-rate cap, per-read timeout) consumes reads from a queue in its own task,
and the socket is not read while it holds unread bytes (``pause_reading``), so the kernel buffers
fill and the server feels the back-pressure (over HTTP/2 the stream's flow-control window is not
reopened instead: the server stalls on that stream alone). A hang-up closes the TCP connection (resets
the HTTP/2 stream); a stream that ended cleanly gives its connection back for the slot's next request.

Nothing here raises for what a server does wrong: errors, early closes and malformed events all
end up as fields of the record. Only cancellation (the generator draining) propagates, after the
record has been marked ``cancelled``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from chaos.load.encoding import BodyDecoder, DecodeError, decoder_for
from chaos.load.http1 import ConnectionClosed, H1Client, ResponseSink, Target
from chaos.load.limits import HEADER_VALUE_CHARS, ContentLimits
from chaos.load.sse import DEFAULT_MAX_EVENT_BYTES, SSEEvent, SSEOverflow, SSEParser
from chaos.model.context import ClientPlan
from chaos.model.observations import ErrorInfo, Hangup, StreamRecord, foreign_content_type

__all__ = ["HttpConnection", "StreamCall", "StreamClient", "make_http_client", "not_event_stream", "stream_request"]

_BODY_LIMIT = 64 * 1024  # how much of an error body to read
_RATE_SLICE_S = 0.05  # a rate-capped reader consumes this much time's worth of bytes per step
_WORDS = 500  # what a record keeps of a target's words (an error event's message)
_FINISH_CHARS = 64  # of a finish_reason ("stop", "length", "tool_calls", ...)
_USAGE_KEYS = 32  # of a usage object: its numbers, and one level of nested numbers (prompt_tokens_details)
_TOOL_CALLS = 64  # tool calls (distinct indexes) a record assembles; a fragment for one more is a protocol break
_TOOL_WORDS = 256  # of a tool call's id and of its function name
_SURROGATE = re.compile("[\ud800-\udfff]")  # a JSON "\ud800" decodes to a str no UTF-8 file can hold


class HttpConnection(Protocol):
    """What a request uses of the connection it goes on: an HTTP/1.1 ``chaos.load.http1.Connection`` or an
    HTTP/2 stream (``chaos.load.http2.H2Stream``); the rest is read for the record (``_describe``)."""

    @property
    def protocol(self) -> str: ...
    @property
    def conn_label(self) -> str: ...
    @property
    def stream_id(self) -> int | None: ...
    @property
    def reused(self) -> bool: ...
    @property
    def t_connected(self) -> int | None: ...
    @property
    def t_tls(self) -> int | None: ...
    @property
    def t_request(self) -> int | None: ...

    def send(self, payload: Any, sink: ResponseSink, label: str = "") -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def close(self) -> None: ...


class StreamClient(Protocol):
    """A load client of either protocol (``H1Client``, ``chaos.load.http2.H2Client``). ``encode`` makes an
    opaque request (bytes for HTTP/1.1, an ``H2Request`` for HTTP/2) that only that client's connections
    send, and ``release`` takes back only the connections it handed out: hence ``Any`` there."""

    @property
    def limit(self) -> int: ...
    @property
    def connect_timeout(self) -> float: ...
    @property
    def connects(self) -> int: ...
    @property
    def closed(self) -> bool: ...

    def target(self, url: str) -> Target: ...
    def encode(self, target: Target, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> Any: ...
    async def acquire_slot(self) -> None: ...
    def take_slot(self) -> bool: ...
    def release_slot(self) -> None: ...
    def idle_connection(self, target: Target) -> HttpConnection | None: ...
    async def connect(self, target: Target) -> HttpConnection: ...
    def release(self, conn: Any, *, in_band_error: bool = False) -> None: ...
    async def aclose(self) -> None: ...
    async def __aenter__(self) -> StreamClient: ...
    async def __aexit__(self, *exc: object) -> None: ...


def make_http_client(connections: int, *, api_key: str | None = None, connect_timeout: float = 10.0,
                     headers: Mapping[str, str] | None = None, version: str = "1.1",
                     streams_per_connection: int = 100, stream_window: int = 65_535,
                     reuse: bool = True) -> StreamClient:
    """A keep-alive client with ``connections`` exchange slots: HTTP/1.1 (``version`` "1.1": up to that many
    idle connections kept per origin) or HTTP/2 ("2": ``streams_per_connection`` streams on a connection,
    each with a ``stream_window``-byte receive window; ``chaos.load.http2``). ``headers``: sent with every
    request (default: the OpenAI Python SDK's, ``chaos.load.sdk_headers``). "auto" is decided before
    (``chaos.load.http2.negotiate``). ``reuse`` False: HTTP/1.1 opens a connection per request
    (``load.http.keep_alive``, ``chaos.load.keepalive``)."""
    if version == "2":
        from chaos.load.http2 import H2Client

        return H2Client(connections, api_key=api_key, connect_timeout=connect_timeout, headers=headers,
                        streams_per_connection=streams_per_connection, stream_window=stream_window)
    if version != "1.1":
        raise ValueError(f"HTTP version {version!r}: expected 1.1 or 2 (auto is decided before, by ALPN)")
    return H1Client(connections, api_key=api_key, connect_timeout=connect_timeout, headers=headers, reuse=reuse)


class _Hangup(Exception):
    """Internal: the plan says hang up now."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Failed(Exception):
    """Internal: the stream failed (``kind`` and ``cause`` as in ``ErrorInfo``)."""

    def __init__(self, kind: str, message: str, cause: str | None = None) -> None:
        self.kind = kind
        self.message = message
        self.cause = cause


class _HttpError(Exception):
    """Internal: a non-2xx response, its (bounded) body read."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


class _Stream:
    """The per-request state machine fed with (stamp, bytes)."""

    def __init__(self, record: StreamRecord, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
                 limits: ContentLimits | None = None) -> None:
        self.record = record
        self.parser = SSEParser(max_event_bytes)
        self.limits = limits or ContentLimits.for_tokens(record.max_tokens)
        self.body_bytes = 0  # body bytes parsed (after a Content-Encoding), against ``limits.body_bytes``
        self.text_chars = 0  # characters of content kept, against ``limits.text_chars``
        self.decoder: BodyDecoder | None = None  # a compressed body (Content-Encoding), set with the headers
        self.text: list[str] = []
        self.reasoning: list[str] = []  # reasoning text (delta.reasoning_content / delta.reasoning)
        self.arguments: dict[str, list[str]] = {}  # each tool call's argument fragments, by index
        self.finished = False
        self.framing: str | None = None  # why a 2xx response is not an event stream (its Content-Type)
        self.last_data: str | None = None  # the payload of the event before, to count repeated ones
        self.last_id: str | None = None

    def feed(self, t: int, chunk: bytes) -> None:
        rec = self.record
        rec.read_count += 1
        rec.bytes_received += len(chunk)
        if rec.t_first_byte is None:
            rec.t_first_byte = t
        if self.decoder is None:
            self._parse(t, chunk)
            return
        try:
            for piece in self.decoder.decode(chunk):  # what this read completes keeps this read's stamp
                self._parse(t, piece)
        except DecodeError as exc:
            raise _Failed("protocol", str(exc)) from None

    def _parse(self, t: int, chunk: bytes) -> None:
        room = self.limits.body_bytes - self.body_bytes
        self.body_bytes += len(chunk)
        over = len(chunk) > room
        if over:
            chunk = chunk[: max(0, room)]  # what fits is parsed; the stream ends at the budget
        try:
            events = self.parser.feed(chunk)
        except SSEOverflow as exc:
            for event in exc.events:
                self.event(t, event)
            self.record.sse_errors += 1  # the stream is abandoned: one framing error, and a protocol failure
            raise _Failed("protocol", str(exc)) from None
        for event in events:
            self.event(t, event)
        if over:
            raise _Failed("protocol", self.limits.bytes_message(), "content_overflow")

    def finish(self, t: int, *, flush: bool = True) -> None:
        """Close the books; ``flush``: the body ended, so an unterminated last event still counts."""
        if self.finished:
            return
        self.finished = True
        if flush:
            self._flush(t)
        rec = self.record
        rec.utf8_errors = self.parser.utf8_errors
        rec.split_chars = self.parser.split_chars
        rec.text = _scrubbed("".join(self.text))
        rec.reasoning_text = _scrubbed("".join(self.reasoning))
        for key, pieces in self.arguments.items():
            if rec.tool_calls is not None and key in rec.tool_calls:
                rec.tool_calls[key]["arguments"] = _scrubbed("".join(pieces))
        if self.framing is not None and rec.error is None and rec.hangup is None:
            # a stream that is not labelled one fails as a protocol error, so every verdict that counts
            # failures (errors, early_close) names its Content-Type, whichever the experiment lists
            rec.error = ErrorInfo("protocol", self.framing)

    def _flush(self, t: int) -> None:
        """The body ended: what a compressed body still held, and an unterminated last event."""
        if self.decoder is not None:
            try:
                tail = self.decoder.flush()
            except DecodeError:
                tail = b""
                self.record.sse_errors += 1  # the compressed body ended broken
            if tail:
                try:
                    self._parse(t, tail)
                except _Failed as exc:  # an SSE overflow is already counted; a content one is said here
                    if exc.cause is not None and self.record.error is None:
                        self.record.error = _failure(exc)
        try:
            for event in self.parser.close():
                self.record.sse_errors += 1  # the stream ended inside an event
                self.event(t, event)
        except _Failed as exc:  # the last event passed a content limit: the stream fails as cut there
            if self.record.error is None:
                self.record.error = _failure(exc)

    def event(self, t: int, event: SSEEvent) -> None:
        rec = self.record
        rec.events += 1
        if rec.events > self.limits.events:
            raise _Failed("protocol", self.limits.events_message(rec.events), "content_overflow")
        if rec.t_first_event is None:
            rec.t_first_event = t
        if event.data is None:
            rec.sse_errors += 1  # fields but no data line
            return
        if rec.done_seen:
            rec.sse_errors += 1  # anything after [DONE] is a framing error
            return
        data = event.data
        repeated = data == self.last_data and event.id == self.last_id  # the whole event, not its text alone
        self.last_data, self.last_id = data, event.id
        if data.strip() == "[DONE]":
            rec.done_seen = True
            rec.t_end = t
            return
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack
            obj = None
        if not isinstance(obj, dict):
            rec.json_errors += 1
            return
        self._object(t, obj, repeated)

    def _object(self, t: int, obj: dict[str, Any], repeated: bool) -> None:
        """One event's JSON object: an error in it, its usage, its choice 0."""
        rec = self.record
        if "error" in obj and obj["error"] is not None:
            err = obj["error"]
            message = err.get("message") if isinstance(err, dict) else None
            rec.in_band_error = _words(message if message else err, _WORDS)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            rec.usage = _bounded_usage(usage)
        choices = obj.get("choices")
        if isinstance(choices, list):
            self._choices(t, choices, repeated)

    def _choices(self, t: int, choices: list[Any], repeated: bool = False) -> None:
        """Choice 0 of one event: its text (completions) or delta content (chat), the delta's reasoning and
        tool-call fragments (chat), its finish reason."""
        rec = self.record
        for choice in choices:
            if not (isinstance(choice, dict) and choice.get("index", 0) == 0):  # n=1 streams: only choice 0 is ours
                continue
            text = choice.get("text")
            delta = None
            if text is None:
                delta = choice.get("delta")
                text = delta.get("content") if isinstance(delta, dict) else None
            if text:
                self.text.append(self._kept(text))
                rec.t_content.append(t)
                rec.repeated_events += repeated
                if rec.t_first_content is None:
                    rec.t_first_content = t
            if isinstance(delta, dict):
                self._reasoning(t, delta)
                calls = delta.get("tool_calls")
                if calls is not None:
                    self._tool_calls(t, calls)
            if choice.get("finish_reason") is not None:
                rec.finish_reason = _words(choice["finish_reason"], _FINISH_CHARS)

    def _kept(self, text: Any) -> str:
        """A piece of output text as kept (anything but a string as JSON), counted against the stream's one
        budget of characters, which content, reasoning and tool-call arguments share (all are tokens the
        request's ``max_tokens`` allows)."""
        kept = text if isinstance(text, str) else _words(text, _WORDS)
        self.text_chars += len(kept)
        if self.text_chars > self.limits.text_chars:
            raise _Failed("protocol", self.limits.text_message(), "content_overflow")
        return kept

    def _reasoning(self, t: int, delta: dict[str, Any]) -> None:
        """vLLM's reasoning text: ``delta.reasoning_content``, or ``delta.reasoning`` (newer builds, which may
        send both with the same text: one is read, never the two)."""
        text = delta.get("reasoning_content") or delta.get("reasoning")
        if text:
            self.reasoning.append(self._kept(text))
            self.record.t_reasoning.append(t)

    def _tool_calls(self, t: int, calls: Any) -> None:
        """One event's ``delta.tool_calls``: each fragment added to the call its ``index`` names; a fragment
        that breaks the protocol is counted (``tool_call_errors``) and left out."""
        rec = self.record
        if not isinstance(calls, list):
            rec.tool_call_errors += 1
            return
        if not calls:
            return
        rec.t_tool_calls.append(t)
        for item in calls:
            if not self._tool_fragment(item):
                rec.tool_call_errors += 1

    def _tool_fragment(self, item: Any) -> bool:
        """Add one fragment to its call; False when it breaks the protocol: no integer index (or past
        ``_TOOL_CALLS`` calls), an id or name that changes mid-call, a name or arguments that are not
        strings. OpenAI and vLLM send the id, type and name with a call's first fragment, then arguments only."""
        if not isinstance(item, dict):
            return False
        index = item.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return False
        rec = self.record
        calls = rec.tool_calls if rec.tool_calls is not None else {}
        key = str(index)
        entry = calls.get(key)
        if entry is None:
            if len(calls) >= _TOOL_CALLS:
                return False
            entry = calls[key] = {"id": "", "name": "", "arguments": ""}
            self.arguments[key] = []
        rec.tool_calls = calls
        ok = _once(entry, "id", item.get("id"))
        function = item.get("function")
        if function is None:
            return ok
        if not isinstance(function, dict):
            return False
        ok = _once(entry, "name", function.get("name")) and ok
        arguments = function.get("arguments")
        if arguments is None:
            return ok
        if not isinstance(arguments, str):
            return False
        if arguments:
            self.arguments[key].append(self._kept(arguments))
        return ok


def _once(entry: dict[str, str], key: str, value: Any) -> bool:
    """A tool call's id or name, set by the fragment that first carries it; False when it is not a string,
    or changes mid-call (a fragment repeating the same value is tolerated)."""
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    value = _scrubbed(value[:_TOOL_WORDS])
    if not entry[key]:
        entry[key] = value
        return True
    return not value or value == entry[key]


def _words(value: Any, limit: int) -> str:
    """A target's value as at most ``limit`` characters of text: a string as sent, anything else as JSON;
    one nested too deep to print (``RecursionError``) by its type. Never raises."""
    if isinstance(value, str):
        return _scrubbed(value[:limit])
    try:
        return _scrubbed(json.dumps(value, ensure_ascii=False)[:limit])
    except (RecursionError, ValueError, TypeError):
        return f"<a JSON {type(value).__name__} too deep to print>"


def _scrubbed(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate (a JSON ``"\\ud800"``) replaced by U+FFFD: the journal is UTF-8."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def _bounded_usage(usage: dict[Any, Any]) -> dict[str, Any]:
    """What a record keeps of a usage object: its first ``_USAGE_KEYS`` numeric fields, and of each nested
    object (``prompt_tokens_details``) its numeric fields: a target's usage cannot grow the journal or nest
    deeper than two levels. Pure."""
    out: dict[str, Any] = {}
    for key, value in itertools.islice(usage.items(), _USAGE_KEYS):
        if not (isinstance(key, str) and key.isascii()):
            continue
        if isinstance(value, dict):
            nested = {k: v for k, v in itertools.islice(value.items(), _USAGE_KEYS)
                      if isinstance(k, str) and k.isascii() and _number(v)}
            if nested:
                out[key] = nested
        elif _number(value):
            out[key] = value
    return out


def _number(value: Any) -> bool:
    return value is None or isinstance(value, (int, float))


async def _paced(raw: AsyncIterator[bytes], plan: ClientPlan) -> AsyncIterator[bytes]:
    """Yield network reads as a slow or impatient client would consume them."""
    rate = plan.read_rate_bps
    consumed = 0
    t0: float | None = None
    loop = asyncio.get_running_loop()
    while True:
        if plan.read_delay_s > 0:
            await asyncio.sleep(plan.read_delay_s)
        try:
            if plan.read_timeout_s is not None:
                async with asyncio.timeout(plan.read_timeout_s):
                    chunk = await anext(raw)
            else:
                chunk = await anext(raw)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise _Hangup("read_timeout") from None
        if rate is None or rate <= 0:
            yield chunk
            continue
        # A rate-capped reader takes the read apart and consumes it slice by slice on a budget;
        # the next network read is not issued until the budget allows, so the socket fills up.
        if t0 is None:
            t0 = loop.time()
        step = max(1, int(rate * _RATE_SLICE_S))
        for i in range(0, len(chunk), step):
            piece = chunk[i : i + step]
            wait = t0 + consumed / rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            consumed += len(piece)
            yield piece




class _Exchange:
    """The ``ResponseSink`` of one request on one connection.

    ``ready`` resolves when the stream needs nothing more from the socket side: ``"done"`` (the
    response ended; the record is complete), ``"pull"`` (2xx headers arrived and a paced consumer
    takes over the body through ``reads()``), or with an internal exception (``_Hangup``,
    ``_Failed``, ``_HttpError``) that ``stream_request`` turns into the record's outcome.
    """

    __slots__ = ("state", "record", "plan", "conn", "pull", "ready", "queue", "waiter", "ended", "failure",
                 "error_body")

    def __init__(self, state: _Stream, plan: ClientPlan, conn: HttpConnection, pull: bool) -> None:
        self.state = state
        self.record = state.record
        self.plan = plan
        self.conn = conn
        self.pull = pull
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.queue: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.ended = False
        self.failure: _Failed | None = None
        self.error_body: bytearray | None = None

    def _resolve(self, value: str | BaseException) -> None:
        if self.ready.done():
            return
        if isinstance(value, BaseException):
            self.ready.set_exception(value)
        else:
            self.ready.set_result(value)

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ---- ResponseSink (called from the connection's data_received) --------------------------------

    def on_headers(self, t: int, status: int, headers: dict[str, str]) -> None:
        rec = self.record
        rec.t_headers = t
        rec.status = status
        rec.server = _header(headers, "server")
        rec.via = _header(headers, "via")
        rec.content_encoding = _header(headers, "content-encoding")
        rec.content_type = _header(headers, "content-type") or ""
        rec.x_accel_buffering = _header(headers, "x-accel-buffering")
        if self.plan.hangup_while_queued:
            self._resolve(_Hangup("while_queued"))
            return
        try:
            self.state.decoder = decoder_for(rec.content_encoding)
        except DecodeError as exc:
            if 200 <= status < 300:
                self._resolve(_Failed("protocol", str(exc)))
                return
        if not 200 <= status < 300:
            self.error_body = bytearray()
            return
        if foreign_content_type(rec.content_type):  # parse what comes anyway, and say so
            self.state.framing = not_event_stream(rec.content_type)  # (none at all: parsed as SSE, no failure)
        if self.pull:
            self._resolve("pull")

    def on_body(self, t: int, data: bytes) -> None:
        if self.ready.done() and not self.pull:
            return  # decided (a hang-up): the rest of this read is not ours to count
        if self.error_body is not None:
            self.error_body += data
            if len(self.error_body) >= _BODY_LIMIT:
                self._resolve(_HttpError(self.record.status or 0, self._error_text()))
            return
        if self.pull:
            self.queue.append(data)
            self.conn.pause_reading()  # the consumer asks for the next read when it is ready
            self._wake()
            return
        try:
            self.state.feed(t, data)
        except _Failed as exc:
            self._resolve(exc)
            return
        except Exception as exc:  # noqa: BLE001 - a bug of ours: reported on the record, never lost
            self._resolve(exc)
            return
        after = self.plan.hangup_after_tokens
        if after is not None and self.record.token_events >= after:  # tokens of any kind, reasoning included
            self._resolve(_Hangup("after_tokens"))

    def on_complete(self, t: int) -> None:
        if self.error_body is not None:
            self._resolve(_HttpError(self.record.status or 0, self._error_text()))
            return
        if self.pull and self.ready.done():
            self.ended = True
            self._wake()
            return
        if not self.ready.done():
            self.state.finish(t)
            rec = self.record
            if rec.t_end is None or not rec.done_seen:
                rec.t_end = t
            self._resolve("done")

    def on_failed(self, t: int, kind: str, message: str, cause: str | None = None) -> None:
        failure = _Failed(kind, message, cause)
        if self.pull and self.ready.done():
            self.failure = failure  # delivered after the reads already queued, as a socket would
            self._wake()
            return
        self._resolve(failure)

    def _error_text(self) -> bytes:
        """The error body as sent, decoded when it was compressed (best effort: it only feeds a message)."""
        body = bytes(self.error_body or b"")
        decoder = self.state.decoder
        if decoder is None:
            return body
        out = bytearray()
        try:
            for piece in decoder.decode(body):
                out += piece
                if len(out) >= _BODY_LIMIT:
                    return bytes(out[:_BODY_LIMIT])  # enough for a message (and never a bomb's worth)
            return bytes(out + decoder.flush())[:_BODY_LIMIT]
        except DecodeError:
            return body

    # ---- the paced consumer's side ---------------------------------------------------------------

    async def reads(self) -> AsyncIterator[bytes]:
        """Body reads in order; the socket is read only while this consumer waits for one."""
        loop = asyncio.get_running_loop()
        while True:
            if self.queue:
                yield self.queue.popleft()
                continue
            if self.ended:
                return
            if self.failure is not None:
                raise self.failure
            self.waiter = loop.create_future()
            self.conn.resume_reading()
            await self.waiter


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value as a record keeps it: at most ``HEADER_VALUE_CHARS`` characters."""
    value = headers.get(name)
    return value if value is None or len(value) <= HEADER_VALUE_CHARS else value[:HEADER_VALUE_CHARS]


def not_event_stream(content_type: str) -> str:
    """Why a 2xx response with this Content-Type (one ``foreign_content_type`` refuses) is not an event
    stream, in words. Pure."""
    return f"the response came with Content-Type {content_type!r}, not text/event-stream: it is not an event stream"


def _http_message(status: int, body: bytes) -> str:
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict) and err.get("message"):
            return _words(err["message"], _WORDS)  # scrubbed: a JSON "\\ud800" would jam the journal
        if isinstance(err, str):
            return _scrubbed(err[:_WORDS])
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack
        pass
    text = body.decode("utf-8", errors="replace").strip()
    return text[:500] or f"HTTP {status}"


def _paces(plan: ClientPlan) -> bool:
    """Whether this client consumes reads at its own pace (and so needs its own task per read)."""
    return plan.read_delay_s > 0 or bool(plan.read_rate_bps) or plan.read_timeout_s is not None


async def stream_request(http: StreamClient, url: str, body: Mapping[str, Any], record: StreamRecord, *,
                         plan: ClientPlan | None = None, request_timeout: float = 600.0,
                         headers: Mapping[str, str] | None = None, queued_grace_s: float = 0.05,
                         max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> StreamRecord:
    """Send ``body`` to ``url`` as a stream and fill ``record``; never raises except on cancellation.

    ``queued_grace_s``: a ``hangup_while_queued`` plan hangs up when the response headers arrive or
    after this long, whichever is first, and always before reading any body byte.
    ``max_event_bytes``: an SSE line or event longer than this fails the stream (``protocol``).
    A stream carrying more than its ``max_tokens`` allows (``chaos.load.limits``) fails as ``protocol``
    with cause ``content_overflow``, a response head past its bound with cause ``header_overflow``.
    """
    call = StreamCall(http, url, body, record, plan=plan, request_timeout=request_timeout, headers=headers,
                      queued_grace_s=queued_grace_s, max_event_bytes=max_event_bytes)
    return await call.run()


class StreamCall:
    """One streamed request (``stream_request``'s), made before its time: ``payload``, its request bytes
    encoded ahead. ``send_now()`` writes it at once, from plain code, when a slot is free and a kept-alive
    connection waits: an open loop calls it from its timer's wake-up, so no loop iteration and no other
    stream's reads come between the due time and the write (each cost a late send ~0.1-0.3 ms).
    ``run()`` then does the rest: the whole request where ``send_now`` did not send. ``abandon()``: a call
    sent now whose ``run()`` never started (its task cancelled first) gives its slot and connection back."""

    __slots__ = ("http", "url", "body", "record", "plan", "request_timeout", "headers", "payload", "state",
                 "attempt", "hang_after", "started")

    def __init__(self, http: StreamClient, url: str, body: Mapping[str, Any], record: StreamRecord, *,
                 plan: ClientPlan | None = None, request_timeout: float = 600.0,
                 headers: Mapping[str, str] | None = None, queued_grace_s: float = 0.05,
                 max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES, payload: Any = None) -> None:
        self.http, self.url, self.body, self.record = http, url, body, record
        self.plan = plan = plan or ClientPlan()
        self.request_timeout, self.headers, self.payload = request_timeout, headers, payload
        fault = plan.faults[0] if plan.faults else ""
        self.state = _Stream(record, max_event_bytes,
                             ContentLimits.for_tokens(record.max_tokens or _asked_tokens(body)))
        hang_after = plan.hangup_after_s
        if plan.hangup_while_queued:
            hang_after = queued_grace_s if hang_after is None else min(hang_after, queued_grace_s)
        self.hang_after = hang_after
        self.attempt = _Attempt(http, record, self.state, plan, fault)
        self.started = False

    def send_now(self) -> bool:
        """Write the request now if a slot and an idle connection allow (True), else leave it to ``run``."""
        if self.payload is None or self.started:
            return False
        return self.attempt.send_now(self.http.target(self.url), self.payload)

    def abandon(self) -> None:
        if not self.started:
            self.attempt.abandon()

    async def run(self) -> StreamRecord:
        self.started = True
        record, attempt, plan = self.record, self.attempt, self.plan
        if attempt.exchange is None:
            record.t_sent = time.monotonic_ns()  # provisional: kept if the request never reaches a connection
        try:
            async with asyncio.timeout(self.hang_after) as hang_cm, asyncio.timeout(self.request_timeout) as req_cm:
                return await attempt.run(self.url, self.body, self.headers, self.payload)
        except TimeoutError:
            record.t_end = time.monotonic_ns()
            if hang_cm.expired() and not req_cm.expired():  # our own hang-up timer: a client fault
                reason = "while_queued" if plan.hangup_while_queued and record.t_first_byte is None else "after_time"
                record.hangup = Hangup(attempt.fault, reason, record.t_end)
            else:
                record.error = _timeout_error(connect=not req_cm.expired(), connected=attempt.exchange is not None,
                                              connect_timeout=self.http.connect_timeout,
                                              request_timeout=self.request_timeout)
            return record
        except asyncio.CancelledError:
            record.error = ErrorInfo("cancelled", "the stream was still open when the load generator stopped waiting")
            record.t_end = time.monotonic_ns()
            raise
        except (_Failed, ValueError, ConnectionClosed, OSError) as exc:
            record.error = _failure(exc)
            record.t_end = time.monotonic_ns()
            return record
        finally:
            self.state.finish(record.t_end or time.monotonic_ns(), flush=False)


def _asked_tokens(body: Mapping[str, Any]) -> int | None:
    """The ``max_tokens`` (or ``max_completion_tokens``) a request body asks for, if it names one."""
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Attempt:
    """One request on one slot and connection: sent, its response read as the plan's reader would;
    the connection back to the pool when the response ended clean, else closed (the server sees
    the disconnect), and the slot always returned. ``exchange``: set once the request was sent."""

    def __init__(self, http: StreamClient, record: StreamRecord, state: _Stream, plan: ClientPlan, fault: str) -> None:
        self.http, self.record, self.state, self.plan, self.fault = http, record, state, plan, fault
        self.conn: HttpConnection | None = None
        self.sent: HttpConnection | None = None  # what the request went on (kept after ``conn`` is given back)
        self.exchange: _Exchange | None = None
        self.slot = False

    def send_now(self, target: Target, payload: Any) -> bool:
        """Send on an idle kept-alive connection without waiting (``StreamCall.send_now``); False, having
        taken nothing, where a slot or an idle connection would have to be waited for."""
        http = self.http
        if not http.take_slot():
            return False
        conn = http.idle_connection(target)
        if conn is None:
            http.release_slot()
            return False
        self.slot, self.conn = True, conn
        self.record.t_sent = time.monotonic_ns()  # the request bytes are written now
        self.exchange = _Exchange(self.state, self.plan, conn, pull=_paces(self.plan))
        conn.send(payload, self.exchange, self.record.id)
        self.sent = conn
        _describe(self.record, conn)
        return True

    def abandon(self) -> None:
        """Close what ``send_now`` took (the server sees the disconnect) and give its slot back."""
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.slot:
            self.slot = False
            self.http.release_slot()

    async def run(self, url: str, body: Mapping[str, Any], headers: Mapping[str, str] | None,
                  payload: Any = None) -> StreamRecord:
        http, record, plan = self.http, self.record, self.plan
        try:
            if self.exchange is None:  # not sent already (``send_now``)
                target = http.target(url)
                if payload is None:
                    payload = http.encode(target, body, headers)
                await http.acquire_slot()
                self.slot = True
                self.conn = await _connection(http, target, record)
                self.exchange = _Exchange(self.state, plan, self.conn, pull=_paces(plan))
                self.conn.send(payload, self.exchange, record.id)
                self.sent = self.conn
                _describe(record, self.conn)
            if await self.exchange.ready == "pull":
                await _read_paced(self.exchange, self.state, plan, record)
            # kept for the slot's next request only if it ended clean (``may_reuse``): not after an error event
            assert self.conn is not None
            http.release(self.conn, in_band_error=record.in_band_error is not None)
            self.conn = None
            return record
        except _Hangup as hang:
            record.hangup = Hangup(self.fault, hang.reason, time.monotonic_ns())
            record.t_end = record.hangup.t
            return record
        except _HttpError as err:
            record.error = ErrorInfo("http", _http_message(err.status, err.body), err.status)
            record.t_end = time.monotonic_ns()
            if self.conn is not None:
                # closed, not kept (``may_reuse``): a server that fails a request may be closing it
                http.release(self.conn)
                self.conn = None
            return record
        finally:
            if self.sent is not None:  # again: an HTTP/2 stream refused unprocessed was sent again elsewhere
                _describe(record, self.sent)
            if self.conn is not None:
                # an unfinished response closes its TCP connection (an HTTP/2 stream: RST_STREAM), so the
                # server sees the disconnect
                self.conn.close()
                self.conn = None
            if self.slot:
                self.slot = False
                http.release_slot()


def _describe(record: StreamRecord, conn: HttpConnection) -> None:
    """The connection under a request, on its record: protocol, which connection (and HTTP/2 stream), whether
    it was reused, and for a new one when its TCP connect and TLS handshake ended; when the request was written."""
    record.protocol = conn.protocol
    record.connection = conn.conn_label or None
    record.stream_id = conn.stream_id
    record.reused = conn.reused
    record.t_request = conn.t_request
    if not conn.reused:
        record.t_connected, record.t_tls = conn.t_connected, conn.t_tls


async def _connection(http: StreamClient, target: Target, record: StreamRecord) -> HttpConnection:
    """An idle keep-alive connection to ``target``, else a new one; ``t_sent`` stamped as the request leaves."""
    conn = http.idle_connection(target)
    record.t_sent = time.monotonic_ns()  # the request bytes are written now, or leave as the connect begins
    return conn if conn is not None else await http.connect(target)


async def _read_paced(exchange: _Exchange, state: _Stream, plan: ClientPlan, record: StreamRecord) -> None:
    """Read the body as the plan's reader would (paced, impatient, hanging up after N tokens)."""
    async for chunk in _paced(exchange.reads(), plan):
        t = time.monotonic_ns()
        state.feed(t, chunk)
        if plan.hangup_after_tokens is not None and record.token_events >= plan.hangup_after_tokens:
            raise _Hangup("after_tokens")
    t = time.monotonic_ns()
    state.finish(t)
    if record.t_end is None or not record.done_seen:
        record.t_end = t


def _timeout_error(*, connect: bool, connected: bool, connect_timeout: float, request_timeout: float) -> ErrorInfo:
    """Which timeout ended the stream: the connect's own (neither of ours), or the request's, before
    or after a connection was had."""
    if connect:
        return ErrorInfo("timeout", f"the TCP connect took longer than {connect_timeout:g}s", cause="connect_timeout")
    if not connected:
        return ErrorInfo("timeout", f"no connection within the request timeout of {request_timeout:g}s",
                         cause="no_connection")
    return ErrorInfo("timeout", f"no complete response within the request timeout of {request_timeout:g}s",
                     cause="request_timeout")


def _failure(exc: Exception) -> ErrorInfo:
    """A stream's failure in words: a protocol or body failure, a request this client cannot send, a
    client closed before the request got a connection, a connect that failed."""
    if isinstance(exc, _Failed):
        return ErrorInfo(exc.kind, _scrubbed(exc.message[:500]), cause=exc.cause)
    if isinstance(exc, ConnectionClosed):
        return ErrorInfo("connect", str(exc))
    if isinstance(exc, ValueError):  # a URL or header this client cannot send
        return ErrorInfo("protocol", f"cannot send the request: {exc}"[:500])
    return ErrorInfo("connect", f"{type(exc).__name__}: {exc}"[:500])  # refused, unreachable, no such host
