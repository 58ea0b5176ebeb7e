"""The stream hop as a process: its state (``StreamHop``), its two listeners, and the command line.

    STREAMCHAOS_HOP_TOKEN=... python -m chaos.hops.streamhop --name NAME --listen 127.0.0.1:0 \\
        --upstream http://HOST:PORT --control 127.0.0.1:0 [--taps FILE] [--max-events 2048] \\
        [--http 1.1|2] [--tls-cert CHAIN.pem --tls-key KEY.pem] [--upstream-ca CA.pem ...]

When both listeners are bound it prints one line to stdout and nothing more after it::

    streamhop ready {"listen": "127.0.0.1:P", "control": "127.0.0.1:Q", "pid": N, "version": "...",
                     "http": "1.1", "tls": false}

What its listen side speaks: HTTP/1.1 (``--http 1.1``, the default), or HTTP/2 as well (``--http 2``,
``h2front``): over TLS (``--tls-cert``/``--tls-key``) ALPN picks h2 or http/1.1; in the clear an HTTP/2
client's preface is answered as h2c with prior knowledge and anything else as HTTP/1.1. Either way
every stream goes through the same relay, rules and taps. ``--upstream-ca`` adds a CA the hop trusts for
an https upstream (the run's own, where the next hop or the target serves the run's certificate).

Everything else it says goes to stderr (the run's hop log). SIGTERM or SIGINT: stop accepting, close
every connection (a response under way ends as a bare EOF, its tap says so), write the taps of the
requests that were running, close the taps file, exit 0, all within ``STOP_GRACE_S``. It listens on
loopback only: a ``--listen`` or ``--control`` elsewhere is refused (exit 2).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import json
import os
import resource
import signal
import ssl
import sys
import time
from importlib import metadata
from typing import Any

import h11

from .control import MAX_CONTROL_CONNECTIONS, ControlAPI, serve_control
from .downstream import WRITE_HIGH
from .h2front import PREFACE, SOCKET_HIGH, H2Front, sniff
from .relay import Exchange
from .rules import Rule
from .taps import TapFile
from .upstream import HEAD_LIMIT, READ_SIZE, Origin, UpstreamConn, nodelay

__all__ = ["MAX_CONNECTIONS", "READY_PREFIX", "STOP_GRACE_S", "TOKEN_ENV", "VERSION", "StreamHop", "main"]

TOKEN_ENV = "STREAMCHAOS_HOP_TOKEN"
READY_PREFIX = "streamhop ready "
STOP_GRACE_S = 1.5  # from SIGTERM to exit, at most (the contract's bound is 2 s)
MAX_CONNECTIONS = 16384  # downstream connections at once; more are closed as they arrive
DEFAULT_MAX_EVENTS = 2048


def _version() -> str:
    try:
        return metadata.version("streamchaos")
    except metadata.PackageNotFoundError:
        return "0+unknown"


VERSION = _version()


def loopback(address: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` on a loopback address, or ValueError naming ``what``."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{what} must be HOST:PORT, got {address!r}")
    try:
        is_loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = False
    if not is_loopback:
        raise ValueError(f"{what} must be a loopback address (127.0.0.1, ::1), got {address!r}")
    return ("127.0.0.1" if host == "localhost" else host), int(port)


def _shown(sockname: Any) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class StreamHop:
    """The hop's state: its rules, counters and taps file, and the connections it serves."""

    def __init__(self, name: str, origin: Origin, token: str, taps: str | None = None,
                 max_events: int = DEFAULT_MAX_EVENTS, *, http2: bool = False,
                 tls: ssl.SSLContext | None = None) -> None:
        self.name, self.origin, self.max_events = name, origin, max_events
        self.http2, self.tls = http2, tls
        self.front = H2Front(self) if http2 else None  # the HTTP/2 side (h2front)
        self.rules: dict[str, Rule] = {}
        self.in_flight = 0
        self.requests = 0
        self.taps = TapFile(taps) if taps else None
        self.api = ControlAPI(self, token)
        self.listen = self.control = ""
        self._servers: list[asyncio.base_events.Server] = []
        self._relays: set[asyncio.Task[None]] = set()
        self._controls: set[asyncio.Task[None]] = set()
        self._exchanges: set[Exchange] = set()
        self._fronts: set[asyncio.Task[None]] = set()  # HTTP/2 connections
        self._spawned: set[asyncio.Task[None]] = set()  # HTTP/2 streams' relays, until they run

    async def start(self, listen: tuple[str, int], control: tuple[str, int]) -> None:
        relay = await asyncio.start_server(self._accept, listen[0], listen[1], limit=READ_SIZE, backlog=4096,
                                           ssl=self.tls)
        self._servers.append(relay)
        ctl = await asyncio.start_server(self._control_connection, control[0], control[1])
        self._servers.append(ctl)
        self.listen = _shown(relay.sockets[0].getsockname())
        self.control = _shown(ctl.sockets[0].getsockname())

    def status(self) -> dict[str, Any]:
        body = {"name": self.name, "listen": self.listen, "upstream": self.origin.url, "in_flight": self.in_flight,
                "requests": self.requests, "version": VERSION, "http": "2" if self.http2 else "1.1",
                "tls": self.tls is not None, "rules": [r.listing() for r in self.rules.values()]}
        if self.front is not None:
            body["h2"] = self.front.status()
        return body

    def rules_changed(self) -> None:
        if self.front is not None:
            self.front.rules_changed()

    def log(self, message: str) -> None:
        print(f"streamhop {self.name}: {message}", file=sys.stderr, flush=True)

    # -- connections -----------------------------------------------------------------------------------
    async def _control_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._controls) >= MAX_CONTROL_CONNECTIONS:
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._controls.add(task)
        try:
            await serve_control(self.api, reader, writer)
        finally:
            self._controls.discard(task)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A downstream connection: HTTP/1.1, or where the hop speaks HTTP/2, h2 by ALPN over TLS and by
        its preface in the clear."""
        if self.front is None:
            await self._relay_connection(reader, writer)
            return
        ssl_object = writer.get_extra_info("ssl_object")
        initial = b""
        if ssl_object is not None:
            h2 = ssl_object.selected_alpn_protocol() == "h2"
        else:
            initial = await sniff(reader)
            h2 = initial.startswith(PREFACE)
        if h2:
            await self._h2_connection(reader, writer, initial)
        else:
            await self._relay_connection(reader, writer, initial)

    async def _h2_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, initial: bytes) -> None:
        assert self.front is not None
        if len(self._relays) + len(self._fronts) >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._fronts.add(task)
        nodelay(writer)
        writer.transport.set_write_buffer_limits(high=SOCKET_HIGH)
        try:
            await self.front.serve(reader, writer, initial)
        finally:
            self._fronts.discard(task)
            writer.close()

    def relay_stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """An HTTP/2 stream's exchange (``h2front``), run as a connection of its own."""
        task = asyncio.get_running_loop().create_task(self._relay_connection(reader, writer))
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    async def _relay_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                initial: bytes = b"") -> None:
        if len(self._relays) >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        nodelay(writer)
        writer.transport.set_write_buffer_limits(high=WRITE_HIGH)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        if initial:  # read already, to tell HTTP/1.1 from HTTP/2's preface
            conn.receive_data(initial)
        upstream: UpstreamConn | None = None
        try:
            while True:
                request = await _next_request(conn, reader, writer)
                if request is None:
                    break
                keep, upstream = await self._exchange(conn, reader, writer, request, upstream)
                if not keep:
                    break
        finally:
            self._relays.discard(task)
            if upstream is not None:
                upstream.close()
            writer.close()

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        request: h11.Request, upstream: UpstreamConn | None) -> tuple[bool, UpstreamConn | None]:
        exchange = Exchange(self, conn, reader, writer, request, upstream)
        self._exchanges.add(exchange)
        keep = False
        try:
            keep = await exchange.run()
        except asyncio.CancelledError:
            exchange.abandon()
            raise
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the hop
            self.log(f"request {exchange.tap.seq} failed: {exc!r}")
            exchange.abandon()
        finally:
            self._exchanges.discard(exchange)
            upstream = exchange.next_upstream()
            tap = exchange.close_out()
            if self.taps is not None:
                self.taps.write(tap)
        return keep, upstream

    # -- stopping ----------------------------------------------------------------------------------------
    async def stop(self, grace: float = STOP_GRACE_S) -> None:
        """Stop accepting, end every connection, write the running requests' taps, close the taps file."""
        for server in self._servers:
            server.close()
        tasks = [*self._relays, *self._controls, *self._fronts, *self._spawned]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        if self.taps is not None:
            self.taps.close()


async def _next_request(conn: h11.Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> h11.Request | None:
    """The next request head on a downstream connection, or None when it closed (or sent no valid head:
    then it is answered 400, or 431 for a head past ``HEAD_LIMIT``, and closed)."""
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            code = 431 if "too long" in str(exc).lower() or "buffer" in str(exc).lower() else 400
            with contextlib.suppress(h11.LocalProtocolError):
                writer.write(conn.send(h11.Response(status_code=code, headers=[(b"connection", b"close"),
                                                                               (b"content-length", b"0")])) or b"")
            return None
        if event is h11.NEED_DATA:
            try:
                data = await reader.read(READ_SIZE)
            except OSError:
                return None
            conn.receive_data(data)
            continue
        return event if type(event) is h11.Request else None


def _raise_file_limit() -> None:
    """As many open files as the hard limit allows (capped): each relayed stream holds two sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    want = min(want, 65536)
    if want > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m chaos.hops.streamhop",
                                 description="streamchaos's stream hop: an SSE-aware HTTP/1.1 proxy with faults "
                                             f"and taps (control token in ${TOKEN_ENV})")
    ap.add_argument("--name", required=True, help="the hop's name in the experiment's path")
    ap.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT on loopback (default %(default)s)")
    ap.add_argument("--upstream", required=True, help="http://HOST:PORT the hop forwards to")
    ap.add_argument("--control", default="127.0.0.1:0", help="the control API's HOST:PORT on loopback")
    ap.add_argument("--taps", default=None, help="append one JSON line per finished request here (mode 0600)")
    ap.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS,
                    help="events a tap keeps per side (default %(default)s)")
    ap.add_argument("--http", choices=("1.1", "2"), default="1.1",
                    help="2: speak HTTP/2 to clients too (h2 by ALPN over TLS, h2c with prior knowledge in the clear)")
    ap.add_argument("--tls-cert", default=None, help="serve TLS with this certificate chain (PEM, leaf first)")
    ap.add_argument("--tls-key", default=None, help="... and this private key (PEM)")
    ap.add_argument("--upstream-ca", action="append", default=[],
                    help="a CA file trusted for an https upstream besides the system's (repeatable)")
    return ap.parse_args(argv)


def server_context(cert: str, key: str, http2: bool) -> ssl.SSLContext:
    """The listen side's TLS: the certificate and key given, ALPN h2 then http/1.1 where it speaks HTTP/2."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
    return context


async def _serve(hop: StreamHop, listen: tuple[str, int], control: tuple[str, int]) -> int:
    try:
        await hop.start(listen, control)
    except OSError as exc:
        print(f"streamhop: cannot listen: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ready = {"listen": hop.listen, "control": hop.control, "pid": os.getpid(), "version": VERSION,
             "http": "2" if hop.http2 else "1.1", "tls": hop.tls is not None}
    sys.stdout.write(READY_PREFIX + json.dumps(ready) + "\n")
    sys.stdout.flush()
    scheme = "https" if hop.tls is not None else "http"
    hop.log(f"relaying {scheme}://{hop.listen} (HTTP/{'2 and 1.1' if hop.http2 else '1.1'}) → {hop.origin.url}, "
            f"control on {hop.control}")
    await stop.wait()
    t0 = time.monotonic()
    await hop.stop()
    hop.log(f"stopped in {time.monotonic() - t0:.3f}s after {hop.requests} requests")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    token = os.environ.get(TOKEN_ENV, "")
    try:
        if not token:
            raise ValueError(f"${TOKEN_ENV} is not set: the control API needs a token")
        listen, control = loopback(args.listen, "--listen"), loopback(args.control, "--control")
        origin = Origin.parse(args.upstream, tuple(args.upstream_ca))
        if args.max_events < 0:
            raise ValueError("--max-events must be 0 or more")
        if (args.tls_cert is None) != (args.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        http2 = args.http == "2"
        tls = server_context(args.tls_cert, args.tls_key, http2) if args.tls_cert else None
        hop = StreamHop(args.name, origin, token, args.taps, args.max_events, http2=http2, tls=tls)
    except (ValueError, OSError) as exc:
        print(f"streamhop: {exc}", file=sys.stderr, flush=True)
        return 2
    _raise_file_limit()
    # fewer, cheaper collections: what exists at start is frozen out of them, and the young generation
    # is collected every 50,000 allocations instead of 700 (the hot path allocates a few per event)
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        import uvloop  # faster per event than asyncio's own loop; optional
        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    return int(runner(_serve(hop, listen, control)))
