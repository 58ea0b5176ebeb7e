"""Who listens on a TCP port of this host, read from /proc: the sockets, the processes holding them.

On a shared network namespace (a container on the host's network) whoever binds a port first
answers it: the docker target with ``network: host`` checks that its port is free before the
container starts, and that every socket answering ``127.0.0.1:PORT`` is held by the container's
own processes before a request carrying a credential goes there (``SECURITY.md``).

A socket is matched to its holders by inode (``/proc/net/tcp{,6}`` against ``/proc/PID/fd``).
Where a holder's descriptors cannot be read (another user's process, when the runner is not
root), the socket's owner uid (``/proc/net/tcp``'s own column) stands in: a socket nobody visible
holds counts as the container's only when its uid is one of the container's processes' uids.
A leaf module.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Listener", "descendants", "foreign_listener", "listeners", "listening"]

PROC = Path("/proc")
_LISTEN = "0A"  # /proc/net/tcp's state column: TCP_LISTEN


@dataclass(frozen=True)
class Listener:
    """One socket listening on the port, reachable at 127.0.0.1 (bound there, or to a wildcard)."""

    address: str  # as bound: 127.0.0.1, 0.0.0.0, ::, ::ffff:127.0.0.1
    port: int
    inode: int
    uid: int  # the socket's owner, as the kernel records it
    pids: tuple[int, ...] = ()  # the processes holding it that this runner can see (none: unreadable)

    def describe(self, proc: Path = PROC) -> str:
        """``pid 123 (python3) listening on 127.0.0.1:8000``: who it is, for an error message."""
        where = f"[{self.address}]" if ":" in self.address else self.address
        if not self.pids:
            return f"a process of uid {self.uid} this runner cannot see listening on {where}:{self.port}"
        holders = ", ".join(f"pid {pid} ({_comm(pid, proc)})" for pid in self.pids)
        return f"{holders} listening on {where}:{self.port}"


def _comm(pid: int, proc: Path) -> str:
    try:
        return (proc / str(pid) / "comm").read_text(errors="replace").strip() or "?"
    except OSError:
        return "gone"


def _decode(hexaddr: str) -> tuple[str, int]:
    """``/proc/net/tcp{,6}``'s ``HEX:PORT`` (each 32-bit word in host order) → ``(address, port)``."""
    host_hex, port_hex = hexaddr.split(":")
    raw = b"".join(bytes.fromhex(host_hex[i:i + 8])[::-1] for i in range(0, len(host_hex), 8))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, raw), int(port_hex, 16)


def _answers_loopback(address: str) -> bool:
    """Whether a connection to 127.0.0.1 can reach a socket bound to ``address``: 127.0.0.1 itself or a
    wildcard (``::`` counts: dual-stack unless IPV6_V6ONLY, which /proc does not show)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_unspecified or ip == ipaddress.IPv4Address("127.0.0.1")


def _sockets(port: int, proc: Path) -> list[Listener]:
    """The listening sockets on ``port`` that 127.0.0.1 reaches, holders not looked up yet."""
    found: list[Listener] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text(encoding="ascii", errors="replace").splitlines()[1:]
        except OSError:  # no IPv6 on this host
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, bound = _decode(fields[1])
            if bound == port and _answers_loopback(address):
                found.append(Listener(address, port, int(fields[9]), int(fields[7])))
    return found


def _holders(inodes: Collection[int], pids: Iterable[int], proc: Path) -> dict[int, set[int]]:
    """inode → the pids (of ``pids``) holding a descriptor of that socket, as far as we may read them."""
    held: dict[int, set[int]] = {}
    wanted = {f"socket:[{inode}]": inode for inode in inodes}
    for pid in pids:
        with contextlib.suppress(OSError):  # gone, or another user's (not root)
            for fd in os.listdir(proc / str(pid) / "fd"):
                with contextlib.suppress(OSError):
                    inode = wanted.get(os.readlink(proc / str(pid) / "fd" / fd))
                    if inode is not None:
                        held.setdefault(inode, set()).add(pid)
    return held


def _all_pids(proc: Path) -> list[int]:
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def _uids(pids: Iterable[int], proc: Path) -> set[int]:
    """Every uid (real, effective, saved, filesystem) of the processes: world-readable in /proc/PID/status."""
    uids: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in (proc / str(pid) / "status").read_text(errors="replace").splitlines():
                if line.startswith("Uid:"):
                    uids.update(int(u) for u in line.split()[1:])
    return uids


def listening(port: int, *, proc: Path = PROC) -> bool:
    """Whether anything listens where a connection to 127.0.0.1:``port`` goes (cheap: no descriptor scan)."""
    return bool(_sockets(port, proc))


def listeners(port: int, *, proc: Path = PROC) -> list[Listener]:
    """Every socket listening on ``port`` that a connection to 127.0.0.1 reaches, with its holders."""
    found = _sockets(port, proc)
    if not found:
        return []
    held = _holders({s.inode for s in found}, _all_pids(proc), proc)
    return [Listener(s.address, s.port, s.inode, s.uid, tuple(sorted(held.get(s.inode, ())))) for s in found]


def foreign_listener(port: int, pids: Collection[int], *, proc: Path = PROC) -> Listener | None:
    """The first socket answering 127.0.0.1:``port`` that none of ``pids`` holds (its holders named
    where this runner can see them); None when every such socket is theirs, or none listens.

    A socket no visible process holds is theirs when its uid is one of theirs: a non-root runner
    cannot read a root container's descriptors, and another user's squatter has her own uid.
    """
    found = _sockets(port, proc)
    if not found:
        return None
    ours = _holders({s.inode for s in found}, pids, proc)
    strangers = [s for s in found if s.inode not in ours]
    if not strangers:
        return None
    others = _holders({s.inode for s in strangers}, (p for p in _all_pids(proc) if p not in pids), proc)
    uids = _uids(pids, proc)
    for s in strangers:
        holders = tuple(sorted(others.get(s.inode, ())))
        if holders or s.uid not in uids:
            return Listener(s.address, s.port, s.inode, s.uid, holders)
    return None


def descendants(root: int, *, proc: Path = PROC) -> set[int]:
    """``root`` and every process below it (by parent pid, read from /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for pid in _all_pids(proc):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((proc / str(pid) / "stat").read_text(errors="replace").rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found
