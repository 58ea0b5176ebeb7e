"""Carrying the load to a Kubernetes target's ready pods: a loopback listener, one pod per connection.

``Relay`` listens on ``127.0.0.1:0``; each connection the load generator opens is carried to the
next serving pod (round robin over the pods ``PodWatch`` reports Ready and not terminating), which
is what a Service does: a keep-alive connection stays with its pod, a pod that is deleted cuts the
connections it holds, and new connections go to the pods that are left. How a connection reaches a
pod is the access mode's ``Dial``:

- ``endpoints``: a TCP connection to the pod's IP and port (inside the cluster, where pod IPs route);
- ``port-forward``: a WebSocket through the API server (``pods/portforward``, v4.channel.k8s.io: each
  binary frame starts with a channel byte, 0 data and 1 errors; each channel's first frame carries
  the port), as ``kubectl port-forward`` does, for a runner outside the cluster.

``pod_url(pod)`` gives a URL that reaches one pod (its IP, or a listener pinned to it), for scraping
each pod's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from chaos.k8s.client import KubeApi
from chaos.k8s.pods import container_port
from chaos.k8s.watch import PodWatch

__all__ = ["DirectDial", "Dial", "ForwardDial", "Relay", "Upstream"]

log = logging.getLogger("chaos.k8s.relay")
CHUNK = 65536


class Upstream(Protocol):
    """One connection to a pod, however it travels."""

    async def read(self) -> bytes: ...  # b"" at the end

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


Dial = Callable[[dict[str, Any], int], Awaitable[Upstream]]


class _Tcp:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def read(self) -> bytes:
        return await self.reader.read(CHUNK)

    async def write(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()


class DirectDial:
    """A TCP connection to the pod's IP (inside the cluster)."""

    async def __call__(self, pod: dict[str, Any], port: int) -> Upstream:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            raise OSError(f"pod {pod['metadata']['name']} has no IP yet")
        async with asyncio.timeout(10.0):
            reader, writer = await asyncio.open_connection(ip, port)
        return _Tcp(reader, writer)

    def url(self, pod: dict[str, Any], port: int) -> str:
        ip = (pod.get("status") or {}).get("podIP") or ""
        host = f"[{ip}]" if ":" in ip else ip
        return f"http://{host}:{port}"


class _Forwarded:
    """The v4.channel.k8s.io framing over one port-forward WebSocket."""

    def __init__(self, ws: Any, pod: str, port: int) -> None:
        self.ws, self.pod, self.port = ws, pod, port
        self.headers_seen = {0: False, 1: False}
        self.error = ""

    async def read(self) -> bytes:
        import aiohttp

        while True:
            msg = await self.ws.receive()
            if msg.type != aiohttp.WSMsgType.BINARY:
                return b""  # closed, or an error: the end of this connection
            data: bytes = msg.data
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel in self.headers_seen and not self.headers_seen[channel]:
                self.headers_seen[channel] = True  # the first frame of each channel is the port number
                continue
            if channel == 0:
                if payload:
                    return bytes(payload)
            elif channel == 1 and payload:
                self.error += payload.decode("utf-8", "replace")
                log.warning("port-forward to %s:%d: %s", self.pod, self.port, self.error)
                return b""

    async def write(self, data: bytes) -> None:
        await self.ws.send_bytes(b"\x00" + data)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()


class ForwardDial:
    """A port-forward through the API server (from outside the cluster)."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api, self.namespace = api, namespace

    async def __call__(self, pod: dict[str, Any], port: int) -> Upstream:
        name = pod["metadata"]["name"]
        ws = await self.api.port_forward(self.namespace, name, port)
        return _Forwarded(ws, name, port)


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, upstream: Upstream) -> None:
    """Bytes both ways until either side ends; then both are closed (a cut pod cuts its client)."""

    async def outbound() -> None:
        while data := await reader.read(CHUNK):
            await upstream.write(data)

    async def inbound() -> None:
        while data := await upstream.read():
            writer.write(data)
            await writer.drain()

    tasks = [asyncio.ensure_future(outbound()), asyncio.ensure_future(inbound())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


class Relay:
    """A loopback address whose connections go to the target's serving pods, round robin."""

    def __init__(self, watch: PodWatch, port: int | str, dial: Dial,
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        self.watch = watch
        self.port = port  # the pods' port: a number, or a container port's name
        self.dial = dial
        self.on_error = on_error  # (pod, why) for each failed dial
        self.last_error: BaseException | None = None
        self.opened = 0
        self.refused = 0  # connections with no serving pod to go to
        self.per_pod: dict[str, int] = {}
        self._turn = itertools.count()
        self._server: asyncio.Server | None = None
        self._pinned: dict[str, asyncio.Server] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        """Listen; return ``http://127.0.0.1:PORT``."""
        self._server = await asyncio.start_server(self._balanced, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def pod_port(self, pod: dict[str, Any]) -> int | None:
        return container_port(pod, self.port)

    async def pod_url(self, pod: dict[str, Any]) -> str | None:
        """A URL that reaches this pod only (None when it has no such port)."""
        port = self.pod_port(pod)
        if port is None:
            return None
        if isinstance(self.dial, DirectDial):
            return self.dial.url(pod, port)
        uid = pod["metadata"]["uid"]
        for gone in [u for u in self._pinned if u not in self.watch.pods]:
            self._pinned.pop(gone).close()
        if uid not in self._pinned:
            async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await self._handled(self._pinned_to(reader, writer, pod))

            self._pinned[uid] = await asyncio.start_server(connected, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._pinned[uid].sockets[0].getsockname()[1]}"

    async def close(self) -> None:
        servers = [s for s in (self._server, *self._pinned.values()) if s is not None]
        for server in servers:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pinned.clear()

    # -- connections -------------------------------------------------------------------------------------
    async def _handled(self, work: Awaitable[None]) -> None:
        """Run one connection in its own (asyncio's) handler task, tracked so ``close`` can end it; a
        handler must not end cancelled (asyncio's stream callback would log it as an error)."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await work
        except asyncio.CancelledError:
            pass  # the relay is closing: the connection ends with it
        finally:
            self._tasks.discard(task)

    async def _balanced(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._handled(self._carry(reader, writer))

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        candidates = self.watch.serving()
        upstream = None
        # try the next pod in turn; a pod that just died (the watch has not said so yet) gets one successor
        for _ in range(min(2, len(candidates))):
            pod = candidates[next(self._turn) % len(candidates)]
            port = self.pod_port(pod)
            if port is None:
                continue
            try:
                upstream = await self.dial(pod, port)
            except Exception as exc:  # noqa: BLE001 - the next pod, or a refused connection
                log.info("cannot reach pod %s: %s", pod["metadata"]["name"], exc)
                self.last_error = exc
                if self.on_error is not None:
                    self.on_error(pod["metadata"]["name"], exc)
                continue
            name = pod["metadata"]["name"]
            self.per_pod[name] = self.per_pod.get(name, 0) + 1
            break
        if upstream is None:  # no endpoint: refuse, as a Service without ready pods does
            self.refused += 1
            writer.close()
            return
        self.opened += 1
        await _splice(reader, writer, upstream)

    async def _pinned_to(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pod: dict[str, Any]) -> None:
        port = self.pod_port(pod)
        try:
            assert port is not None
            upstream = await self.dial(pod, port)
        except Exception:  # noqa: BLE001 - the scrape of a pod that went away fails, and says so
            writer.close()
            return
        await _splice(reader, writer, upstream)
