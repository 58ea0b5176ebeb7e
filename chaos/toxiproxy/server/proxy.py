"""Proxies: listen-address resolution, the listener, and the per-connection byte pump."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from typing import Any

from .link import Link
from .toxics import ToxicSpec, derive_seed


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def not_found() -> ApiError:
    return ApiError(404, "proxy not found")


# -- addresses (Go's net.SplitHostPort / ResolveTCPAddr / Addr.String, enough of them) -------


def split_host_port(addr: str) -> tuple[str, str]:
    if addr.startswith("["):
        end = addr.find("]")
        if end < 0:
            raise ValueError(f"address {addr}: missing ']' in address")
        host, rest = addr[1:end], addr[end + 1 :]
        if not rest.startswith(":"):
            raise ValueError(f"address {addr}: missing port in address")
        return host, rest[1:]
    if ":" not in addr:
        raise ValueError(f"address {addr}: missing port in address")
    host, _, port = addr.rpartition(":")
    if ":" in host:
        raise ValueError(f"address {addr}: too many colons in address")
    return host, port


def parse_port(port: str) -> int:
    if port.isdigit() or (port.startswith("-") and port[1:].isdigit()):
        n = int(port)
        if not 0 <= n <= 65535:
            raise ValueError(f"address {port}: invalid port")
        return n
    if port == "":
        return 0
    try:
        return socket.getservbyname(port, "tcp")
    except OSError:
        raise ValueError(f"address tcp/{port}: unknown port") from None


def format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def resolve(addr: str) -> tuple[str | None, int]:
    """(host IP or None for all interfaces, port); raises ValueError with a Go-like message."""
    if addr == "":
        return None, 0
    host, port_s = split_host_port(addr)
    port = parse_port(port_s)
    if host in ("", "0.0.0.0", "::"):
        return None, port
    if host == "localhost":
        return "127.0.0.1", port
    try:
        socket.inet_pton(socket.AF_INET, host)
        return host, port
    except OSError:
        pass
    try:
        socket.inet_pton(socket.AF_INET6, host.split("%")[0])
        return host, port
    except OSError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"lookup {host}: {e.strerror or 'no such host'}") from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)  # Go prefers IPv4
    return str(infos[0][4][0]), port


def resolved_string(addr: str) -> str:
    host, port = resolve(addr)
    return format_addr(host, port) if host is not None else f":{port}"


def bind_listener(addr: str) -> tuple[socket.socket, str]:
    """Bind and listen; returns the socket and the actual address as Go reports it."""
    try:
        host, port = resolve(addr)
    except ValueError as e:
        raise ApiError(500, f"listen tcp: {e}") from None
    sock: socket.socket | None = None
    try:
        if host is None:
            try:
                sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("::", port))
            except OSError:
                if sock is not None:
                    sock.close()
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("0.0.0.0", port))
            sock.listen(4096)
            return sock, f"[::]:{sock.getsockname()[1]}"
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(4096)
        name = sock.getsockname()
        return sock, format_addr(name[0].split("%")[0], name[1])
    except OSError as e:
        if sock is not None:
            sock.close()
        what = (e.strerror or str(e)).lower()
        raise ApiError(500, f"listen tcp {format_addr(host or '', port)}: bind: {what}") from None


def parse_upstream(upstream: str) -> tuple[str, int]:
    host, port_s = split_host_port(upstream)
    return (host or "127.0.0.1"), parse_port(port_s)


# -- connections ---------------------------------------------------------------------------


class _Side(asyncio.Protocol):
    """Protocol for one socket of a proxied connection; ``which`` is 'client' or 'upstream'."""

    __slots__ = ("conn", "transport", "which")

    def __init__(self, conn: Connection, which: str) -> None:
        self.conn = conn
        self.which = which
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.conn.side_made(self.which, transport)

    def data_received(self, data: bytes) -> None:
        # hot path: client bytes feed the upstream link, upstream bytes the downstream link
        (self.conn.up if self.which == "client" else self.conn.down).feed(data)

    def eof_received(self) -> bool:
        (self.conn.up if self.which == "client" else self.conn.down).feed_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.side_lost(self.which)

    def pause_writing(self) -> None:
        link = self.conn.down if self.which == "client" else self.conn.up
        link.dst_paused = True
        link.update_reading()

    def resume_writing(self) -> None:
        link = self.conn.down if self.which == "client" else self.conn.up
        link.dst_paused = False
        link.update_reading()


class Connection:
    def __init__(self, proxy: Proxy, seq: int) -> None:
        self.proxy = proxy
        self.seq = seq
        self.loop = proxy.loop
        self.seed = derive_seed(proxy.server.seed, proxy.name, seq)
        self.up = Link(self, "upstream", self.loop)
        self.down = Link(self, "downstream", self.loop)
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.closed = False
        self.linger = False

    def rng_for(self, spec: ToxicSpec) -> random.Random:
        return random.Random(derive_seed(self.seed, spec.direction, spec.name))

    def side_made(self, which: str, transport: asyncio.Transport) -> None:
        if which == "client":
            self.client = transport
            transport.pause_reading()
            self.up.src_reading = False
            self.proxy.conns.add(self)
            self.loop.create_task(self._dial())
            return
        self.upstream = transport
        if self.closed:
            transport.close()
            return
        # set up before the upstream transport can deliver its first read
        self.up.src, self.up.dst = self.client, transport
        self.down.src, self.down.dst = transport, self.client
        specs = self.proxy.toxics
        if any(t.type == "reset_peer" for t in specs):
            self.set_linger()
        for spec in specs:
            (self.up if spec.direction == "upstream" else self.down).add(spec, self.rng_for(spec))
        self.up.update_reading()

    async def _dial(self) -> None:
        try:
            host, port = parse_upstream(self.proxy.upstream)
            await self.loop.create_connection(lambda: _Side(self, "upstream"), host, port)
        except (OSError, ValueError):
            self.close()

    def set_linger(self) -> None:
        self.linger = True
        for t in (self.client, self.upstream):
            sock = t.get_extra_info("socket") if t is not None else None
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass

    def side_lost(self, which: str) -> None:
        link = self.up if which == "client" else self.down
        if not link.eof:
            link.feed_eof()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.up.close()
        self.down.close()
        for t in (self.client, self.upstream):
            if t is not None and not t.is_closing():
                t.close()
        self.proxy.conns.discard(self)

    def reset(self) -> None:
        """Close both sockets at once (an RST where linger 0 was set)."""
        if self.closed:
            return
        self.closed = True
        self.up.close()
        self.down.close()
        for t in (self.client, self.upstream):
            if t is not None:
                t.abort()
        self.proxy.conns.discard(self)


class Proxy:
    def __init__(self, server: Any, name: str, listen: str, upstream: str) -> None:
        self.server = server
        self.loop: asyncio.AbstractEventLoop = server.loop
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics: list[ToxicSpec] = []  # creation order, both directions
        self.conns: set[Connection] = set()
        self._srv: asyncio.base_events.Server | None = None
        self._seq = 0

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        if self.enabled:
            return
        policy = getattr(getattr(self.server, "limits", None), "listen", None)
        if policy is not None:
            policy.check(self.listen)
        sock, actual = bind_listener(self.listen)
        try:
            self._srv = await self.loop.create_server(self._accept, sock=sock, backlog=4096)
        except OSError as e:
            sock.close()
            raise ApiError(500, str(e)) from None
        self.listen = actual
        self.enabled = True

    def _accept(self) -> _Side:
        self._seq += 1
        return _Side(Connection(self, self._seq), "client")

    def stop(self) -> None:
        if self._srv is not None:
            self._srv.close()
            self._srv = None
        self.enabled = False
        for c in list(self.conns):
            c.close()

    # -- toxics on live connections ----------------------------------------------------
    def add_toxic(self, spec: ToxicSpec) -> None:
        self.toxics.append(spec)
        for c in list(self.conns):
            if c.up.src is None:
                continue  # still dialing: it takes the chain when it finishes
            link = c.up if spec.direction == "upstream" else c.down
            link.add(spec, c.rng_for(spec))

    def update_toxic(self, spec: ToxicSpec) -> None:
        for c in list(self.conns):
            link = c.up if spec.direction == "upstream" else c.down
            st = link.find(spec)
            if st is not None:
                st.interrupt()

    def remove_toxic(self, spec: ToxicSpec) -> None:
        self.toxics.remove(spec)
        for c in list(self.conns):
            link = c.up if spec.direction == "upstream" else c.down
            st = link.find(spec)
            if st is not None:
                st.remove()

    def ordered_toxics(self) -> list[ToxicSpec]:
        return [t for t in self.toxics if t.direction == "upstream"] + [
            t for t in self.toxics if t.direction == "downstream"
        ]
