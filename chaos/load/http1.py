"""A small HTTP/1.1 client for streamed responses: one asyncio ``Protocol`` per connection, httptools.

Why not httpx on the hot path: httpcore 1.0's pool walks every connection whenever a response
closes (``_assign_requests_to_connections``, O(N) per close, so O(N²) per turnover of N streams;
upstream httpcore #1035); at 256 streams with request turnover it spent 73% of the run there.
Here a connection is handed out and taken back in O(1) (a LIFO stack of idle connections per
origin), so the cost per event is flat in the number of streams.

A response is delivered to a ``ResponseSink`` straight from ``data_received``: every callback
carries the stamp of the socket read that delivered its bytes (``time.monotonic_ns()`` taken
before any parsing). httptools (llhttp, in C) frames the response; chosen over h11 by measurement
(``benchmarks/bench_http_parser.py``). A sink that wants to read slowly calls ``pause_reading``:
the socket is then no longer read, so the kernel buffers fill and the server feels back-pressure.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, Self
from urllib.parse import urlsplit

import httptools

from chaos.host.tls import tls_context
from chaos.load.limits import HEAD_BYTES, HEAD_FIELDS, head_message
from chaos.load.sdk_headers import openai_python_headers
from chaos.model.errors import ChaosError

__all__ = [
    "Connection", "ConnectionClosed", "ExchangeSlots", "H1Client", "ResponseSink", "Target", "may_reuse",
    "open_transport",
]

# An idle kept-alive connection is reused only within this long of its last response. A server closes
# an idle one on its own timer (uvicorn's 5 s: vLLM, SGLang, the builtin stack), and a request sent
# as that timer fires is lost unread ("server disconnected without sending a response"). A timer
# runs on while a server is frozen, and uvloop fires expired timers before reading what waits on a
# socket: under container-freeze's 2 s freeze, 5 runs in 22 lost 1-5 requests each, sent on connections
# idle since before the freeze (with the former 30 s). 1.5 s leaves a 2 s freeze 1.5 s of room
# against a 5 s server; reconnecting after 1.5 s idle costs one connect at rates that low.
KEEPALIVE_EXPIRY_S = 1.5

_DEFAULT_PORTS = {"http": 80, "https": 443}


class ConnectionClosed(ChaosError):
    """The connection went away before the response was complete (a cut stream)."""


class _HeadOverflow(Exception):
    """Internal: raised from a parser callback when a response head passed ``HEAD_BYTES`` or ``HEAD_FIELDS``."""


def may_reuse(status: int, *, keep_alive: bool, complete: bool, in_band_error: bool = False) -> bool:
    """Whether a connection may carry the next request after a response: only one that ended clean.

    Not after an error status (>= 400) or an in-band error: a server that fails a request often closes
    the connection a moment later (a framework logs the exception first: 15-30 ms inside vLLM), and a
    request written into it in that moment is lost unanswered, a second error for one fault that may
    land in the next phase. Not after ``Connection: close`` (``keep_alive`` false), nor after a body
    that did not end where its framing said (``complete`` false): the connection's state is unknown.
    A new connection costs one connect. Pure."""
    return complete and keep_alive and 200 <= status < 400 and not in_band_error


class ResponseSink(Protocol):
    """Receives one response; every ``t`` is the monotonic ns stamp of the read that carried it."""

    def on_headers(self, t: int, status: int, headers: dict[str, str]) -> None: ...
    def on_body(self, t: int, data: bytes) -> None: ...
    def on_complete(self, t: int) -> None: ...
    def on_failed(self, t: int, kind: str, message: str, cause: str | None = None) -> None: ...


@dataclass(frozen=True)
class Target:
    """Where one URL's requests go: origin (scheme, host, port), the Host header and the path."""

    scheme: str
    host: str
    port: int
    host_header: str
    path: str

    @property
    def origin(self) -> tuple[str, str, int]:
        return (self.scheme, self.host, self.port)


def parse_target(url: str) -> Target:
    """``http://h:p/v1/completions`` → Target; a clear error for what this client cannot speak."""
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS:
        raise ValueError(f"cannot stream from {url!r}: the URL must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"cannot stream from {url!r}: the URL has no host")
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if parts.port in (None, _DEFAULT_PORTS[parts.scheme]) else f"{shown}:{port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(parts.scheme, host, port, host_header, path)


def _check_header(name: str, value: str) -> None:
    if any(c in name or c in value for c in "\r\n\0") or not name or ":" in name:
        raise ValueError(f"header {name!r}: names and values must not contain CR, LF or NUL (and names no ':')")


class Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; carries one response at a time to its current sink."""

    __slots__ = (
        "client", "origin", "transport", "parser", "sink", "t_read", "status", "headers", "keep_alive",
        "complete", "closed", "framed", "idle_since", "reading_paused", "served", "reused", "answered",
        "label", "previous", "idle_s", "head_read", "head_fields", "head_bytes", "conn_label", "t_connected",
        "t_tls", "t_request",
    )

    protocol = "http/1.1"
    stream_id: int | None = None  # HTTP/2 only (``chaos.load.http2.H2Stream``); here for the record's one shape

    def __init__(self, client: H1Client, origin: tuple[str, str, int]) -> None:
        self.client = client
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.sink: ResponseSink | None = None
        self.t_read = 0
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep_alive = False
        self.complete = False
        self.closed = False
        self.framed = False  # the body has a length or is chunked (else it ends at EOF)
        self.idle_since = 0.0
        self.reading_paused = False
        self.served = 0  # responses completed on this connection
        self.reused = False  # the request under way is not the connection's first
        self.answered = False  # a byte of its response has arrived
        self.label = ""  # the request under way, in words (its id), for the next one's error message
        self.previous = ""  # the last completed response: its status and request (for a stale connection)
        self.idle_s = 0.0  # how long the connection lay idle before the request under way
        # the response head so far (``HEAD_BYTES``, ``HEAD_FIELDS``): bytes read while it was not complete,
        # header fields parsed and their size; httptools joins a header's pieces with ``+=``, so an
        # endless header grows quadratically in time (14-16 s of loop lag) and without bound in memory
        self.head_read = 0
        self.head_fields = 0
        self.head_bytes = 0
        self.conn_label = ""  # which of the client's connections ("c7": the 7th it opened), for the record
        self.t_connected: int | None = None  # monotonic ns: the TCP connect done
        self.t_tls: int | None = None  # monotonic ns: the TLS handshake done (None: plain TCP)
        self.t_request: int | None = None  # monotonic ns: the request under way was written

    # ---- use by the request side -----------------------------------------------------------------

    @property
    def reusable(self) -> bool:
        """Open, idle, and the last response left it clean for the next request."""
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def send(self, payload: bytes, sink: ResponseSink, label: str = "") -> None:
        """Write one request and route its response to ``sink``; ``label`` names the request (its id)
        in the message of a later request that finds the connection closed under it."""
        assert self.transport is not None
        self.sink = sink
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers = {}
        self.keep_alive = False
        self.complete = False
        self.framed = False
        self.reused = self.served > 0
        self.idle_s = time.monotonic() - self.idle_since if self.reused else 0.0
        self.answered = False
        self.label = label
        self.head_read = self.head_fields = self.head_bytes = 0
        self.t_request = time.monotonic_ns()
        self.transport.write(payload)

    def pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        """Close the TCP connection (the server sees the disconnect); a response still attached
        fails as a cut read (the client closing under it, e.g. ``H1Client.aclose``)."""
        sink, self.sink = self.sink, None
        if not self.closed:
            self.closed = True
            self.client._forget(self)
            if self.transport is not None:
                self.transport.close()
            if sink is not None and not self.complete:
                sink.on_failed(time.monotonic_ns(), "read", "the client closed the connection")

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.t_read = time.monotonic_ns()  # the stamp of this read, before anything is parsed
        parser, sink = self.parser, self.sink
        if parser is None or sink is None or self.complete:
            # bytes nobody asked for (after a complete response, or on an idle connection): the
            # connection's framing can no longer be trusted
            self.close()
            return
        self.answered = True
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("protocol", "the server switched protocols (upgrade) on a streaming request")
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _HeadOverflow):  # a callback's exception comes back as its context
                self._fail("protocol", str(exc.__context__), "header_overflow")
            else:
                self._fail("protocol", f"malformed HTTP response: {exc}")
            return
        if not self.status and not self.closed:  # the head is not complete yet (interim 1xx heads count towards it too)
            self.head_read += len(data)
            if self.head_read > HEAD_BYTES:
                self._fail("protocol", head_message(f"{HEAD_BYTES} bytes without its end"), "header_overflow")

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        t = time.monotonic_ns()
        was_closed = self.closed
        self.closed = True
        self.client._forget(self)
        sink, self.sink = self.sink, None
        if sink is None or self.complete or was_closed:
            return
        if self.status and not self.framed:
            # no Content-Length and not chunked: the body ends where the connection does
            self.complete = True
            sink.on_complete(t)
            return
        if self.reused and not self.answered and (exc is None or isinstance(exc, ConnectionError)):
            sink.on_failed(t, "read", self._stale(exc), "stale_connection")
            return
        message, cause = _lost(exc, bool(self.status))
        sink.on_failed(t, "read", message, cause)

    def _stale(self, exc: Exception | None) -> str:
        """A reused connection closed before any byte of its answer: the server had closed it after its
        previous response (or was closing it as this request went out), so the loss is that response's."""
        how = f"{type(exc).__name__}: {exc}" if exc is not None else "EOF"
        return (f"stale connection: the server closed a kept-alive connection before answering ({how}); its "
                f"previous response was {self.previous or 'unknown'}, which ended {self.idle_s:.3f}s before this "
                "request was written into it")

    def _fail(self, kind: str, message: str, cause: str | None = None) -> None:
        sink, self.sink = self.sink, None
        self.close()
        if sink is not None:
            sink.on_failed(self.t_read, kind, message, cause)

    # ---- httptools callbacks (called from inside feed_data) ------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_fields += 1
        self.head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        if self.head_fields > HEAD_FIELDS:
            raise _HeadOverflow(head_message(f"{HEAD_FIELDS} header fields"))
        if self.head_bytes > HEAD_BYTES:  # one read (at most 256 KiB) may carry a whole head past the bound
            raise _HeadOverflow(head_message(f"{HEAD_BYTES} bytes"))
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        parser = self.parser
        assert parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200 or self.complete:
            return  # an interim response (100 Continue; the real one follows), or bytes after the end
        self.status = status
        self.keep_alive = parser.should_keep_alive()
        self.framed = "content-length" in self.headers or "chunked" in self.headers.get("transfer-encoding", "").lower()
        if self.sink is not None:
            self.sink.on_headers(self.t_read, status, self.headers)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.on_body(self.t_read, body)

    def on_message_complete(self) -> None:
        if not self.status:
            return  # the end of an interim response
        self.complete = True
        self.served += 1
        self.previous = f"HTTP {self.status}" + (f" to request {self.label}" if self.label else "")
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.on_complete(self.t_read)


async def open_transport(factory: Callable[[], asyncio.Protocol], host: str, port: int,
                         ssl_ctx: ssl.SSLContext | None) -> tuple[asyncio.BaseTransport, int, int | None]:
    """Connect to ``host:port`` and run ``factory``'s protocol on it; the transport, and the monotonic ns
    stamps of the TCP connect done and of the TLS handshake done (None without ``ssl_ctx``).

    In two steps (the socket connected by hand, then handed to ``create_connection``) so that a record can
    tell a slow TCP connect from a slow handshake. Raises what ``create_connection`` raises: ``OSError``
    (``socket.gaierror`` for a name, ``Connect call failed`` for a refusal), ``ssl.SSLError``; the caller
    bounds the whole in time."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    errors: list[OSError] = []
    sock: socket.socket | None = None
    for family, kind, proto, _name, address in infos:  # every address, in the resolver's order
        candidate = socket.socket(family, kind, proto)
        try:
            candidate.setblocking(False)
            candidate.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an event is one small write
            await loop.sock_connect(candidate, address)
        except OSError as exc:
            candidate.close()
            errors.append(exc)
            continue
        except BaseException:  # cancelled, or the caller's timeout: no socket left behind
            candidate.close()
            raise
        sock = candidate
        break
    if sock is None:
        if len(errors) == 1:
            raise errors[0]
        raise OSError(f"Multiple exceptions: {', '.join(str(exc) for exc in errors)}" if errors
                      else f"no address for {host!r}")
    t_connected = time.monotonic_ns()
    try:
        transport, _protocol = await loop.create_connection(
            factory, sock=sock, ssl=ssl_ctx, server_hostname=host if ssl_ctx is not None else None)
    except BaseException:
        sock.close()  # a failed handshake leaves the socket ours (closing it twice is harmless)
        raise
    return transport, t_connected, time.monotonic_ns() if ssl_ctx is not None else None


def _lost(exc: Exception | None, responded: bool) -> tuple[str, str | None]:
    """A connection lost under a response, in words, and its ``ErrorInfo.cause``: a clean close (FIN)
    in the middle of a framed body is a bare EOF (a truncated 200 looks complete to a careless
    client), a reset is a reset, and a close before any head is no response."""
    if isinstance(exc, ConnectionResetError):
        return f"{type(exc).__name__}: {exc}", "reset"
    if exc is not None:
        return f"{type(exc).__name__}: {exc}", None  # another socket error: say it, claim no cause
    if not responded:
        return "server disconnected without sending a response", "no_response"
    return "peer closed connection without sending complete message body", "bare_eof"


class ExchangeSlots:
    """The part every load client shares, whatever its protocol: ``limit`` exchange slots (a request beyond
    them waits client-side, before ``t_sent``, as httpx's pool limit made it) and each URL parsed once."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._slots: asyncio.Semaphore | None = None
        self._targets: dict[str, Target] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        raise NotImplementedError

    def target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = parse_target(url)
        return target

    async def acquire_slot(self) -> None:
        """Wait for one of the ``connections`` exchange slots (no wait while fewer are in flight)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        await self._slots.acquire()

    def take_slot(self) -> bool:
        """Take a slot without waiting, if one is free (``acquire_slot`` would not suspend)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)
        if self._slots.locked():
            return False
        # not locked: acquire() takes a slot without suspending, so one step of it completes it
        step = self._slots.acquire()
        try:
            step.send(None)
        except StopIteration:
            return True
        step.close()  # unreachable while unlocked; never leave a waiter behind
        return False

    def release_slot(self) -> None:
        assert self._slots is not None
        self._slots.release()


class H1Client(ExchangeSlots):
    """Keep-alive HTTP/1.1 connections, O(1) to hand out and take back, per origin.

    ``connections`` bounds the exchanges in flight at once (``slot()``: a request beyond it waits
    client-side, before ``t_sent``, as httpx's pool limit made it) and the idle connections kept
    per origin. A closed-loop slot takes a connection and gives it back, so in effect each slot
    owns one persistent connection.
    """

    def __init__(
        self,
        connections: int,
        *,
        api_key: str | None = None,
        connect_timeout: float = 10.0,
        keepalive_expiry: float = KEEPALIVE_EXPIRY_S,
        headers: Mapping[str, str] | None = None,
        reuse: bool = True,
    ) -> None:
        super().__init__(connections)
        # reuse False: a connection per request (``load.http.keep_alive``, chaos.load.keepalive)
        self.max_idle = max(1, connections) if reuse else 0
        self.connect_timeout = connect_timeout
        self.keepalive_expiry = keepalive_expiry
        # what a real client sends (default: the OpenAI Python SDK's, Accept-Encoding included)
        sent = dict(openai_python_headers(600.0) if headers is None else headers)
        self._base_headers = ""
        for name, value in sent.items():
            _check_header(name, value)
            self._base_headers += f"{name}: {value}\r\n"
        self._base_headers += "Content-Type: application/json\r\n"
        if api_key:
            _check_header("Authorization", f"Bearer {api_key}")
            self._base_headers += f"Authorization: Bearer {api_key}\r\n"
        self._idle: dict[tuple[str, str, int], list[Connection]] = {}
        self._open: set[Connection] = set()
        self.connects = 0  # connections opened, for tests and benchmarks
        self.closed = False

    def encode(self, target: Target, body: Mapping[str, Any], headers: Mapping[str, str] | None = None) -> bytes:
        """The request bytes of a JSON POST (compact JSON, UTF-8, as httpx encodes it)."""
        payload = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        extra = ""
        for name, value in (headers or {}).items():
            _check_header(name, value)
            extra += f"{name}: {value}\r\n"
        head = (
            f"POST {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n{self._base_headers}{extra}"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode("latin-1") + payload

    def idle_connection(self, target: Target) -> Connection | None:
        """A kept-alive connection to ``target``'s origin, or None: O(1) apart from dead ones skipped."""
        stack = self._idle.get(target.origin)
        now = time.monotonic()
        while stack:
            conn = stack.pop()
            if conn.reusable and now - conn.idle_since < self.keepalive_expiry:
                return conn
            conn.close()
        return None

    async def connect(self, target: Target) -> Connection:
        """Open a new connection (raises OSError, or TimeoutError after ``connect_timeout``)."""
        if self.closed:
            raise ConnectionClosed("the HTTP client is closed")
        ssl_ctx: ssl.SSLContext | None = None
        if target.scheme == "https":
            ssl_ctx = tls_context()  # the run's one trust policy (chaos.host.tls), SSL_CERT_FILE included
        conn = Connection(self, target.origin)
        async with asyncio.timeout(self.connect_timeout):  # the TCP connect and the TLS handshake together
            _transport, conn.t_connected, conn.t_tls = await open_transport(lambda: conn, target.host, target.port,
                                                                            ssl_ctx)
        self.connects += 1
        conn.conn_label = f"c{self.connects}"
        if self.closed:
            conn.close()
            raise ConnectionClosed("the HTTP client was closed while connecting")
        self._open.add(conn)
        return conn

    def release(self, conn: Connection, *, in_band_error: bool = False) -> None:
        """Take back a connection after its response; keep it for the next request only when
        ``may_reuse`` allows (``in_band_error``: the stream carried an error event), else close it."""
        conn.sink = None
        conn.resume_reading()
        if self.closed or not conn.reusable or not may_reuse(conn.status, keep_alive=conn.keep_alive,
                                                              complete=conn.complete, in_band_error=in_band_error):
            conn.close()
            return
        stack = self._idle.setdefault(conn.origin, [])
        if len(stack) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        stack.append(conn)

    def _forget(self, conn: Connection) -> None:
        self._open.discard(conn)

    async def aclose(self) -> None:
        """Close every connection, idle or busy."""
        self.closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
