"""Containers streamchaos starts, through the Docker SDK: labels, ownership, state read back, removal.

A leaf module (it imports only ``chaos.model.errors`` and ``chaos.host.runfiles``; the ``docker``
package lazily), shared by the docker target (``chaos.targets.docker``), the container faults
(``faults.docker``), the containerised Toxiproxy (``chaos.execution.proxy``) and rollback.

Every container streamchaos starts carries ``streamchaos.run_id`` (the journal's run id) and
``streamchaos.run_dir`` (the run directory, resolved). Those labels, not the journal, decide what is
this run's: rollback acts on a container only when both labels match the run it is rolling back
(the run id from that run's journal, the directory from the command line), whatever container id
the journal names (see ``SECURITY.md``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chaos.host.runfiles import open_append
from chaos.model.errors import ChaosError, SetupFailed

__all__ = [
    "CLIENT_TIMEOUT_S",
    "LABEL_ROLE",
    "LABEL_RUN_DIR",
    "LABEL_RUN_ID",
    "LOG_LIMIT_BYTES",
    "container_facts",
    "daemon_problem",
    "docker_client",
    "find_container",
    "ownership_problem",
    "parse_env",
    "parse_gpus",
    "parse_volume",
    "remove_container",
    "remove_run_containers",
    "remove_run_networks",
    "rollback_container",
    "run_labels",
    "save_logs",
    "short_id",
]

LABEL_RUN_ID = "streamchaos.run_id"
LABEL_RUN_DIR = "streamchaos.run_dir"
LABEL_ROLE = "streamchaos.role"
CLIENT_TIMEOUT_S = 30  # one API call; a paused or dying container can make the daemon slow, never silent
LOG_LIMIT_BYTES = 64 * 1024 * 1024  # what is copied into the run directory (the daemon keeps as much: log-opts)


def docker_client(error: type[ChaosError] = SetupFailed, what: str = "a docker target") -> Any:
    """A Docker SDK client for the daemon the environment names (``DOCKER_HOST``, else the local socket).

    ``error`` (``SetupFailed`` for a target, ``FaultUnsupported`` for a fault) says why there is none.
    """
    try:
        import docker
    except ImportError:
        raise error(f"{what} needs the Docker SDK: in the streamchaos clone, pip install -e '.[docker]' "
                    "(the `docker` package)") from None
    try:
        client = docker.from_env(timeout=CLIENT_TIMEOUT_S)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - no daemon, no permission, a bad DOCKER_HOST: all say the same
        where = os.environ.get("DOCKER_HOST") or "the local socket (/var/run/docker.sock)"
        raise error(f"{what} needs a Docker daemon, and none answers at {where}: {exc}") from None
    return client


def daemon_problem() -> str | None:
    """Why containers cannot be started here (no SDK, no daemon), or None when they can."""
    try:
        docker_client().close()
    except ChaosError as exc:
        return str(exc)
    return None


def run_labels(run_id: str, run_dir: str | Path, role: str) -> dict[str, str]:
    """The labels that make a container this run's."""
    return {LABEL_RUN_ID: run_id, LABEL_RUN_DIR: str(Path(run_dir).resolve()), LABEL_ROLE: role}


def ownership_problem(attrs: Mapping[str, Any], *, run_dir: str | Path, run_id: str | None = None) -> str | None:
    """Why the container (or network) described by ``attrs`` (the daemon's inspect data) is not this
    run's; None when it is. Pure."""
    labels = (attrs.get("Config") or {}).get("Labels") or attrs.get("Labels") or {}
    want_dir = str(Path(run_dir).resolve())
    if labels.get(LABEL_RUN_DIR) != want_dir:
        found = labels.get(LABEL_RUN_DIR)
        return (f"container {short_id(attrs)} is not this run's: its {LABEL_RUN_DIR} label is "
                f"{found!r}, not {want_dir!r}" if found else
                f"container {short_id(attrs)} carries no {LABEL_RUN_DIR} label")
    if run_id is not None and labels.get(LABEL_RUN_ID) != run_id:
        return (f"container {short_id(attrs)} is not this run's: its {LABEL_RUN_ID} label is "
                f"{labels.get(LABEL_RUN_ID)!r}, not {run_id!r}")
    return None


def short_id(attrs: Mapping[str, Any]) -> str:
    return str(attrs.get("Id", ""))[:12]


def container_facts(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """What the daemon says about a container, as evidence: state, restarts, CPU limits. Pure."""
    state = attrs.get("State") or {}
    host = attrs.get("HostConfig") or {}
    return {
        "container": short_id(attrs),
        "status": state.get("Status"),
        "paused": bool(state.get("Paused")),
        "pid": state.get("Pid"),
        "exit_code": state.get("ExitCode"),
        "oom_killed": bool(state.get("OOMKilled")),
        "started_at": state.get("StartedAt"),
        "finished_at": state.get("FinishedAt"),
        "restart_count": attrs.get("RestartCount"),
        "cpu_quota_us": host.get("CpuQuota"),
        "cpu_period_us": host.get("CpuPeriod"),
        "nano_cpus": host.get("NanoCpus"),
    }


def find_container(client: Any, container_id: str) -> Any | None:
    """The container with this id (or name), or None when the daemon has none."""
    import docker.errors

    if not container_id:
        return None
    try:
        return client.containers.get(container_id)
    except docker.errors.NotFound:
        return None


def save_logs(container: Any, path: Path, limit: int = LOG_LIMIT_BYTES) -> int:
    """Append the container's stdout and stderr to ``path`` (0600), at most ``limit`` bytes; the byte count."""
    written = 0
    with open_append(path) as out:
        for chunk in container.logs(stream=True, follow=False, stdout=True, stderr=True):
            chunk = chunk[: max(0, limit - written)]
            out.write(chunk)
            written += len(chunk)
            if written >= limit:
                out.write(b"\n[streamchaos: log cut at %d bytes]\n" % limit)
                break
    return written


def remove_container(container: Any, log_path: Path | None) -> dict[str, Any]:
    """Keep its logs (when ``log_path``), then remove it whatever its state; evidence read back first."""
    import docker.errors

    container.reload()
    facts = container_facts(container.attrs)
    evidence: dict[str, Any] = {"container": facts["container"], "status": facts["status"],
                                "exit_code": facts["exit_code"]}
    if log_path is not None:
        try:
            evidence["log"], evidence["log_bytes"] = str(log_path), save_logs(container, log_path)
        except (OSError, docker.errors.APIError) as exc:  # the removal matters more than the log
            evidence["log_error"] = repr(exc)
    try:
        container.remove(force=True)  # force: a paused or running container is killed first
    except docker.errors.NotFound:
        pass
    evidence["removed"] = True
    return evidence


def remove_run_containers(client: Any, *, run_id: str, run_dir: str | Path, container_id: str = "",
                          log_dir: Path | None = None) -> dict[str, Any]:
    """Remove every container of this run (both labels match), also one the journal never named.

    ``container_id`` (from the journal: data) is looked up too, and left alone unless its labels say
    it is this run's.
    """
    found: dict[str, Any] = {}
    for container in client.containers.list(all=True, filters={"label": f"{LABEL_RUN_ID}={run_id}"}):
        found[container.id] = container
    named = find_container(client, container_id)
    refused: list[str] = []
    if named is not None:
        found.setdefault(named.id, named)
    removed = []
    for container in found.values():
        why = ownership_problem(container.attrs, run_dir=run_dir, run_id=run_id)
        if why is not None:
            refused.append(why)
            continue
        log = (log_dir / f"container-{container.id[:12]}.log") if log_dir is not None else None
        removed.append(remove_container(container, log))
    evidence: dict[str, Any] = {"removed": removed}
    networks, network_refusals = remove_run_networks(client, run_id=run_id, run_dir=run_dir)
    refused += network_refusals
    if networks:
        evidence["networks_removed"] = networks
    if refused:
        evidence["left_alone"] = refused
    if not removed and not refused and not networks:
        evidence["skipped"] = "no container of this run is left"
    return evidence


def remove_run_networks(client: Any, *, run_id: str, run_dir: str | Path) -> tuple[list[str], list[str]]:
    """Remove every network of this run (both labels match; its containers are gone first): the
    names removed, and why any was left alone."""
    import docker.errors

    removed, refused = [], []
    for network in client.networks.list(filters={"label": f"{LABEL_RUN_ID}={run_id}"}):
        why = ownership_problem(network.attrs, run_dir=run_dir, run_id=run_id)
        if why is not None:
            refused.append(why.replace("container ", "network ", 1))
            continue
        try:
            network.remove()
        except docker.errors.NotFound:
            pass
        removed.append(network.name)
    return removed, refused


# -- the target section's container keys, parsed (pure; the experiment loader reports the errors) --

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GPU_DEVICES = re.compile(r"device=([A-Za-z0-9-]+(,[A-Za-z0-9-]+)*)")


def parse_volume(text: str) -> tuple[str, str, str]:
    """``HOST:CONTAINER[:ro|rw]`` → ``(host, container, mode)``; ``ValueError`` saying what is right.
    Read-only unless ``:rw`` says otherwise: a server under test has no business writing the host's
    files (``docker run -v`` defaults to rw; a model or cache mount rarely needs it)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError("expected HOST:CONTAINER, HOST:CONTAINER:ro or HOST:CONTAINER:rw (absolute paths), found "
                         f"{text!r}")
    host, inside = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else "ro"
    if not (host.startswith("/") and inside.startswith("/")):
        raise ValueError(f"both paths must be absolute (/...), found {text!r}")
    if mode not in ("ro", "rw"):
        raise ValueError(f"the mode must be ro or rw, found {mode!r} in {text!r}")
    return host, inside, mode


def parse_gpus(value: object) -> tuple[int, tuple[str, ...]]:
    """``all`` | N | ``device=0,1`` (as ``docker run --gpus``) → ``(count, device_ids)``; count -1 = all."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"a GPU count must be at least 1, found {value}")
        return value, ()
    if isinstance(value, str):
        text = value.strip()
        if text == "all":
            return -1, ()
        if text.isdigit() and int(text) >= 1:
            return int(text), ()
        match = _GPU_DEVICES.fullmatch(text)
        if match:
            return 0, tuple(match.group(1).split(","))
    raise ValueError(f"expected all, a count such as 2, or device=0,1, found {value!r}")


def parse_env(raw: Mapping[Any, Any]) -> tuple[tuple[tuple[str, str], ...], list[tuple[str, str]]]:
    """An ``env`` mapping → sorted ``(NAME, value)`` pairs (scalars as text), and ``(key, message)`` problems."""
    pairs: list[tuple[str, str]] = []
    problems: list[tuple[str, str]] = []
    for key, value in raw.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            problems.append((str(key), f"expected an environment variable name (letters, digits, _), found {key!r}"))
        elif isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        elif isinstance(value, (str, int, float)):
            pairs.append((key, str(value)))
        else:
            problems.append((key, f"expected a string or a number, found {type(value).__name__}"))
    return tuple(sorted(pairs)), problems


def rollback_container(undo: Mapping[str, Any]) -> dict[str, Any]:
    """``streamchaos rollback`` for a target container: remove every container of the run (logs kept in
    the run directory). ``run_dir`` and ``run_id`` come from rollback itself, not from the plan."""
    run_dir, run_id = str(undo.get("run_dir") or ""), str(undo.get("run_id") or "")
    if not run_dir or not run_id:
        raise SetupFailed("container rollback needs the run directory and the journal's run id; nothing was removed")
    client = docker_client(SetupFailed, "removing a run's container")
    try:
        return remove_run_containers(client, run_id=run_id, run_dir=run_dir,
                                     container_id=str(undo.get("container_id") or ""),
                                     log_dir=Path(run_dir))
    finally:
        client.close()
