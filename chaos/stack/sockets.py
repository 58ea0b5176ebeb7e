"""The builtin stack's accepted TCP connections: TCP_NODELAY on each, and Nagle back on for ``server.nagle``.

asyncio sets TCP_NODELAY on an accepted socket only when the listening socket was created with
protocol IPPROTO_TCP; a socket made with protocol 0 (``socket.socket(AF_INET, SOCK_STREAM)``) and
handed to uvicorn leaves Nagle on, and on a keep-alive connection every response's second small
write (the first SSE event after the headers) then waits for the client's delayed ACK, ~40 ms.
So the stack sets the option itself, on every connection, from uvicorn's protocol
(``protocol_class``), and keeps the live transports in a ``Connections`` registry: the
``server.nagle`` hook fault turns Nagle back on for live and new connections through it, and every
figure it reports is read back from the sockets (``census``), not from what was asked.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["Connections", "protocol_class", "set_nodelay", "socket_nodelay"]

_TCP_FAMILIES = (socket.AF_INET, socket.AF_INET6)


def _tcp_socket(transport: Any) -> socket.socket | None:
    sock = transport.get_extra_info("socket") if transport is not None else None
    if (sock is None or getattr(sock, "family", None) not in _TCP_FAMILIES
            or getattr(sock, "type", None) != socket.SOCK_STREAM):
        return None
    return sock  # type: ignore[no-any-return]  # socket-like: uvloop hands a PseudoSocket


def set_nodelay(transport: Any, on: bool) -> bool:
    """Set TCP_NODELAY on a transport's TCP socket; False when it has none or is closed."""
    sock = _tcp_socket(transport)
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if on else 0)
    except OSError:
        return False
    return True


def socket_nodelay(transport: Any) -> bool | None:
    """TCP_NODELAY as the kernel reports it for a transport's socket (None: no TCP socket)."""
    sock = _tcp_socket(transport)
    if sock is None:
        return None
    try:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    except OSError:
        return None


class Connections:
    """Live accepted connections and whether Nagle is wanted on them (False: TCP_NODELAY on)."""

    def __init__(self) -> None:
        self._transports: set[Any] = set()
        self.nagle = False
        self.accepted = 0

    def count(self) -> int:
        """Connections open now (the HTTP/2 server's connection cap counts them)."""
        return len(self._transports)

    def opened(self, transport: Any) -> None:
        self.accepted += 1
        self._transports.add(transport)
        set_nodelay(transport, not self.nagle)

    def closed(self, transport: Any) -> None:
        self._transports.discard(transport)

    def set_nagle(self, on: bool) -> int:
        """Nagle on (True) or off for every live connection and every new one; how many were set."""
        self.nagle = on
        return sum(set_nodelay(t, not on) for t in list(self._transports))

    def census(self) -> dict[str, Any]:
        """Read back from the sockets: open connections, how many have Nagle on, and the wanted state."""
        states = [socket_nodelay(t) for t in list(self._transports)]
        tcp = [s for s in states if s is not None]
        return {
            "open": len(tcp),
            "nagle_on": sum(1 for s in tcp if not s),
            "nodelay_on": sum(1 for s in tcp if s),
            "nagle_wanted": self.nagle,
            "accepted_total": self.accepted,
        }


def protocol_class(base: type, connections: Connections) -> type:
    """A subclass of uvicorn's HTTP protocol ``base`` that registers each connection's transport."""

    class TrackedProtocol(base):  # type: ignore[misc]  # a base class known only at run time (uvicorn's choice)
        def connection_made(self, transport: Any) -> None:
            self._sc_transport = transport
            connections.opened(transport)
            super().connection_made(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            connections.closed(getattr(self, "_sc_transport", None))
            super().connection_lost(exc)

    TrackedProtocol.__name__ = TrackedProtocol.__qualname__ = f"Tracked{base.__name__}"
    return TrackedProtocol
