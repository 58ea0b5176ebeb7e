"""Putting Toxiproxy between the load generator and the target, and finding which Toxiproxy to use.

Which one (the chosen one and why goes into the report): ``proxy.server: auto`` takes the Toxiproxy
the user names (``proxy.url`` or ``TOXIPROXY_URL``, her own choice), else the embedded,
API-compatible server of this project, started as a child process and guarded by the run's token.
A ``toxiproxy-server`` binary (PATH or ``TOXIPROXY_SERVER_BIN``, on a free loopback port) or a
container through the Docker SDK only when ``proxy.server`` names it (``binary``, ``docker``): their
API takes orders from every local user, which the run notes (``UNGUARDED``).

The embedded server the runner starts answers only the run's token (``chaos.toxiproxy.server.guard``:
random per run, passed in its environment) and keeps its proxy's upstream as created. Any other
Toxiproxy (external, binary, container) takes orders from whoever reaches its API; for every kind,
``watching_proxy`` reads the run's proxy each ``WATCH_EVERY_S`` and halts the run when its upstream,
listen, enabled flag or toxics differ from what the run itself set (the ledger of ``chaos.toxiproxy.client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from chaos.host.children import first_line, spawn
from chaos.host.redact import register_secret
from chaos.host.runfiles import open_append
from chaos.model.context import ProxyInfo, TargetInfo
from chaos.model.errors import FaultError, SetupFailed
from chaos.model.observations import Note
from chaos.toxiproxy.client import ProxyLedger, ToxiproxyAPI, drop_ledger, keep_ledger, ledger_of
from chaos.toxiproxy.server.guard import TOKEN_ENV

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["ProxyHandle", "RunOwner", "resolve_server", "running_proxy", "start_proxy", "watching_proxy"]

EMBEDDED_READY = "toxiproxy listening on "
EMBEDDED_START_TIMEOUT_S = 15.0
DOCKER_IMAGE = "ghcr.io/shopify/toxiproxy:2.12.0"
AUTO_WHY = "no proxy.url or TOXIPROXY_URL: the embedded server, whose API answers only this run"
UNGUARDED = ("UNGUARDED: its API takes orders from any local user, who can point the run's proxy at her relay and "
             "read the target's key off the load; the run reads its proxy back every second and halts on a change it "
             "did not make, but one undone in between goes unseen (SECURITY.md, \"The run's Toxiproxy\"; "
             "server: auto runs the embedded, guarded one)")
WATCH_EVERY_S = 1.0  # how often the run reads its proxy back (a change behind its back halts it)


@dataclass
class ToxiproxyServer:
    """A Toxiproxy API we talk to, and how to stop it if we started it."""

    url: str
    kind: str  # external | binary | docker | embedded
    why: str
    process: subprocess.Popen[str] | None = None
    container: Any = None
    notes: list[str] = field(default_factory=list)
    owner: RunOwner | None = None  # a container of the run: its removal is journaled
    token: str | None = field(default=None, repr=False)  # an embedded server's run token: never printed

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.container is not None:
            container, self.container = self.container, None
            try:
                container.stop(timeout=2)
                container.remove(force=True)
                removed: dict[str, Any] = {"removed": container.id}
            except Exception as exc:  # noqa: BLE001 - the daemon may be gone: rollback finds it by its labels
                removed = {"not_removed": container.id, "why": str(exc)}
            if self.owner is not None:
                self.owner.record({"name": "toxiproxy", "kind": "docker.container", "action": "release",
                                   "evidence": removed})


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
    # its own session, as the builtin stack's: a Ctrl-C in the terminal reaches the whole foreground group,
    # and a proxy that died of it first could not take its toxics off when the runner reverts them
    process = spawn([binary, "-host", "127.0.0.1", "-port", str(port)], stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    server = ToxiproxyServer(url, "binary", f"toxiproxy-server binary {binary}", process=process)
    try:
        _wait_for(url, process, 10.0)
    except SetupFailed:
        server.stop()  # never leave a half-started server behind
        raise
    return server


@dataclass(frozen=True)
class RunOwner:
    """Whose run a Toxiproxy container belongs to: its labels, and the journal that records it."""

    run_id: str
    run_dir: Path
    record: Callable[[dict[str, Any]], None]


def _start_docker(owner: RunOwner | None) -> tuple[ToxiproxyServer | None, str]:
    """Toxiproxy's own image in a container, or (None, why not). Only an image already on the daemon:
    streamchaos never pulls (``containers.create``, not ``run``, which pulls what is missing). The
    container carries the run's labels and is journaled before it exists, so ``streamchaos
    rollback`` and the watchdog remove it when the runner is killed; ``stop`` removes it otherwise."""
    from chaos.docker.containers import docker_client

    try:
        client = docker_client(SetupFailed, "a Toxiproxy container")
    except SetupFailed as exc:  # no SDK, no daemon, no permission: try the next option
        return None, str(exc)
    server, why_not = _toxiproxy_container(client, owner)
    if server is None:
        client.close()  # a running container keeps its client for stop(); nothing else holds this one
    return server, why_not


def _toxiproxy_container(client: Any, owner: RunOwner | None) -> tuple[ToxiproxyServer | None, str]:
    from docker.errors import ImageNotFound

    try:
        client.images.get(DOCKER_IMAGE)
    except ImageNotFound:
        return None, (f"image {DOCKER_IMAGE} is not on the Docker daemon, and streamchaos never pulls "
                      f"(`docker pull {DOCKER_IMAGE}` to use it)")
    except Exception as exc:  # noqa: BLE001 - a daemon that fails the lookup: the next option
        return None, f"the Docker daemon could not look up {DOCKER_IMAGE}: {exc}"
    port = _free_port()
    labels: dict[str, str] = {"streamchaos": "toxiproxy"}
    name = f"streamchaos-toxiproxy-{port}"
    if owner is not None:
        from chaos.docker.containers import run_labels

        labels.update(run_labels(owner.run_id, owner.run_dir, "toxiproxy"))
        name = f"streamchaos-{owner.run_id}-toxiproxy"
        owner.record({"name": "toxiproxy", "kind": "docker.container", "action": "plan",
                      "undo": {"container_name": name, "image": DOCKER_IMAGE, "labels": labels}})
    try:
        container = client.containers.create(
            DOCKER_IMAGE, ["-host=127.0.0.1", f"-port={port}"], name=name, detach=True, network_mode="host",
            labels=labels, security_opt=["no-new-privileges"], cap_drop=["ALL"], read_only=True,
        )
    except Exception as exc:  # noqa: BLE001 - a daemon refusing: the next option
        return None, f"the Docker daemon refused to create the Toxiproxy container: {exc}"
    server = ToxiproxyServer(f"http://127.0.0.1:{port}", "docker", f"container {DOCKER_IMAGE} through the Docker SDK",
                             container=container, owner=owner)
    if owner is not None:
        owner.record({"name": "toxiproxy", "kind": "docker.container", "action": "plan",
                      "undo": {"container_id": container.id}})
    try:
        container.start()
        _wait_for(server.url, None, 20.0)
    except Exception as exc:  # noqa: BLE001 - a container that does not start or answer: the next option
        server.stop()  # removed and its release recorded: nothing half-started stays behind
        return None, f"the Toxiproxy container did not start and answer ({exc}); it was removed"
    return server, ""


def embedded_command(seed: int, listen: str) -> list[str]:
    """The embedded server's command line: loopback API, and proxies only on loopback, unprivileged
    ports, or the one ``listen`` the experiment asked for (``proxy.listen``)."""
    return [sys.executable, "-m", "chaos.toxiproxy.server", "--host", "127.0.0.1", "--port", "0", "--seed", str(seed),
            "--loopback-only", "--allow-listen", listen, "--exit-with-parent", str(os.getpid())]


def _start_embedded(seed: int, log: Path, listen: str) -> ToxiproxyServer:
    # the run's token: its API answers no one else (every local user reaches a loopback port); through
    # the environment, never argv, which every user can read in /proc
    token = secrets.token_urlsafe(32)
    register_secret(token)
    with open_append(log) as err:  # 0600, never through a link planted in the run directory
        # its own session (see _start_binary): the revert that follows a Ctrl-C still finds it
        process = spawn(embedded_command(seed, listen), stdout=subprocess.PIPE, stderr=err, start_new_session=True,
                        env={**os.environ, TOKEN_ENV: token})
    line = first_line(process, EMBEDDED_START_TIMEOUT_S)
    if line.startswith(EMBEDDED_READY):
        url = line[len(EMBEDDED_READY):].strip()
        return ToxiproxyServer(url, "embedded", "the embedded server, whose API answers only this run",
                               process=process, token=token)
    process.kill()
    process.wait(timeout=5)
    raise SetupFailed(f"the embedded Toxiproxy server did not start within {EMBEDDED_START_TIMEOUT_S:g}s; see {log}")


def resolve_server(choice: str, url: str | None, seed: int, log: Path, listen: str = "127.0.0.1:0",
                   owner: RunOwner | None = None) -> ToxiproxyServer:
    """The Toxiproxy server to use: ``auto`` is the one the user names, else the embedded server (the one
    whose API answers only the run); ``choice`` may force one."""
    url = url or os.environ.get("TOXIPROXY_URL")
    if choice in ("auto", "external") and url:
        if not _answers(url):
            raise SetupFailed(f"Toxiproxy at {url} (proxy.url or TOXIPROXY_URL) does not answer GET /version")
        return ToxiproxyServer(url.rstrip("/"), "external", f"given address {url}")
    if choice == "external":
        raise SetupFailed("proxy.server is external but no proxy.url or TOXIPROXY_URL is set")
    if choice == "binary":
        binary = os.environ.get("TOXIPROXY_SERVER_BIN") or shutil.which("toxiproxy-server")
        if not binary:
            raise SetupFailed("proxy.server is binary but no toxiproxy-server is on PATH (or TOXIPROXY_SERVER_BIN)")
        return _unguarded(_start_binary(binary))
    if choice == "docker":
        server, why_not = _start_docker(owner)
        if server is None:
            raise SetupFailed(f"proxy.server is docker, but {why_not}")
        return _unguarded(server)
    # never a binary or a container unasked: a Toxiproxy the runner starts takes orders only from the runner
    embedded = _start_embedded(seed, log, listen)
    if choice == "auto":
        embedded.why = AUTO_WHY
    return embedded


def _unguarded(server: ToxiproxyServer) -> ToxiproxyServer:
    """A binary or a container the run was told to start: said in its notes that anyone may reconfigure it."""
    server.notes.append(UNGUARDED)
    return server


@dataclass
class ProxyHandle:
    server: ToxiproxyServer
    info: ProxyInfo
    client_base_url: str  # what the load generator uses instead of the target's URL

    def facts(self) -> dict[str, Any]:
        facts: dict[str, Any] = {"server": self.server.kind, "why": self.server.why, "api_url": self.server.url,
                                 "listen": self.info.listen, "upstream": self.info.upstream,
                                 "proxy": self.info.proxy_name}
        if self.server.notes:
            facts["notes"] = list(self.server.notes)
        return facts

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        drop_ledger(self.server.url, self.info.proxy_name)  # deleting it is the run's own last change
        ToxiproxyAPI(self.server.url, self.server.token).delete_proxy_sync(self.info.proxy_name)
        self.server.stop()


@contextlib.asynccontextmanager
async def running_proxy(experiment: Experiment, target: TargetInfo, run_dir: Path,
                        owner: RunOwner | None = None) -> AsyncIterator[ProxyHandle]:
    """The proxy between load and target while entered; deleted (and its server stopped) on exit."""
    handle = await start_proxy(experiment, target, run_dir, owner)
    try:
        yield handle
    finally:
        with contextlib.suppress(Exception):  # a server already gone has nothing left to stop
            await handle.stop()


async def start_proxy(experiment: Experiment, target: TargetInfo, run_dir: Path,
                      owner: RunOwner | None = None) -> ProxyHandle:
    """Start (or find) Toxiproxy and route the target's traffic through a proxy on it; ``owner``: the
    run a Toxiproxy container is labelled with and journaled in."""
    spec = experiment.proxy
    # resolved in the loop's thread: a server we spawn must die with us (chaos.host.children)
    server = resolve_server(spec.server, spec.url, experiment.seed, run_dir / "toxiproxy.log", spec.listen, owner)
    parts = urlsplit(target.base_url)
    upstream = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    api = ToxiproxyAPI(server.url, server.token)
    try:
        listen = await asyncio.to_thread(api.create_proxy_sync, spec.name, upstream, spec.listen)
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
    info = ProxyInfo(api_url=server.url, proxy_name=spec.name, listen=f"{host}:{port}", upstream=upstream,
                     server=server.kind,
                     supports_buffer=server.kind == "embedded", token=server.token)
    keep_ledger(server.url, spec.name, ProxyLedger(upstream=upstream, listen=listen))  # what the run set
    return ProxyHandle(server=server, info=info, client_base_url=client_base)


@contextlib.asynccontextmanager
async def watching_proxy(info: ProxyInfo, halt: Callable[[str], object],
                         emit: Callable[[Any], None]) -> AsyncIterator[None]:
    """While entered, the run's proxy is read back every ``WATCH_EVERY_S``: on a change the run did not
    make, a ``halt`` note with the differences and ``halt`` (the runner reverts its faults and ends
    ``halted``, exit 4). On exit, a ``proxy_watch`` note says how many reads it made and how many the
    server did not answer."""
    counts = {"reads": 0, "unanswered": 0}
    task = asyncio.create_task(_watch(info, halt, emit, counts), name="proxy-watch")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        emit(Note(topic="proxy_watch", t=time.monotonic_ns(),
                  data={"every_s": WATCH_EVERY_S, **counts, "proxy": info.proxy_name, "api_url": info.api_url}))


async def _changes(api: ToxiproxyAPI, info: ProxyInfo, ledger: ProxyLedger) -> list[str]:
    """What differs between the proxy as the server lists it now and the run's ``ledger``, one line each;
    empty when nothing does, or when the run changed its own proxy meanwhile (that listing may predate it)."""
    generation = ledger.generation
    seen = await api.listing(info.proxy_name)
    if ledger.generation != generation or ledger_of(info.api_url, info.proxy_name) is not ledger:
        return []
    return ledger.differences(seen)


async def _watch(info: ProxyInfo, halt: Callable[[str], object], emit: Callable[[Any], None],
                 counts: dict[str, int]) -> None:
    api = ToxiproxyAPI(info.api_url, info.token)
    while True:
        await asyncio.sleep(WATCH_EVERY_S)
        ledger = ledger_of(info.api_url, info.proxy_name)
        if ledger is None:
            return  # the proxy is being deleted by the run itself
        try:
            changed = await _changes(api, info, ledger)
        except Exception:  # noqa: BLE001 - one read that decides nothing; the next one does
            # FaultError: a server too busy to answer in time; anything else: a listing shaped as no
            # Toxiproxy lists it (an error in one read once ended the watch, and surfaced only at teardown)
            counts["unanswered"] += 1
            continue
        counts["reads"] += 1
        if changed:
            why = (f"the run's Toxiproxy proxy {info.proxy_name!r} at {info.api_url} was changed by someone else: "
                   + "; ".join(changed) + " (whoever reaches a Toxiproxy API can redirect the run: see SECURITY.md)")
            t = time.monotonic_ns()
            if halt(why) is not False:  # the run took it (not one already stopping, or in teardown)
                emit(Note(topic="halt", t=t, data={"reason": why, "top_errors": [], "proxy_changes": changed}))
            return
