"""A gateway hop is ready when IT answers on the port the run chose, not when anything does.

The run picks a free port, closes it, and the gateway binds it a moment later (after its own
configuration check): another process can take the port meanwhile (a second run, a test worker).
Something else answering there must not pass for the gateway, or the load would go through a
stranger's server while the report names the gateway."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from chaos.hops import process
from chaos.hops.gateways.base import Gateway
from chaos.model.errors import SetupFailed
from chaos.model.params import Schema

pytestmark = pytest.mark.timeout(60)


class _Silent(Gateway):
    """A gateway that starts and never listens (it lost the race for its port, say)."""

    kind = "silent"
    binaries = ("sleep",)
    install_hint = "coreutils"
    options = Schema(())
    config_name = "silent.conf"
    startup_timeout_s = 1.5

    def version(self, binary: str) -> str:
        return "1"

    def render(self, listen_port: int, upstream_root: str, workdir: Path, options: Mapping[str, Any]) -> str:
        return f"# listen 127.0.0.1:{listen_port}\n"

    def check(self, binary: str, config_path: Path, workdir: Path) -> str | None:
        return None

    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        return [binary, "30"]


class _Answering(_Silent):
    """The same, but it does listen where the run said: the disarmed form, which must start."""

    kind = "answering"
    binaries = ("python3",)

    def command(self, binary: str, config_path: Path, workdir: Path, port: int) -> list[str]:
        serve = ("import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                 f"s.bind(('127.0.0.1', {port})); s.listen()\n"
                 "while True:\n    c, _ = s.accept(); c.recv(64); c.sendall(b'HTTP/1.1 400 Bad Request\\r\\n\\r\\n')"
                 "; c.close()\n")
        return [binary, "-c", serve]


@pytest.fixture
def stranger() -> Iterator[int]:
    """Another process's HTTP server on a loopback port: it answers every connection with a 400."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        server.close()


def test_a_stranger_on_the_chosen_port_is_not_taken_for_the_gateway(stranger: int, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process, "_free_port", lambda: stranger)  # the race lost: someone took the port
    records: list[dict[str, Any]] = []
    with pytest.raises(SetupFailed) as caught:
        asyncio.run(process.start_gateway("edge", _Silent, "http://127.0.0.1:9", tmp_path, record=records.append))
    message = str(caught.value)
    assert f"127.0.0.1:{stranger}" in message and "not the gateway" in message, message
    assert [r["action"] for r in records] == ["plan", "release"]  # it was started, then stopped


def test_the_gateway_answering_on_its_own_port_starts(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = []

    async def start_and_stop() -> str:
        info, started = await process.start_gateway("edge", _Answering, "http://127.0.0.1:9", tmp_path,
                                                     record=records.append)
        await started.stop()
        return info.listen

    listen = asyncio.run(start_and_stop())
    assert listen.startswith("127.0.0.1:")
    assert [r["action"] for r in records] == ["plan", "release"]
