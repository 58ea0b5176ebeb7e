"""Who listens on a port (chaos.host.listeners), with real sockets in real child processes: the
docker target on the host's network sends nothing to a port another process answers (issue 41)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.host.listeners import descendants, foreign_listener, listeners, listening

pytestmark = pytest.mark.timeout(30)

# A child that listens on HOST:0 (or forks a grandchild that does, with "fork"), prints the port and
# the listening pid, and lives until its stdin closes.
LISTENER = """
import os, socket, sys
host, fork = sys.argv[1], len(sys.argv) > 2
family = socket.AF_INET6 if ":" in host else socket.AF_INET
if fork:
    r, w = os.pipe()
    if os.fork():
        os.close(w); print(os.read(r, 100).decode(), flush=True); sys.stdin.read(); sys.exit(0)
    s = socket.socket(family); s.bind((host, 0)); s.listen()
    os.write(w, f"{s.getsockname()[1]} {os.getpid()}".encode()); sys.stdin.read(); os._exit(0)
s = socket.socket(family); s.bind((host, 0)); s.listen()
print(s.getsockname()[1], os.getpid(), flush=True); sys.stdin.read()
"""


class Child:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LISTENER, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        port, pid = self.proc.stdout.readline().split()
        self.port, self.listener_pid, self.pid = int(port), int(pid), self.proc.pid

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


@pytest.fixture
def child() -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def start(*args: str) -> Child:
        started.append(Child(*args))
        return started[-1]

    yield start
    for one in started:
        one.close()


def test_a_squatter_on_the_port_is_named_not_taken_for_the_container(child: Callable[..., Child]) -> None:
    squatter = child("127.0.0.1")
    container = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        found = foreign_listener(squatter.port, {container.pid})
        assert found is not None and found.pids == (squatter.pid,) and found.address == "127.0.0.1"
        assert f"pid {squatter.pid} (python" in found.describe() and f"127.0.0.1:{squatter.port}" in found.describe()
        assert foreign_listener(squatter.port, {squatter.pid}) is None  # its own holder: the container's
        [seen] = listeners(squatter.port)
        assert seen.pids == (squatter.pid,) and listening(squatter.port)
    finally:
        assert container.stdin is not None
        container.stdin.close()
        container.wait(timeout=10)


def test_a_wildcard_listener_below_the_container_root_is_the_containers(child: Callable[..., Child]) -> None:
    tree = child("0.0.0.0", "fork")  # the root's child listens, as a server under an init process does
    assert tree.listener_pid != tree.pid and tree.listener_pid in descendants(tree.pid)
    assert foreign_listener(tree.port, descendants(tree.pid)) is None
    stranger = foreign_listener(tree.port, {tree.pid})  # the root alone does not hold it
    assert stranger is not None and stranger.pids == (tree.listener_pid,) and stranger.address == "0.0.0.0"


def test_only_sockets_a_connection_to_127_0_0_1_reaches_count(child: Callable[..., Child]) -> None:
    aside = child("127.0.0.2")  # another loopback address: a connection to 127.0.0.1 never gets there
    assert not listening(aside.port) and listeners(aside.port) == []
    assert foreign_listener(aside.port, set()) is None
    if not socket.has_ipv6:
        return
    try:
        dual = child("::")  # dual-stack: it answers 127.0.0.1 too
    except ValueError:  # no IPv6 on this host: the child could not bind
        return
    [seen] = listeners(dual.port)
    assert seen.address == "::" and seen.pids == (dual.pid,)


def _fake_proc(tmp_path: Path, socket_uid: int, container_uid: int) -> Path:
    """A /proc where the socket on port 8000 (0x1F40) has no holder we can read: a non-root runner and
    a root container."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = f"   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000 {socket_uid:5d} 0 4242\n"
    (proc / "net" / "tcp").write_text(header + row)
    (proc / "77").mkdir()
    (proc / "77" / "status").write_text(f"Name:\tserver\nUid:\t{container_uid}\t{container_uid}\t{container_uid}"
                                        f"\t{container_uid}\n")
    (proc / "77" / "stat").write_text("77 (server) S 1 77 77 0 -1\n")
    return proc


def test_a_socket_no_visible_process_holds_is_judged_by_its_uid(tmp_path: Path) -> None:
    ours = _fake_proc(tmp_path / "a", socket_uid=0, container_uid=0)
    assert listening(8000, proc=ours) and foreign_listener(8000, {77}, proc=ours) is None
    theirs = _fake_proc(tmp_path / "b", socket_uid=1001, container_uid=0)  # another user's squatter
    found = foreign_listener(8000, {77}, proc=theirs)
    assert found is not None and found.uid == 1001 and found.pids == ()
    assert found.describe(theirs) == "a process of uid 1001 this runner cannot see listening on 127.0.0.1:8000"
