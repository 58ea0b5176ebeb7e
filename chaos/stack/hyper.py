"""The builtin stack over Hypercorn (``stack serve --http 2``): HTTP/2 and HTTP/1.1 for the same app.

uvicorn speaks HTTP/1.1 only. Hypercorn speaks h2 over TLS (chosen by ALPN, ``h2`` then
``http/1.1``), h2c with prior knowledge on plain TCP (a connection that opens with the HTTP/2
preface), and HTTP/1.1 to every other client, on one socket. Its ``serve`` binds its own sockets,
installs its own signal handlers and owns the shutdown; we run its per-connection server
(``TCPServer``) from our own accept loop instead (``HyperServer``), so that, as under uvicorn:

- every accepted connection is registered in the stack's ``Connections`` (TCP_NODELAY on, the
  ``server.nagle`` fault, the census the admin API reports);
- the connection cap holds: over it, an h2 connection gets a GOAWAY that says no stream was
  processed, an HTTP/1.1 one the 503 the uvicorn path writes; either is then closed;
- the first SIGTERM/SIGINT fails every live request (each stream ends with an in-band error and
  ``[DONE]``) and closes the listener; once every response has ended and its last frames are written,
  every connection is told to end (Hypercorn's ``terminated``: a GOAWAY, then the close), all within
  ``GRACE_S``; a second signal closes them at once. Hypercorn closes a connection as soon as it is
  told to and idle, dropping what its h2 sender has not written yet (a stream's ``[DONE]`` or its
  END_STREAM, sent after the GOAWAY or never): hence the wait.

Hypercorn's h2 and HTTP/1.1 protocols have no header or body deadline of their own. A connection
with no request in flight is closed after the keep-alive timeout (Hypercorn's idle timer, which also
runs while a request's headers trickle in), except an h2c one that sent the preface and never a
request: Hypercorn stops the timer for the preface (which it parses as an HTTP/1.1 request) and never
starts it again, so such a connection stayed open for good (measured). So the accept loop adds one
deadline: a connection's first request must reach the app within ``--header-timeout``, else the
connection is closed (without the 408 the uvicorn path writes). A body that stops short has no
deadline (``serve`` refuses an explicit ``--body-timeout`` with ``--http 2``).

``H2Adapter`` wraps the app for two things HTTP/2 needs that HTTP/1.1 did not:

- one SSE event per DATA frame: Hypercorn's h2 sender frames whatever the app has buffered for a
  stream each time it runs (up to 16 KiB), so events written back to back (the last token's, the
  usage chunk, ``[DONE]``) would share one frame, and a client that times events by frame would see
  one arrival for three. After each body chunk of an h2 response the adapter yields to the loop
  once, which runs the sender (woken by the chunk, so already queued) before the next chunk is
  buffered. (Measured: 30 frames for 31 events without it, 31 with it.)
- a response the app leaves unfinished (an exception after its headers: the ``mid_stream`` timeout
  fault, a bug) is ended with END_STREAM and no ``[DONE]``. Hypercorn's own error path forgets such a
  stream without ending or resetting it, so the client waited until the idle connection was closed
  (5 s later, every other stream on it lost too); over HTTP/1.1 it closes the connection at once.
  ASGI has no message for RST_STREAM, so the cut stream ends cleanly at the HTTP/2 layer and shows
  as a stream without ``[DONE]`` (``Connection: close`` on a fault's 500 is dropped by the h2
  library, which strips connection-specific headers, and the connection stays).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
from collections.abc import Callable
from types import FrameType
from typing import Any

from .guard import _FULL_503, ServerLimits
from .sockets import Connections

__all__ = ["GRACE_S", "H2Adapter", "HyperServer", "hypercorn_config"]

log = logging.getLogger("chaos.stack.serve")

GRACE_S = 5.0  # as uvicorn's timeout_graceful_shutdown in serve.py: live connections get this long to end
SETTLE_POLL_S = 0.005  # how often the shutdown looks whether every response has ended and been written
_PREFACE = b"PRI * HTTP/2.0"  # how an h2c client with prior knowledge opens a connection

ASGIApp = Callable[..., Any]


def hypercorn_config(limits: ServerLimits, log_level: str = "warning") -> Any:
    """Hypercorn's settings for the builtin server (a function, so a test can read them)."""
    from hypercorn.config import Config

    config = Config()
    config.keep_alive_timeout = limits.keep_alive_timeout  # a connection with no request in flight
    config.read_timeout = None  # a reader of a long stream may send nothing for minutes
    # uvicorn has no cap on requests per connection; Hypercorn's default (1000) would end an h2 load's
    # connections with a GOAWAY every 1000 streams
    config.keep_alive_max_requests = 2**31
    config.include_server_header = False
    config.accesslog = None
    error_log = logging.getLogger("chaos.stack.hypercorn")
    error_log.setLevel(log_level.upper())
    config.errorlog = error_log  # through our handlers, not a second stderr handler of Hypercorn's own
    config.ssl_handshake_timeout = limits.header_timeout  # a handshake is part of a request arriving
    return config


class H2Adapter:
    """The app as Hypercorn serves it: an h2 response framed one body chunk per DATA frame, and ended
    where the app left it unfinished (the module docstring says why)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.in_flight = 0  # requests the app is answering now, over either protocol (the shutdown waits)
        self.requested: set[tuple[Any, ...]] = set()  # (host, port) of each peer that has sent a request

    @staticmethod
    def peer(address: Any) -> tuple[Any, ...] | None:
        """``(host, port)`` of a peer address (an IPv6 one has four items), the key of ``requested``."""
        return tuple(address[:2]) if address else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.in_flight += 1
        client = self.peer(scope.get("client"))
        if client is not None:
            self.requested.add(client)
        try:
            if scope.get("type") == "http" and scope.get("http_version") == "2":
                await self._h2(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _h2(self, scope: Any, receive: Any, send: Any) -> None:
        state = {"started": False, "ended": False}

        async def h2_send(message: dict[str, Any]) -> None:
            kind = message.get("type")
            if kind == "http.response.start":
                state["started"] = True
            elif kind == "http.response.body":
                state["ended"] = not message.get("more_body", False)
            await send(message)
            if kind == "http.response.body" and not state["ended"]:
                await asyncio.sleep(0)  # let the sender frame this chunk alone (module docstring)

        try:
            await self.app(scope, receive, h2_send)
        finally:
            if state["started"] and not state["ended"]:
                with contextlib.suppress(Exception):  # the stream may be gone (a reset, a lost connection)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _goaway() -> bytes:
    """An h2 server preface and a GOAWAY saying no stream was processed (the client may retry)."""
    import h2.config
    import h2.connection
    import h2.errors

    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    conn.close_connection(error_code=h2.errors.ErrorCodes.NO_ERROR, additional_data=b"too many open connections")
    return conn.data_to_send()


class HyperServer:
    """Hypercorn's connections under our accept loop; ``started``, ``should_exit`` and ``handle_exit``
    as uvicorn's ``Server`` has them, so ``serve.py`` announces and stops either alike."""

    def __init__(self, app: ASGIApp, limits: ServerLimits, connections: Connections, *,
                 ssl_context: ssl.SSLContext | None, drain: Callable[[], None], log_level: str = "warning") -> None:
        from hypercorn.utils import wrap_app

        self.config = hypercorn_config(limits, log_level)
        self.adapter = H2Adapter(app)
        self.app = wrap_app(self.adapter, self.config.wsgi_max_body_size, "asgi")
        self.limits = limits
        self.connections = connections
        self.ssl_context = ssl_context
        self.drain = drain
        self.started = False
        self.should_exit = False
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: set[Any] = set()  # Hypercorn's TCPServer of each open connection

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """First signal: fail live requests, then stop; a second: close every connection now."""
        if self.should_exit:
            for task in list(self._tasks):
                task.cancel()
            return
        self.should_exit = True
        self.drain()
        self._stop.set()

    async def serve(self, sockets: list[socket.socket]) -> None:
        from hypercorn.asyncio.worker_context import WorkerContext

        loop = asyncio.get_running_loop()
        context = WorkerContext(None)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        servers = [await asyncio.start_server(
            lambda r, w: self._connection(r, w, context), sock=sock, ssl=self.ssl_context, backlog=2048,
            ssl_handshake_timeout=self.limits.header_timeout if self.ssl_context else None) for sock in sockets]
        try:
            self.started = not self.should_exit
            await self._stop.wait()
        finally:
            await self._close(servers, context)
            for sig, handler in previous.items():  # as uvicorn does; remove_signal_handler alone leaves the default
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)

    async def _close(self, servers: list[asyncio.Server], context: Any) -> None:
        """Stop accepting; once every response has ended and been written, tell every connection to end
        (module docstring); up to ``GRACE_S`` in all, then close what is left."""
        for server in servers:
            server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GRACE_S
        while not self._settled() and loop.time() < deadline:
            await asyncio.sleep(SETTLE_POLL_S)
        await context.terminated.set()  # Hypercorn's signal: GOAWAY / close each connection once idle
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=max(0.1, deadline - loop.time()))
            for task in late:
                task.cancel()
            if late:
                log.warning("closed %d connection(s) still open %gs after the shutdown began", len(late), GRACE_S)
                await asyncio.wait(late, timeout=1.0)

    def _settled(self) -> bool:
        """No request is being answered, and no h2 connection holds frames its sender has not written."""
        if self.adapter.in_flight:
            return False
        # Hypercorn keeps a stream's buffer until its END_STREAM is written (TCPServer.protocol: its
        # ProtocolWrapper, whose .protocol is the H2Protocol of an h2 connection)
        return not any(getattr(getattr(getattr(tcp, "protocol", None), "protocol", None), "stream_buffers", None)
                       for tcp in self._live)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: Any) -> None:
        from hypercorn.asyncio.tcp_server import TCPServer

        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        transport = writer.transport
        if self.connections.count() >= self.limits.max_connections:
            await self._refuse(reader, writer)
            return
        self.connections.opened(transport)
        loop = asyncio.get_running_loop()
        peer = H2Adapter.peer(writer.get_extra_info("peername"))
        deadline = loop.call_later(self.limits.header_timeout, self._first_request_due, peer, transport)
        tcp = TCPServer(self.app, loop, self.config, context, {}, reader, writer)
        self._live.add(tcp)
        try:
            await tcp
        finally:
            deadline.cancel()
            self._live.discard(tcp)
            if peer is not None:
                self.adapter.requested.discard(peer)
            self.connections.closed(transport)

    def _first_request_due(self, peer: tuple[Any, ...] | None, transport: asyncio.BaseTransport) -> None:
        """Close a connection whose first request has not reached the app within --header-timeout."""
        if peer in self.adapter.requested or transport.is_closing():
            return
        log.info("closing a connection from %s: no request within %gs", peer, self.limits.header_timeout)
        transport.close()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Over the connection cap: a GOAWAY to an h2 client, a 503 to any other, then close."""
        ssl_object = writer.get_extra_info("ssl_object")
        if ssl_object is not None:
            h2 = ssl_object.selected_alpn_protocol() == "h2"
        else:  # plain TCP: h2c with prior knowledge opens with the preface, before the server says anything
            first = b""
            with contextlib.suppress(TimeoutError, OSError):
                first = await asyncio.wait_for(reader.read(len(_PREFACE)), self.limits.header_timeout)
            h2 = first.startswith(_PREFACE[:3])  # "PRI": no HTTP/1.1 method starts so
        with contextlib.suppress(OSError):
            writer.write(_goaway() if h2 else _FULL_503)
            writer.close()
            await writer.wait_closed()
