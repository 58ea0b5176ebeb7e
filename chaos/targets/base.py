"""Bringing up the system under test: the builtin stack as a child process, or a remote server.

``chaos.targets.registry.start_target`` returns a ``Target`` whose ``info`` (a
``chaos.model.context.TargetInfo``) tells faults and the load generator where everything is;
``stop()`` leaves nothing running.

The admin token of a builtin stack comes from configuration only (``target.admin_token``,
``target.admin_token_file``, ``STREAMCHAOS_ADMIN_TOKEN``); a stack the runner starts gets a fresh
random one in its environment. A remote target is sent the token only after it has shown that it
holds it (``chaos.stack.admin_client.recognise``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from chaos.host.capped import JSON_LIMIT, clip, get_capped
from chaos.host.redact import register_secret
from chaos.host.tls import tls_context
from chaos.model.context import TargetInfo
from chaos.model.errors import ExperimentInvalid, SetupFailed, TargetUnreachable
from chaos.model.observations import MetricSample, Note
from chaos.stack.admin_client import recognise
from chaos.stack.process import StackProcess
from chaos.stack.serve import ADMIN_TOKEN_ENV, ServeUsageError, read_token_file
from chaos.targets.scraper import MetricScraper

__all__ = [
    "BuiltinStack", "RemoteTarget", "ResourceRecorder", "Target", "configured_admin_token", "require_engine",
    "serve_args", "target_facts",
]

if TYPE_CHECKING:
    from chaos.model.experiment import TargetSpec

log = logging.getLogger("chaos.targets.base")

# Journals a resource a target created outside this process (``Journal.resource``): one JSON body.
ResourceRecorder = Callable[[dict[str, Any]], None]


# What the builtin stack imports that a light install (`pip install streamchaos`) leaves out.
ENGINE_MODULES = ("torch", "tokenizers", "safetensors", "starlette", "uvicorn")


def require_engine(what: str) -> None:
    """``SetupFailed`` (exit 4, one line) naming what to install when the builtin engine is missing."""
    import importlib.util

    missing = [m for m in ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise SetupFailed(f"{what} needs the builtin engine, which is not installed (missing: {', '.join(missing)}): "
                          "from the clone, pip install -c .ci/constraints.txt --extra-index-url "
                          "https://download.pytorch.org/whl/cpu -e '.[engine]' (the CPU build of torch), or point the "
                          "run at a running server with --target-url URL")


def configured_admin_token(spec: TargetSpec, environ: Mapping[str, str] = os.environ) -> str | None:
    """The admin token the configuration gives: ``target.admin_token``, ``target.admin_token_file``
    (owner-only mode), or ``STREAMCHAOS_ADMIN_TOKEN``; None when none does."""
    if getattr(spec, "admin_token", None):
        return str(spec.admin_token)
    path = getattr(spec, "admin_token_file", None)
    if path:
        try:
            return read_token_file(os.path.expanduser(str(path)))
        except ServeUsageError as exc:
            raise ExperimentInvalid(f"target.admin_token_file: {exc}") from None
    return environ.get(ADMIN_TOKEN_ENV, "").strip() or None


def serve_args(spec: TargetSpec, port: int, seed: int) -> list[str]:
    """`streamchaos stack serve` arguments for the builtin stack the spec describes (never the admin token:
    a command line is public on the host)."""
    args = [
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(spec.model), "--device", spec.device,
        "--kv-blocks", str(spec.kv_blocks), "--block-size", str(spec.block_size),
        "--max-num-seqs", str(spec.max_num_seqs), "--max-model-len", str(spec.max_model_len),
        "--seed", str(seed),
    ]
    return args + list(spec.extra_args)


class Target:
    """The system under test as the runner drives it: start, stop, and (where possible) restart.

    ``outlives_runner``: it keeps running if the runner is killed (a container), so the runner keeps
    a watchdog that rolls the run back (``chaos.execution.rollback``) when it dies.
    """

    info: TargetInfo
    outlives_runner: bool = False

    async def start(self) -> TargetInfo:  # pragma: no cover - interface
        raise NotImplementedError

    async def stop(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    async def restart(self) -> None:
        raise SetupFailed(f"target {self.info.kind} cannot be restarted by streamchaos")

    def observing(self, sink: Callable[[MetricSample | Note], None], interval: float,
                  headers: Mapping[str, str] | None = None) -> AbstractAsyncContextManager[Any]:
        """What the run records about the target while it runs: its ``/metrics`` scraped every ``interval``
        with ``headers`` (the metrics credentials); a Kubernetes target also records its pods and
        scrapes each of them."""
        return MetricScraper(self.info.metrics_url, interval, sink, headers=headers)

    def watchdog_env(self) -> dict[str, str]:
        """Environment a watchdog's rollback needs to reach this target (configuration, never the journal)."""
        return {}

    def host_processes(self) -> tuple[int, ...] | None:
        """The target's processes on this host, as roots of their trees (``chaos.host.contention`` counts
        their CPU as the run's own); None where the run does not know them (an engine started elsewhere)."""
        return (self.info.pid,) if self.info.pid else None


class BuiltinStack(Target):
    """`streamchaos stack serve` as a child process on an ephemeral loopback port."""

    def __init__(self, spec: TargetSpec, log_path: Path, seed: int) -> None:
        self.spec = spec
        self.log_path = log_path
        self.seed = seed
        self.process: StackProcess | None = None
        self.info = TargetInfo(kind="builtin", base_url="", model=spec.model)
        self._port = 0
        self._token: str | None = None

    def serve_args(self) -> list[str]:
        return serve_args(self.spec, self._port, self.seed)

    async def start(self) -> TargetInfo:
        # spawned here, in the loop's thread, so it dies with us (chaos.host.children); its own session
        # keeps a Ctrl-C in the terminal from reaching it before the runner stops it in order
        if self._token is None:  # one per run, kept across a restart
            self._token = configured_admin_token(self.spec) or secrets.token_urlsafe(32)
            register_secret(self._token)  # never recorded or printed (chaos.host.redact)
        self.process = StackProcess.launch(*self.serve_args(), log=self.log_path, new_session=True,
                                           admin_token=self._token)
        url = await asyncio.to_thread(self.process.wait_ready, self.spec.startup_timeout)
        device = "cpu"
        try:
            # trust_env=False: an HTTP(S)_PROXY in the environment must not carry a probe of our own
            # loopback stack (or of the target below) anywhere the load itself does not go
            async with httpx.AsyncClient(timeout=5.0, trust_env=False, verify=tls_context()) as client:
                health = (await get_capped(client, url + "/health", limit=JSON_LIMIT, deadline=5.0)).json()
                device = str(health.get("device", "cpu"))
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        self._port = int(url.rsplit(":", 1)[1])  # a restart comes back on the same port
        self.info = TargetInfo(
            kind="builtin", base_url=url + "/v1", metrics_url=url + "/metrics", admin_url=url + "/admin",
            admin_token=self._token, pid=self.process.pid, device=device, model=str(self.spec.model),
        )
        return self.info

    async def restart(self) -> None:
        old = self.info
        await self.stop()
        self.info = await self.start()
        if self.info.base_url != old.base_url:
            raise SetupFailed(f"the restarted stack came back at {self.info.base_url}, not {old.base_url}")

    async def stop(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self.process.close)


class RemoteTarget(Target):
    """An OpenAI-compatible server that is already running (vLLM, SGLang, TGI, a gateway)."""

    def __init__(self, spec: TargetSpec, url: str) -> None:
        base = url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        metrics = spec.metrics_url or base[: -len("/v1")] + "/metrics"
        kind = "openai" if spec.kind == "builtin" else spec.kind  # --target-url overrides the builtin stack
        self.info = TargetInfo(kind=kind, base_url=base, metrics_url=metrics, model=spec.model)
        self.api_key = spec.api_key
        self.admin_token = configured_admin_token(spec)
        register_secret(self.admin_token)

    async def start(self) -> TargetInfo:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            async with httpx.AsyncClient(timeout=10.0, headers=headers, trust_env=False,
                                         verify=tls_context()) as client:
                response = await get_capped(client, self.info.base_url + "/models", limit=JSON_LIMIT, deadline=10.0)
        except httpx.HTTPError as exc:
            raise TargetUnreachable(f"{self.info.base_url}/models did not answer: {exc!r}") from exc
        if response.status_code >= 400:
            raise TargetUnreachable(f"{self.info.base_url}/models answered HTTP {response.status_code}")
        try:
            served = [m["id"] for m in response.json().get("data", [])]
        except ValueError as exc:  # too large, too deep, not JSON: the experiment's model name stays
            log.warning("not reading the model list of %s/models: %s", self.info.base_url, clip(exc))
            served = []
        except (KeyError, TypeError, AttributeError):
            served = []
        if served and self.info.model not in served:
            # the experiment's model name ("tiny") rarely matches a remote server's: use what it serves
            self.info = replace(self.info, model=served[0])
        await self._find_admin()
        return self.info

    async def _find_admin(self) -> None:
        """A builtin stack started elsewhere (`streamchaos stack serve`) keeps its admin API, so the
        in-process faults (server.*, kv.pressure reserve) work against it too, given its token. The
        token goes only to a stack that proved it holds it; nothing is sent without one."""
        root = self.info.base_url[: -len("/v1")]
        if not self.admin_token:
            log.info("no admin token configured for %s: in-process faults are off (set target.admin_token_file "
                     "or %s to use them against a builtin stack)", root, ADMIN_TOKEN_ENV)
            return
        why = await recognise(root, self.admin_token)
        if why is not None:
            log.warning("not sending the admin token to %s: %s", root, why)
            return
        try:
            async with httpx.AsyncClient(timeout=5.0, trust_env=False, verify=tls_context()) as client:
                health = (await get_capped(client, root + "/health", limit=JSON_LIMIT, deadline=5.0)).json()
                state = await get_capped(client, root + "/admin/state", limit=JSON_LIMIT, deadline=5.0,
                                         headers={"Authorization": f"Bearer {self.admin_token}"})
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("the admin API of %s did not answer: %r", root, exc)
            return
        if state.status_code == 200:
            self.info = replace(self.info, kind="builtin", admin_url=root + "/admin", admin_token=self.admin_token,
                                device=clip(health.get("device", "cpu")) or "cpu" if isinstance(health, dict)
                                else "cpu")

    async def stop(self) -> None:
        return None


def target_facts(info: TargetInfo) -> dict[str, Any]:
    """What the journal keeps about a target (never its credentials)."""
    facts = {
        "kind": info.kind, "base_url": info.base_url, "metrics_url": info.metrics_url, "admin_url": info.admin_url,
        "pid": info.pid, "device": info.device, "model": info.model, "metrics": bool(info.metrics_url),
    }
    if info.container_id:
        facts["container"] = info.container_id[:12]
    return facts
