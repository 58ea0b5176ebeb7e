"""Putting Toxiproxy between the load generator and the target, and finding which Toxiproxy to use.

Resolution order (the chosen one and why goes into the report): the experiment's ``proxy.url`` or
``TOXIPROXY_URL``; a ``toxiproxy-server`` binary on PATH (or ``TOXIPROXY_SERVER_BIN``), started on a
free loopback port; a container through the Docker SDK when a daemon answers; the embedded,
API-compatible server of this project, started as a child process. ``proxy.server`` can force one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from chaos.children import first_line, spawn
from chaos.context import ProxyInfo, TargetInfo
from chaos.errors import FaultError, SetupFailed
from faults.toxiproxy_client import ToxiproxyAPI

if TYPE_CHECKING:
    from chaos.experiment.model import Experiment

__all__ = ["ProxyHandle", "resolve_server", "running_proxy", "start_proxy"]

EMBEDDED_READY = "toxiproxy listening on "
EMBEDDED_START_TIMEOUT_S = 15.0
DOCKER_IMAGE = "ghcr.io/shopify/toxiproxy:2.12.0"


@dataclass
class ToxiproxyServer:
    """A Toxiproxy API we talk to, and how to stop it if we started it."""

    url: str
    kind: str  # external | binary | docker | embedded
    why: str
    process: subprocess.Popen[str] | None = None
    container: Any = None
    notes: list[str] = field(default_factory=list)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.container is not None:
            try:
                self.container.stop(timeout=2)
                self.container.remove(force=True)
            except Exception:  # noqa: BLE001 - the daemon may be gone; nothing else to do
                pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(url: str, timeout: float = 2.0) -> bool:
    return ToxiproxyAPI(url).answers(timeout)


def _wait_for(url: str, process: subprocess.Popen[str] | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise SetupFailed(f"the Toxiproxy server exited with status {process.returncode} before it answered")
        if _answers(url, timeout=0.5):
            return
        time.sleep(0.05)
    raise SetupFailed(f"the Toxiproxy server at {url} did not answer within {timeout:g}s")


def _start_binary(binary: str) -> ToxiproxyServer:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = spawn([binary, "-host", "127.0.0.1", "-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    server = ToxiproxyServer(url, "binary", f"toxiproxy-server binary {binary}", process=process)
    try:
        _wait_for(url, process, 10.0)
    except SetupFailed:
        server.stop()  # never leave a half-started server behind
        raise
    return server


def _start_docker() -> ToxiproxyServer | None:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        client.ping()
    except Exception:  # noqa: BLE001 - no SDK, no daemon, no permission: try the next option
        return None
    port = _free_port()
    try:
        container = client.containers.run(
            DOCKER_IMAGE, ["-host=127.0.0.1", f"-port={port}"], detach=True, network_mode="host", remove=False,
            labels={"streamchaos": "toxiproxy"},
        )
    except Exception:  # noqa: BLE001 - no image and no registry, a daemon refusing: the next option
        return None
    url = f"http://127.0.0.1:{port}"
    server = ToxiproxyServer(url, "docker", f"container {DOCKER_IMAGE} through the Docker SDK", container=container)
    try:
        _wait_for(url, None, 20.0)
    except SetupFailed:
        server.stop()
        raise
    return server


def _start_embedded(seed: int, log: Path) -> ToxiproxyServer:
    with open(log, "ab") as err:
        process = spawn(
            [sys.executable, "-m", "faults.toxiproxy_server", "--host", "127.0.0.1", "--port", "0", "--seed", str(seed)],
            stdout=subprocess.PIPE, stderr=err,
        )
    line = first_line(process, EMBEDDED_START_TIMEOUT_S)
    if line.startswith(EMBEDDED_READY):
        url = line[len(EMBEDDED_READY):].strip()
        return ToxiproxyServer(url, "embedded", "no external Toxiproxy, binary or Docker daemon: the embedded server", process=process)
    process.kill()
    process.wait(timeout=5)
    raise SetupFailed(f"the embedded Toxiproxy server did not start within {EMBEDDED_START_TIMEOUT_S:g}s; see {log}")


def resolve_server(choice: str, url: str | None, seed: int, log: Path) -> ToxiproxyServer:
    """The Toxiproxy server to use, per the resolution order (``choice`` may force one)."""
    url = url or os.environ.get("TOXIPROXY_URL")
    if choice in ("auto", "external") and url:
        if not _answers(url):
            raise SetupFailed(f"Toxiproxy at {url} (proxy.url or TOXIPROXY_URL) does not answer GET /version")
        return ToxiproxyServer(url.rstrip("/"), "external", f"given address {url}")
    if choice == "external":
        raise SetupFailed("proxy.server is external but no proxy.url or TOXIPROXY_URL is set")
    if choice in ("auto", "binary"):
        binary = os.environ.get("TOXIPROXY_SERVER_BIN") or shutil.which("toxiproxy-server")
        if binary:
            return _start_binary(binary)
        if choice == "binary":
            raise SetupFailed("proxy.server is binary but no toxiproxy-server is on PATH (or TOXIPROXY_SERVER_BIN)")
    if choice in ("auto", "docker"):
        server = _start_docker()
        if server is not None:
            return server
        if choice == "docker":
            raise SetupFailed("proxy.server is docker but no Docker daemon answers")
    return _start_embedded(seed, log)


@dataclass
class ProxyHandle:
    server: ToxiproxyServer
    info: ProxyInfo
    client_base_url: str  # what the load generator uses instead of the target's URL

    def facts(self) -> dict[str, Any]:
        return {"server": self.server.kind, "why": self.server.why, "api_url": self.server.url, "listen": self.info.listen,
                "upstream": self.info.upstream, "proxy": self.info.proxy_name}

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        ToxiproxyAPI(self.server.url).delete_proxy_sync(self.info.proxy_name)
        self.server.stop()


@contextlib.asynccontextmanager
async def running_proxy(experiment: Experiment, target: TargetInfo, run_dir: Path) -> AsyncIterator[ProxyHandle]:
    """The proxy between load and target while entered; deleted (and its server stopped) on exit."""
    handle = await start_proxy(experiment, target, run_dir)
    try:
        yield handle
    finally:
        with contextlib.suppress(Exception):  # a server already gone has nothing left to stop
            await handle.stop()


async def start_proxy(experiment: Experiment, target: TargetInfo, run_dir: Path) -> ProxyHandle:
    """Start (or find) Toxiproxy and route the target's traffic through a proxy on it."""
    spec = experiment.proxy
    # resolved in the loop's thread: a server we spawn must die with us (chaos.children)
    server = resolve_server(spec.server, spec.url, experiment.seed, run_dir / "toxiproxy.log")
    parts = urlsplit(target.base_url)
    upstream = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    try:
        listen = await asyncio.to_thread(ToxiproxyAPI(server.url).create_proxy_sync, spec.name, upstream, spec.listen)
    except FaultError as exc:
        server.stop()
        raise SetupFailed(str(exc)) from exc
    except BaseException:
        server.stop()
        raise
    host, _, port = listen.rpartition(":")
    if host in ("[::]", "0.0.0.0", ""):
        # listening on every interface (Toxiproxy in its own pod or host): reach it where its API is
        host = urlsplit(server.url).hostname or "127.0.0.1"
    client_base = f"{parts.scheme}://{host}:{port}{parts.path}"
    info = ProxyInfo(api_url=server.url, proxy_name=spec.name, listen=f"{host}:{port}", upstream=upstream, server=server.kind,
                     supports_buffer=server.kind == "embedded")
    return ProxyHandle(server=server, info=info, client_base_url=client_base)
