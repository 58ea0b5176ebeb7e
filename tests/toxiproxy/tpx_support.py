"""Helpers for the Toxiproxy conformance suite (imported by conftest and the tests)."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


# -- upstream servers ---------------------------------------------------------------------
class Upstreams:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="upstreams")
        self.thread.start()
        self.echo_port = self._run(self._start(self._echo))
        self.ticker_port = self._run(self._start(self._ticker))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _start(self, handler: Any) -> int:
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        return srv.sockets[0].getsockname()[1]

    @staticmethod
    async def _echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        finally:
            w.close()

    @staticmethod
    async def _ticker(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            n_s, iv_s = (await r.readline()).split()
            n, interval = int(n_s), int(iv_s) / 1000.0
            for i in range(n):
                if i:
                    await asyncio.sleep(interval)
                w.write(f"{i} {time.monotonic():.6f}\n".encode())
                await w.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            w.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


# -- servers ------------------------------------------------------------------------------
@dataclass
class Server:
    kind: str  # "embedded" | "real"
    url: str
    client: httpx.Client
    _names: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def embedded(self) -> bool:
        return self.kind == "embedded"

    def name(self, prefix: str = "p") -> str:
        return f"{prefix}{next(self._names)}"

    def create(self, upstream: int | str, listen: str = "127.0.0.1:0", **kw: Any) -> dict[str, Any]:
        """Create a proxy (unique name) and return its JSON; fails the test if not 201."""
        if isinstance(upstream, int):
            upstream = f"127.0.0.1:{upstream}"
        body = {"name": kw.pop("name", None) or self.name(), "upstream": upstream, "listen": listen}
        body.update(kw)
        r = self.client.post("/proxies", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def toxic(
        self,
        proxy: str,
        type_: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        name: str | None = None,
        **attributes: int,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"type": type_, "stream": stream, "toxicity": toxicity, "attributes": attributes}
        if name:
            body["name"] = name
        r = self.client.post(f"/proxies/{proxy}/toxics", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    def cleanup(self) -> None:
        r = self.client.get("/proxies")
        for name in r.json():
            self.client.delete(f"/proxies/{name}")


def port_of(proxy: dict[str, Any]) -> int:
    return int(proxy["listen"].rsplit(":", 1)[1])


# -- socket helpers -------------------------------------------------------------------------
def connect(port: int, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            break
        buf += d
    return buf


def recv_until_eof(s: socket.socket, limit: int = 1 << 24) -> bytes:
    buf = bytearray()
    while len(buf) < limit:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    return bytes(buf)


def readline(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        d = s.recv(1)
        if not d:
            break
        buf += d
    return buf


def closed_within(s: socket.socket, timeout: float) -> str | None:
    """'eof' or 'reset' if the peer closes within ``timeout`` s (reading and dropping data), else None."""
    s.settimeout(timeout)
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if not s.recv(65536):
                return "eof"
    except ConnectionResetError:
        return "reset"
    except TimeoutError:
        return None
    return None


def ticker(port: int, n: int, interval_ms: int, timeout: float = 5.0) -> socket.socket:
    s = connect(port, timeout)
    s.sendall(f"{n} {interval_ms}\n".encode())
    return s
