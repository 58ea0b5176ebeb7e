"""What one embedded Toxiproxy will hold: request deadlines, connections, names, bodies, listens.

Real Toxiproxy bounds none of these. The embedded server runs as the runner's user (root on a GPU
host), so a local client must not be able to hold it with slow requests, fill its memory with
names, or have it open privileged ports on every interface.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from .proxy import ApiError, resolve, resolved_string

MAX_NAME = 256  # characters of a proxy or toxic name
MAX_ADDRESS = 1024  # characters of a listen or upstream address
MAX_PROXIES = 1024
MAX_TOXICS = 256  # per proxy


@dataclass
class ListenPolicy:
    """Which addresses a proxy may listen on.

    ``loopback_only``: refuse a listen on every interface, on a non-loopback address, or on a
    privileged port (1-1023), unless it is one of ``allowed`` (as written or as resolved).
    """

    loopback_only: bool = False
    allowed: set[str] = field(default_factory=set)

    def check(self, listen: str) -> None:
        """Raise a 403 ``ApiError`` for a refused listen; an address that does not parse is left
        to the bind, which answers it as real Toxiproxy does (500)."""
        if not self.loopback_only or listen in self.allowed:
            return
        try:
            host, port = resolve(listen)
            shown = resolved_string(listen)
        except ValueError:
            return
        if shown in {self._resolved(a) for a in self.allowed}:
            return
        if host is None or not _is_loopback(host):
            raise ApiError(403, f"listen {listen}: only loopback addresses are allowed on this server")
        if 0 < port < 1024:
            raise ApiError(403, f"listen {listen}: privileged ports (below 1024) are not allowed on this server")

    @staticmethod
    def _resolved(addr: str) -> str:
        try:
            return resolved_string(addr)
        except ValueError:
            return addr


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@dataclass
class Limits:
    """Budgets of one server. ``body_budget``: request-body bytes held across all connections."""

    request_timeout: float = 30.0  # seconds from a request's first byte to the end of its body
    max_connections: int = 256
    max_body: int = 8 << 20
    body_budget: int = 32 << 20
    listen: ListenPolicy = field(default_factory=ListenPolicy)
    _held: int = 0

    def reserve(self, n: int) -> bool:
        """Take ``n`` body bytes from the shared budget; False when they do not fit."""
        if n > self.max_body or self._held + n > self.body_budget:
            return False
        self._held += n
        return True

    def release(self, n: int) -> None:
        self._held = max(0, self._held - n)


def check_name(what: str, name: str) -> None:
    if len(name) > MAX_NAME:
        raise ApiError(400, f"{what} name too long: at most {MAX_NAME} characters")


def check_address(what: str, addr: str) -> None:
    if len(addr) > MAX_ADDRESS:
        raise ApiError(400, f"{what} too long: at most {MAX_ADDRESS} characters")
