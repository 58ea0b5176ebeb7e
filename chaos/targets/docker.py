"""`target.kind: docker`: a container started through the Docker SDK, reached where it listens.

With ``image`` the container runs that image (``command``, ``env``, ``volumes``, ``gpus``); without
one it runs the builtin stack from this host's Python (``chaos.targets.host_image``: no registry needed),
shaped by the same keys as a builtin target. By default (``network: bridge``) the container gets a
bridge network of the run's own (labelled like the container, removed with it) and its port is
published on 127.0.0.1 only, so a server that binds 0.0.0.0 inside (vLLM's default) is not on the
host's interfaces; ``network: host`` puts it on the host's network instead. There whoever binds
the port first answers it, so the port must be free before the container starts and the socket
answering it held by the container's own processes before any request (the API key with it) goes
there (``chaos.host.listeners``).

The container is labelled with the run (``chaos.docker.containers.run_labels``) and journaled as a
resource before it is created and again with its id, so ``streamchaos rollback`` (and the watchdog,
should the runner die) can remove it; ``stop`` keeps its logs in the run directory
(``container.log``) and removes it, on every exit path of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from chaos.docker.containers import (
    container_facts,
    docker_client,
    find_container,
    parse_gpus,
    parse_volume,
    remove_container,
    remove_run_containers,
    run_labels,
)
from chaos.host.capped import JSON_LIMIT, Capped, clip, get_capped
from chaos.host.listeners import descendants, foreign_listener, listeners, listening
from chaos.host.redact import register_secret
from chaos.host.tls import tls_context
from chaos.model.context import TargetInfo
from chaos.model.errors import SetupFailed
from chaos.model.params import Param, Schema
from chaos.model.units import format_duration
from chaos.stack.serve import ADMIN_TOKEN_ENV
from chaos.targets.base import (
    COMMON_SECTION,
    Account,
    ResourceRecorder,
    SupportColumn,
    Target,
    TargetStart,
    configured_admin_token,
    require_engine,
    serve_args,
    target_kind,
)

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment, TargetSpec

__all__ = ["DEFAULT_IMAGE_PORT", "RESOURCE_KIND", "DockerTarget", "container_config", "published_port"]

NETWORKS = ("bridge", "host")
# The keys of `target:` only a docker target takes (beside COMMON_SECTION's).
SECTION = (
    Param("image", "str", None, doc="docker: the image to run; none runs the builtin stack from this host's Python"),
    Param("command", "str_list", (), doc="docker: the image's command, e.g. [--model, m, --port, '8000']"),
    Param("env", "mapping", None, doc="docker: environment variables {NAME: value}"),
    Param("network", "choice", "bridge", choices=NETWORKS,
          doc="docker: bridge (default: a network of the run's own, the port published on 127.0.0.1 only), "
              "or host (the host's network: a server binding 0.0.0.0 listens on every interface)"),
    Param("port", "int", None, min=1, max=65535,
          doc="docker: the port the server listens on in the container (image default 8000)"),
    Param("volumes", "str_list", (), doc="docker: bind mounts HOST:CONTAINER[:ro|rw], read-only unless :rw; "
          "one host path may go to several container paths, each container path takes one"),
    Param("hardening", "choice", "default", choices=("default", "none"),
          doc="docker image targets: default drops NET_RAW, MKNOD, SYS_CHROOT, SETFCAP, SETPCAP, AUDIT_WRITE and sets "
              "no-new-privileges; none keeps Docker's defaults"),
    Param("gpus", "str", None, doc="docker: GPUs as `docker run --gpus`: all, a count, or device=0,1"),
)
RESOURCE_KIND = "docker.container"
DEFAULT_IMAGE_PORT = 8000  # vLLM's, SGLang's (30000 aside) and TGI's usual API port
LOG_MAX_SIZE = "64m"  # what the daemon keeps of the container's output (json-file log-opts)
POLL_S = 0.25
READ_DEADLINE_S = 5.0  # one readiness answer, read whole (byte-capped: chaos.host.capped)
# The loopback port we publish on is picked free, then bound by Docker's proxy at start: another
# process may take it in between (a busy host's ephemeral ports turn over), and start then fails
PORT_ATTEMPTS = 3
PORT_TAKEN = ("address already in use", "port is already allocated")
IMAGE_CAP_DROP = ("NET_RAW", "MKNOD", "SYS_CHROOT", "SETFCAP", "SETPCAP", "AUDIT_WRITE")  # target.hardening: default


def container_config(
    spec: TargetSpec, *, image: str, port: int, labels: dict[str, str], name: str,
    command: list[str] | None = None, environment: dict[str, str] | None = None,
    mounts: dict[str, dict[str, str]] | None = None, hardened_user: str | None = None,
    host_port: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``client.containers.create``, from the target spec. Pure but for a
    ``SetupFailed`` when two mounts claim one container path.

    ``host_port`` (bridge): the loopback port to publish ``port`` on; None lets Docker pick one,
    which it may change when the container is started again (``docker.kill`` with a restart).

    ``hardened_user`` (the host-Python stack): run as that uid:gid with a read-only root, a private
    /tmp, no capabilities and no new privileges.
    """
    volumes = _binds(mounts or {}, spec.volumes)
    config: dict[str, Any] = {
        "image": image,
        "name": name,
        "command": command if command is not None else (list(spec.command) or None),
        "environment": {**dict(spec.env), **(environment or {})},
        "labels": labels,
        "volumes": volumes,
        "detach": True,
        "log_config": {"type": "json-file", "config": {"max-size": LOG_MAX_SIZE, "max-file": "1"}},
        "restart_policy": {"Name": "no"},  # restarts are the faults' to make, and to record
    }
    if spec.network == "host":
        config["network_mode"] = "host"
    else:
        config["ports"] = {f"{port}/tcp": ("127.0.0.1", host_port)}  # on loopback only
    if spec.gpus:
        from docker.types import DeviceRequest

        count, ids = parse_gpus(spec.gpus)
        config["device_requests"] = [DeviceRequest(count=count if not ids else None, device_ids=list(ids) or None,
                                                   capabilities=[["gpu"]])]
    if hardened_user is not None:
        config.update(user=hardened_user, read_only=True, tmpfs={"/tmp": "rw,size=256m"}, working_dir="/tmp",
                      cap_drop=["ALL"], security_opt=["no-new-privileges"])
    elif spec.hardening == "default":
        # an image's own entrypoint may chown, setuid down or bind a low port (Docker's defaults keep
        # those); what no inference server needs goes: raw sockets, device nodes, chroot, file
        # capabilities, audit writes, and gaining privileges through a setuid binary
        config.update(cap_drop=list(IMAGE_CAP_DROP), security_opt=["no-new-privileges"])
    return config


def _binds(mounts: dict[str, dict[str, str]], volumes: tuple[str, ...] | list[str]) -> list[str]:
    """``HOST:CONTAINER:MODE`` binds, the list form the SDK takes: its dict form is keyed by host path, so
    one host path mounted twice (read-only here, writable there) would keep only one mount. ``mounts``
    (the host-Python stack's own) first; a volume over a container path already taken is refused."""
    binds: dict[str, str] = {}  # container path → its bind
    for host, mount in mounts.items():
        binds[mount["bind"]] = f"{host}:{mount['bind']}:{mount['mode']}"
    for text in volumes:
        host, inside, mode = parse_volume(text)
        bind = f"{host}:{inside}:{mode}"
        if binds.setdefault(inside, bind) != bind:  # one container path takes one mount (docker refuses two)
            raise SetupFailed(f"target.volumes: {text!r} mounts at {inside}, where {binds[inside]} is mounted "
                              "already; give it another container path")
    return list(binds.values())


def published_port(attrs: dict[str, Any], port: int) -> int | None:
    """The host port Docker published for the container's ``port`` (bridge networking). Pure."""
    bindings = ((attrs.get("NetworkSettings") or {}).get("Ports") or {}).get(f"{port}/tcp") or []
    for binding in bindings:
        if binding.get("HostPort"):
            return int(binding["HostPort"])
    return None


def _dry_problems(spec: TargetSpec) -> list[str]:
    """What would stop the container before it is created, known without asking the daemon."""
    import importlib.util

    problems = []
    if importlib.util.find_spec("docker") is None:
        problems.append("a docker target needs the Docker SDK: in the streamchaos clone, pip install -e '.[docker]' "
                        "(the `docker` package)")
    if spec.image is None:
        try:
            require_engine("a docker target without an image (the builtin stack from this host's Python)")
        except SetupFailed as exc:
            problems.append(str(exc))
    problems += [f"target.volumes: {host} does not exist on this host" for host, _, _ in map(parse_volume, spec.volumes)
                 if not Path(host).exists()]
    return problems


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@target_kind
class DockerTarget(Target):
    """One container for one run: created, started, waited on until it answers, and removed."""

    kind = "docker"
    summary = ("a container the run starts through the Docker SDK (an image, or the builtin stack from this host's "
               "Python), reached where it listens, removed at the end")
    order = 3
    started_by_run = True
    section = Schema((*COMMON_SECTION.params, *SECTION))
    support = (SupportColumn("docker", "docker (a container the run starts)", {
        "client": "yes", "proxy": "yes", "admin": "builtin image only", "engine-hooks": "builtin image only",
        "gpu": "GPU host", "container": "yes",
    }, rank=4),)
    outlives_runner = True  # a container keeps running when the runner is killed: the watchdog removes it

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        return cls(spec, run_dir=start.run_dir, seed=start.seed, run_id=start.run_id, record=start.record)

    @classmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        """The container as the run would make it; neither the daemon nor the image is asked."""
        spec = exp.target
        builtin = spec.image is None
        what = "the builtin stack from this host's Python (no image: no registry needed)" if builtin else \
            f"image {spec.image}"
        out.say(f"target: a container of {what}, created through the Docker SDK for the run and removed at the end, "
                "its output kept as container.log (not started now; the Docker daemon is not asked in a dry run)")
        port = spec.port or ("<free port>" if builtin else DEFAULT_IMAGE_PORT)
        if spec.network == "bridge":
            root = "http://127.0.0.1:<published port>"
            out.say(f"network bridge: a network of the run's own, the server's port {port} published on 127.0.0.1 "
                    "only", 1)
        else:
            root = f"http://127.0.0.1:{port}"
            out.say(f"network host: the host's network, the server listening on port {port} (refused if another "
                    "process holds it before the start or answers it before the container's server does)", 1)
        for problem in _dry_problems(spec):
            out.say(f"NOT POSSIBLE HERE: {problem}", 1)
            out.worst(4)
        out.say(f"start-up allowance {format_duration(spec.startup_timeout)} (target.startup_timeout) for "
                f"{root}/v1/models to answer", 1)
        return TargetInfo(kind="docker", base_url=root + "/v1", metrics_url=spec.metrics_url or root + "/metrics",
                          admin_url=root + "/admin" if builtin else None, model=spec.model), False

    def __init__(self, spec: TargetSpec, *, run_dir: Path, seed: int, run_id: str,
                 record: ResourceRecorder | None) -> None:
        self.spec = spec
        self.run_dir = run_dir.resolve()
        self.seed = seed
        self.run_id = run_id or secrets.token_hex(8)
        self.record = record or (lambda body: None)
        self.builtin = spec.image is None
        self.token = (configured_admin_token(spec) or secrets.token_urlsafe(32)) if self.builtin else None
        register_secret(self.token)  # never recorded or printed (chaos.host.redact)
        self.container_id: str | None = None
        self._planned = False  # journaled: from then on stop() removes and records a release
        self.port = 0
        self.info = TargetInfo(kind="docker", base_url="", model=spec.model)
        self._client: Any = None
        self._host_pid: int | None = None  # the container's init process, seen from this host

    # -- life ----------------------------------------------------------------------------------
    async def start(self) -> TargetInfo:
        await asyncio.to_thread(self._launch)
        self.info = await self._wait_ready()
        return self.info

    async def restart(self) -> None:
        """Start the same container again (after ``docker.kill``), on the same port, and wait until it answers."""
        old = self.info
        await asyncio.to_thread(self._start_again)
        self.info = await self._wait_ready()
        if self.info.base_url != old.base_url:
            raise SetupFailed(f"the restarted container came back at {self.info.base_url}, not {old.base_url}")

    async def stop(self) -> None:
        await asyncio.to_thread(self._remove)

    def host_processes(self) -> tuple[int, ...] | None:
        return (self._host_pid,) if self._host_pid else None

    # -- in a worker thread (the SDK blocks) ---------------------------------------------------------
    def _launch(self) -> None:
        client = self._client = docker_client(SetupFailed)
        spec = self.spec
        labels = run_labels(self.run_id, self.run_dir, "target")
        name = f"streamchaos-{self.run_id}"
        if self.builtin:
            from chaos.targets.host_image import host_image, host_mounts, host_python, host_pythonpath

            image = host_image(client)
            self.port = spec.port or _free_port()
            model = Path(str(spec.model))
            extra = (str(model.resolve()),) if model.is_dir() else ()
            config = container_config(
                spec, image=image, port=self.port, labels=labels, name=name, host_port=_free_port(),
                command=[host_python(), "-m", "chaos", "stack", "serve", *serve_args(spec, self.port, self.seed)],
                environment={"HOME": "/tmp", "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                             "PYTHONPATH": host_pythonpath(), ADMIN_TOKEN_ENV: self.token or ""},
                mounts=host_mounts(extra), hardened_user=f"{os.getuid()}:{os.getgid()}",
            )
            if spec.network == "bridge":  # the stack must listen where Docker forwards to
                config["command"] = [a if a != "127.0.0.1" else "0.0.0.0" for a in config["command"]]
        else:
            image = str(spec.image)
            self.port = spec.port or DEFAULT_IMAGE_PORT
            config = container_config(spec, image=image, port=self.port, labels=labels, name=name,
                                      host_port=_free_port())
        for host, _, _ in map(parse_volume, spec.volumes):
            if not Path(host).exists():
                raise SetupFailed(f"target.volumes: {host} does not exist on this host")
        if spec.network == "host":
            self._refuse_taken_port()
        # journaled (fsync'd) before it exists: rollback finds it by its labels even if we die right after
        self._planned = True
        self.record({"name": "target", "kind": RESOURCE_KIND, "action": "plan",
                     "undo": {"container_name": name, "image": image, "labels": labels}})
        if spec.network == "bridge":  # after the plan: rollback removes the run's networks with its containers
            self._make_network(client, name, labels)
            config["network"] = name
        container = self._create_and_start(client, config, image)
        self._learn_host_pid(container)

    def _create_and_start(self, client: Any, config: dict[str, Any], image: str) -> Any:
        """Create the container (journaled with its id) and start it; a published port another process
        took since we picked it costs that container, and the next one gets another port."""
        from docker.errors import APIError, ImageNotFound

        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                container = client.containers.create(**config)
            except ImageNotFound:
                raise SetupFailed(f"image {image!r} is not on the Docker daemon: `docker pull {image}` (or build it) "
                                  "first; streamchaos does not pull, a pull can outlast any startup timeout") from None
            except APIError as exc:
                raise SetupFailed("the Docker daemon refused to create the target container: "
                                  f"{exc.explanation or exc}") from None
            self.container_id = container.id
            self.record({"name": "target", "kind": RESOURCE_KIND, "action": "plan",
                         "undo": {"container_id": container.id}})
            try:
                container.start()
                break
            except APIError as exc:
                why = str(exc.explanation or exc)
                if "ports" not in config or attempt == PORT_ATTEMPTS or not any(t in why for t in PORT_TAKEN):
                    raise SetupFailed(f"the target container {container.id[:12]} did not start: {why}") from None
                # taken since we picked it: this container (never started) goes, the next one gets another port;
                # a daemon that refuses the removal leaves it to the run's teardown (by its run label)
                with contextlib.suppress(APIError):
                    remove_container(container, None)
                config["ports"] = {key: ("127.0.0.1", _free_port()) for key in config["ports"]}
        return container

    def _refuse_taken_port(self) -> None:
        """On the host's network whoever listens on the port first answers the run, API key and load: a
        port already taken is refused before anything is created."""
        taken = listeners(self.port)
        if taken:
            who = "; ".join(listener.describe() for listener in taken)
            raise SetupFailed(f"port {self.port} (target.port) is already in use on this host: {who}. With "
                              "target.network: host whoever listens there would receive the run's requests and "
                              "its API key; stop that process, choose another target.port, or use network: bridge")

    def _own_listener(self, root_pid: int | None) -> bool:
        """Whether the container's processes (``root_pid``, its init seen from this host, and every process
        below it) listen on the port: False while nothing listens there yet; ``SetupFailed`` when a socket
        answering 127.0.0.1 on it is another process's (it bound first, and would get the key and the load)."""
        if not listening(self.port):
            return False
        stranger = foreign_listener(self.port, descendants(root_pid) if root_pid else set())
        if stranger is not None:
            raise SetupFailed(f"port {self.port} on this host's network (target.network: host) is answered by "
                              f"{stranger.describe()}, not by the target container {str(self.container_id)[:12]}: "
                              "no request (nor the API key) was sent to it; stop that process, or choose another "
                              "target.port")
        return True

    @staticmethod
    def _make_network(client: Any, name: str, labels: dict[str, str]) -> None:
        """A bridge network of this run's own: the container is reachable only through the port
        published on 127.0.0.1 and the bridge's private address, and shares it with no other run."""
        from docker.errors import APIError

        try:
            client.networks.create(name, driver="bridge", labels=labels)
        except APIError as exc:
            raise SetupFailed(f"the Docker daemon could not make a bridge network for the target "
                              f"({exc.explanation or exc}): set target.network: host to use the host's "
                              "network") from None

    def _learn_host_pid(self, container: Any) -> None:
        """The container's first process as this host sees it: the root of its tree for the host record."""
        try:
            container.reload()
            self._host_pid = int(container.attrs.get("State", {}).get("Pid") or 0) or None
        except Exception:  # noqa: BLE001 - a record of CPU use must never stop a run
            self._host_pid = None

    def _start_again(self) -> None:
        container = self._container()
        container.reload()
        if container.status != "running":
            container.start()
        self._learn_host_pid(container)

    def _container(self) -> Any:
        if self._client is None:
            self._client = docker_client(SetupFailed)
        container = find_container(self._client, self.container_id or "")
        if container is None:
            raise SetupFailed(f"the target container {str(self.container_id)[:12]} is gone (removed by someone else?)")
        return container

    def _state(self) -> dict[str, Any]:
        container = self._container()
        container.reload()
        facts = container_facts(container.attrs)
        if self.spec.network == "bridge" and facts["status"] == "running":
            facts["host_port"] = published_port(container.attrs, self.port)
        return facts

    def _log_tail(self, lines: int = 20) -> str:
        try:
            logs: bytes = self._container().logs(tail=lines)
            return logs.decode("utf-8", "replace").strip()
        except Exception as exc:  # noqa: BLE001 - only for a message
            return f"(no log: {exc!r})"

    def _remove(self) -> None:
        if not self._planned:
            return
        if self._client is None:
            self._client = docker_client(SetupFailed)
        container = find_container(self._client, self.container_id or "")
        evidence: dict[str, Any] = {"removed": False,
                                    "why": "never created" if self.container_id is None else "already gone"}
        if container is not None:
            evidence = remove_container(container, self.run_dir / "container.log")
        # and any container of this run whose id never reached us (a create whose answer was lost)
        strays = remove_run_containers(self._client, run_id=self.run_id, run_dir=self.run_dir, log_dir=self.run_dir)
        if strays["removed"]:
            evidence["strays"] = strays["removed"]
        if strays.get("networks_removed"):
            evidence["networks_removed"] = strays["networks_removed"]
        self.record({"name": "target", "kind": RESOURCE_KIND, "action": "release", "evidence": evidence})
        self._planned = False
        self._client.close()
        self._client = None

    # -- readiness ------------------------------------------------------------------------------
    async def _wait_ready(self) -> TargetInfo:
        """Poll until the server in the container answers ``GET /v1/models``; fail early if the container exits."""
        deadline = time.monotonic() + self.spec.startup_timeout
        headers = {"Authorization": f"Bearer {self.spec.api_key}"} if self.spec.api_key else {}
        last = "no answer yet"
        async with httpx.AsyncClient(timeout=2.0, headers=headers, trust_env=False, verify=tls_context()) as client:
            while True:
                facts = await asyncio.to_thread(self._state)
                if facts["status"] != "running":
                    tail = await asyncio.to_thread(self._log_tail)
                    raise SetupFailed(f"the target container {facts['container']} is {facts['status']} (exit code "
                                      f"{facts['exit_code']}) before it answered; its last lines:\n{tail}")
                root = f"http://127.0.0.1:{facts.get('host_port') or self.port}"
                answer = await self._probe(client, root, facts)
                if not isinstance(answer, str):
                    return await self._info(client, root, answer, facts)
                last = answer
                if time.monotonic() > deadline:
                    tail = await asyncio.to_thread(self._log_tail)
                    raise SetupFailed(f"the target container {facts['container']} did not answer {root}/v1/models "
                                      f"within {self.spec.startup_timeout:g}s ({last}); its last lines:\n{tail}")
                await asyncio.sleep(POLL_S)

    async def _probe(self, client: httpx.AsyncClient, root: str, facts: dict[str, Any]) -> Capped | str:
        """One readiness request: the answer, or why there is none yet. On the host's network it (and the
        API key it carries) goes only where the container's own processes listen."""
        if self.spec.network == "host" and not await asyncio.to_thread(self._own_listener, facts.get("pid")):
            return f"nothing listens on 127.0.0.1:{self.port} yet"
        try:
            response = await get_capped(client, root + "/v1/models", limit=JSON_LIMIT, deadline=READ_DEADLINE_S)
        except httpx.HTTPError as exc:
            return repr(exc)
        return response if response.status_code < 400 else f"HTTP {response.status_code}"

    async def _info(self, client: httpx.AsyncClient, root: str, models: Capped,
                    facts: dict[str, Any]) -> TargetInfo:
        try:
            served = [m["id"] for m in models.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            served = []
        model = str(self.spec.model)
        if served and model not in served:
            model = served[0]  # the experiment's name for it rarely matches what an image serves
        info = TargetInfo(kind="docker", base_url=root + "/v1", metrics_url=self.spec.metrics_url or root + "/metrics",
                          model=model, container_id=self.container_id)
        if self.builtin:  # our own stack: its admin API (in-process faults) and where its engine runs
            device = "cpu"
            try:
                health = await get_capped(client, root + "/health", limit=JSON_LIMIT, deadline=READ_DEADLINE_S)
                device = clip(health.json().get("device", "cpu"), 32) or "cpu"
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            info = replace(info, admin_url=root + "/admin", admin_token=self.token, device=device)
        return info
