"""The hop's upstream side: where it forwards (``Origin``), one HTTP/1.1 connection there on h11
(``UpstreamConn``, kept for the next request of the same downstream connection when both ends allow),
and the header rules of a forwarding proxy (hop-by-hop headers dropped, ``Host`` rewritten)."""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import h11

__all__ = ["CONNECT_TIMEOUT_S", "HEAD_LIMIT", "HOP_BY_HOP", "READ_SIZE", "Origin", "UpstreamConn",
           "UpstreamFailed", "forwarded_request_headers", "linger_reset", "nodelay", "upstream_context"]

READ_SIZE = 65536  # bytes asked of the socket per read
HEAD_LIMIT = 64 * 1024  # bytes of a request or response head (h11's max_incomplete_event_size): more is refused
CONNECT_TIMEOUT_S = 10.0

# connection-scoped headers a proxy must not forward (RFC 9110 7.6.1); framing is redone by h11
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"upgrade",
                        b"transfer-encoding", b"proxy-authenticate", b"proxy-authorization"})


class UpstreamFailed(Exception):
    """The upstream could not be reached or answered something that is not HTTP/1.1."""


@dataclass(frozen=True)
class Origin:
    """The upstream as ``--upstream`` names it: ``http(s)://host:port[/prefix]``; ``cafiles``: CA files
    trusted for an https upstream besides the system's (``--upstream-ca``: the run's own CA, when the
    hop after this one, or the target, serves the run's certificate)."""

    scheme: str
    host: str
    port: int
    prefix: str  # a path prefix put before every request target ("" for none)
    cafiles: tuple[str, ...] = ()

    @classmethod
    def parse(cls, url: str, cafiles: tuple[str, ...] = ()) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--upstream must be http://HOST:PORT or https://HOST:PORT, got {url!r}")
        if parts.query or parts.fragment or parts.username:
            raise ValueError(f"--upstream takes no query, fragment or credentials: {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"--upstream has a bad port: {url!r}") from exc
        if cafiles:
            upstream_context(cafiles)  # a file that is no CA fails here, at the start, not at the first request
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"), cafiles)

    @property
    def host_header(self) -> bytes:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return (host if self.port == default else f"{host}:{self.port}").encode("ascii")

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host_header.decode()}{self.prefix}"


@functools.cache
def upstream_context(cafiles: tuple[str, ...]) -> ssl.SSLContext:
    """The client context for an https upstream: the system's CAs and ``cafiles``, made once (a context
    loads the whole CA store: milliseconds, not something to pay per connection)."""
    context = ssl.create_default_context()
    for cafile in cafiles:
        context.load_verify_locations(cafile=cafile)
    return context


def nodelay(transport: asyncio.BaseTransport | asyncio.StreamWriter) -> None:
    """Small writes leave at once: an SSE event must not wait for Nagle's timer."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def linger_reset(transport: asyncio.WriteTransport) -> None:
    """Close with a TCP reset (SO_LINGER 0): the peer's next read fails with ECONNRESET."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


def forwarded_request_headers(headers: list[tuple[bytes, bytes]], origin: Origin) -> list[tuple[bytes, bytes]]:
    """The request's headers as sent upstream: unchanged but for Host (the upstream's) and hop-by-hop
    headers (dropped: h11 frames the body again from Content-Length or Transfer-Encoding, kept)."""
    named = {v.strip().lower() for name, value in headers if name.lower() == b"connection"
             for v in value.split(b",")}
    out = [(b"Host", origin.host_header)]
    for name, value in headers:
        low = name.lower()
        if low == b"host" or low in named:
            continue
        if low in HOP_BY_HOP and low != b"transfer-encoding":
            continue
        out.append((name, value))
    return out


class UpstreamConn(asyncio.Protocol):
    """One connection to the upstream, as a protocol: the response head is parsed by h11 and awaited
    (``read_head``); the body is handed, read by read, to a ``sink`` called straight from
    ``data_received`` (``start_body``): no task wakes up between an upstream read and its downstream
    write, which is the hop's hot path."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)
        self.closed = False
        self.eof = False  # the upstream closed its side
        self.lost: BaseException | None = None  # the connection failed (a reset)
        # set by the relay when the response's body ended by its framing on a keep-alive response: h11
        # parsed only the head (``framing``), so its own state cannot say the connection is reusable
        self.body_done = False
        self._waiter: asyncio.Future[None] | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._end: Callable[[str], None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()

    @classmethod
    async def open(cls, origin: Origin) -> UpstreamConn:
        context = upstream_context(origin.cafiles) if origin.scheme == "https" else None
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(cls, origin.host, origin.port, ssl=context), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise UpstreamFailed(f"cannot connect to {origin.url}: {exc!r}") from exc
        return conn

    # -- the protocol ----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one in all but its class
        nodelay(transport)

    def data_received(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(data)
            return
        self.conn.receive_data(data)
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        if self._end is not None:
            self._end("eof")
        else:
            self.conn.receive_data(b"")
            self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        self._writable.set()
        if self._end is not None:
            self._end("reset" if exc is not None else "eof")
        elif exc is not None or not self.eof:
            self.eof = True
            self._wake()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- what the relay calls ----------------------------------------------------------------------------
    def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the request body waits in our send buffer."""
        await self._writable.wait()

    async def read_head(self) -> h11.Event:
        """The next event of the response head: an informational response or the response (h11's)."""
        while True:
            if self.lost is not None:
                raise UpstreamFailed(f"the upstream connection failed before the response head: {self.lost!r}")
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise UpstreamFailed(f"no valid response head from the upstream: {exc}") from exc
            if event is not h11.NEED_DATA:
                if type(event) is h11.ConnectionClosed or not isinstance(event, h11.Event):
                    raise UpstreamFailed("the upstream closed before its response head")
                return event
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def start_body(self, sink: Callable[[bytes], None], end: Callable[[str], None]) -> None:
        """From now on every read goes to ``sink`` as it arrives (first what came with the head), and the
        connection's end to ``end`` ("eof" or "reset")."""
        self._sink, self._end = sink, end
        first = self.conn.trailing_data[0]
        if first:
            sink(first)
        if self.eof and self._end is not None:
            self._end("eof")

    def stop_body(self) -> None:
        self._sink = self._end = None

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def reusable(self) -> bool:
        """The request went out whole, the response ended by its framing on a keep-alive connection,
        and the upstream has not closed since: keep it for the next request (with a fresh h11 state);
        otherwise the caller closes it."""
        if self.closed or self.eof or self.transport is None or self.transport.is_closing() or not self.body_done:
            return False
        if self.conn.our_state is not h11.DONE:
            return False
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=HEAD_LIMIT)
        self.body_done = False
        self.stop_body()
        return True

    def close(self) -> None:
        self.stop_body()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def reset(self) -> None:
        self.stop_body()
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                linger_reset(self.transport)
