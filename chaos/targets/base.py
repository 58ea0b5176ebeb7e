"""What a target kind is (``Target``: its facts and one run's instance, registered by ``@target_kind`` in
``TARGET_KINDS``), and two kinds: the builtin stack as a child process (``builtin``) and a server already
running at a URL (``openai``).

``chaos.targets.registry.start_target`` returns a ``Target`` whose ``info`` (a
``chaos.model.context.TargetInfo``) tells faults and the load generator where everything is;
``stop()`` leaves nothing running.

The admin token of a builtin stack comes from configuration only (``target.admin_token``,
``target.admin_token_file``, ``STREAMCHAOS_ADMIN_TOKEN``); a stack the runner starts gets a fresh
random one in its environment. A remote target is sent the token only after it has shown that it
holds it (``chaos.admin.client.recognise``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import httpx

from chaos.admin.client import recognise
from chaos.host.capped import JSON_LIMIT, clip, get_capped
from chaos.host.redact import register_secret
from chaos.host.tls import tls_context
from chaos.model.context import TargetInfo
from chaos.model.engines import PROFILES
from chaos.model.errors import ExperimentInvalid, SetupFailed, TargetUnreachable
from chaos.model.observations import MetricSample, Note
from chaos.model.params import Param, Schema
from chaos.model.units import format_duration
from chaos.stack.process import StackProcess
from chaos.stack.serve import ADMIN_TOKEN_ENV, ServeUsageError, read_token_file
from chaos.targets.scraper import MetricScraper

__all__ = [
    "COMMON_SECTION", "TARGET_KINDS", "Account", "BuiltinStack", "RemoteTarget", "ResourceRecorder", "SupportColumn",
    "Target", "TargetStart", "configured_admin_token", "require_engine", "serve_args", "target_facts", "target_kind",
]

if TYPE_CHECKING:
    from chaos.host.capped import Capped
    from chaos.host.certs import CertPair
    from chaos.model.experiment import Experiment, TargetSpec

log = logging.getLogger("chaos.targets.base")

# Journals a resource a target created outside this process (``Journal.resource``): one JSON body.
ResourceRecorder = Callable[[dict[str, Any]], None]


_BUILTIN_URL = "http://127.0.0.1:<ephemeral port>"  # what a dry run says of the builtin stack's address


def builtin_tls(spec: TargetSpec) -> bool:
    """``target.tls``: a field of the spec where it has one, else the kind's own keys (``options``)."""
    value = getattr(spec, "tls", None)
    return bool(spec.option("tls", False) if value is None else value)


def builtin_http(spec: TargetSpec) -> str:
    """``target.http``: "1.1" or "2" (a field of the spec where it has one, else the kind's own keys)."""
    value = getattr(spec, "http", None)
    return str(spec.option("http", "1.1") if value is None else value)


def _builtin_url(spec: TargetSpec) -> str:
    """What a dry run says of the builtin stack's address: https:// with ``tls: true``."""
    return _BUILTIN_URL.replace("http://", "https://") if builtin_tls(spec) else _BUILTIN_URL


def _say_protocol(spec: TargetSpec, out: Account) -> None:
    """The dry run's line on TLS and HTTP/2, where the experiment asks for either."""
    tls, h2 = builtin_tls(spec), builtin_http(spec) == "2"
    if tls:
        out.say("TLS with a certificate the run makes under <run dir>/tls (its CA trusted by the run and the load)", 1)
    if h2:
        out.say("HTTP/2 through Hypercorn: " + ("h2 by ALPN" if tls else "h2c with prior knowledge (no TLS)")
                + ", HTTP/1.1 still served on the same port; no header or body deadline", 1)
        try:
            require_hypercorn("target.http: 2")
        except SetupFailed as exc:
            out.say(f"NOT POSSIBLE HERE: {exc}", 1)
            out.worst(4)

# What the builtin stack imports that the light core (`pip install -e .` in a clone) leaves out.
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


def require_hypercorn(what: str) -> None:
    """``SetupFailed`` (exit 4) naming what to install when Hypercorn (``stack serve --http 2``) is missing."""
    import importlib.util

    if importlib.util.find_spec("hypercorn") is None:
        raise SetupFailed(f"{what} serves through Hypercorn, which is not installed: pip install hypercorn (the engine "
                          "extra has it: pip install -e '.[engine]')")


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


def serve_args(spec: TargetSpec, port: int, seed: int, tls: CertPair | None = None) -> list[str]:
    """`streamchaos stack serve` arguments for the builtin stack the spec describes (never the admin token:
    a command line is public on the host); ``tls``: the run's certificate, served with --tls."""
    args = [
        "--host", "127.0.0.1", "--port", str(port),
        "--model", str(spec.model), "--device", spec.device,
        "--kv-blocks", str(spec.kv_blocks), "--block-size", str(spec.block_size),
        "--max-num-seqs", str(spec.max_num_seqs), "--max-model-len", str(spec.max_model_len),
        "--seed", str(seed),
    ]
    reasoning = getattr(spec, "reasoning_tokens", (0, 0))
    if reasoning[1] > 0:
        args += ["--reasoning-tokens", f"{reasoning[0]},{reasoning[1]}"]
    if not getattr(spec, "prefix_caching", True):
        args.append("--no-prefix-caching")
    if tls is not None:
        args += ["--tls", "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    if builtin_http(spec) == "2":
        args += ["--http", "2"]
    return args + list(spec.extra_args)


ENGINE_CHOICES = ("auto", *PROFILES)


@dataclass(frozen=True)
class _VersionParam(Param):
    """A choice of HTTP versions, which YAML reads as numbers where written bare (``http: 2``, ``http: 1.1``):
    a number is taken as the version it spells."""

    def parse(self, raw: object) -> Any:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            raw = f"{raw:g}"  # 2 -> "2", 2.0 -> "2", 1.1 -> "1.1"
        return super().parse(raw)


# The builtin stack's own keys (`stack serve --tls`, `--http 2`).
BUILTIN_KEYS = (
    Param("tls", "bool", False,
          doc="builtin: serve HTTPS with a certificate the run makes under <run dir>/tls (its CA trusted by the "
              "run's clients and the load); the target's URL is https://"),
    _VersionParam("http", "choice", "1.1", choices=("1.1", "2"),
                  doc="builtin: 2 serves through Hypercorn: HTTP/2 by ALPN with tls, h2c with prior knowledge "
                      "without (HTTP/1.1 still served); 1.1: uvicorn, HTTP/1.1 only"),
)

# The keys of `target:` every kind takes (the loader adds `kind`, its choices the registered kinds). A
# kind's ``section`` is these plus its own keys; a key only other kinds take is refused for it.
COMMON_SECTION = Schema((
    Param("url", "str", None, doc="OpenAI API root, e.g. http://host:8000/v1 (or --target-url at run time)"),
    Param("metrics_url", "str", None, doc="Prometheus endpoint; default <url without /v1>/metrics"),
    Param("model", "str", "tiny", doc="builtin: tiny or a checkpoint directory; otherwise the served model name"),
    Param("device", "str", "auto", doc="builtin engine device: auto, cpu, cuda or cuda:N"),
    Param("kv_blocks", "int", 512, min=1, doc="builtin: KV cache blocks per layer"),
    Param("block_size", "int", 16, min=1, doc="builtin: tokens per KV block"),
    Param("max_num_seqs", "int", 64, min=1, doc="builtin: most sequences in one batch"),
    Param("max_model_len", "int", 1024, min=2, doc="builtin: prompt plus generated tokens"),
    Param("prefix_caching", "bool", True,
          doc="builtin: automatic prefix caching of full KV blocks, as vLLM's (on by default); vllm: "
              "--no-enable-prefix-caching when false"),
    Param("reasoning_tokens", "int_or_range", (0, 0), min=0,
          doc="builtin: a chat answer's first N tokens stream as delta.reasoning_content (vLLM's shape), N drawn "
              "per request: n or [low, high]; 0: no reasoning"),
    Param("startup_timeout", "duration", 60.0, doc="how long the target may take to answer /health"),
    Param("api_key", "str", None, doc="bearer token sent with every request (prefer api_key_env)"),
    Param("api_key_env", "str", None, doc="environment variable holding the API key (also --api-key-env)"),
    Param("metrics_auth", "str", "api_key",
          doc="credentials for metrics_url: api_key (the target's), none, env:NAME or file:PATH"),
    Param("engine", "choice", "auto", choices=ENGINE_CHOICES,
          doc="the engine's profile (request fields, end of stream, metric names); auto detects it"),
    Param("admin_token", "str", None,
          doc="token for the builtin stack's admin API (prefer admin_token_file or STREAMCHAOS_ADMIN_TOKEN)"),
    Param("admin_token_file", "str", None,
          doc="file (mode 0600) holding the admin token of a builtin stack started elsewhere"),
    Param("extra_args", "str_list", (),
          doc="extra command-line arguments for a spawned server (vllm: its own flags, applied last)"),
    # vllm's, but accepted (at their defaults) by every kind, as before targets were plug-ins
    Param("cpus", "str", "auto", doc="vllm: host CPUs its processes may use: auto (on CPU, all but one, left to the "
                                     "load), all, or a list such as 0-5,8"),
    Param("executable", "str", None, doc="vllm: the python of vLLM's own virtualenv (or its `vllm` command); default "
                                         "$STREAMCHAOS_VLLM_PYTHON, then `vllm` on PATH"),
))


@dataclass(frozen=True)
class SupportColumn:
    """One column of the fault-support matrix (``chaos.output.support``, docs/support.md): one way a kind
    is run, and what works there for each thing a fault needs (``client``, ``proxy``, ``admin``,
    ``engine-hooks``, ``pid``, ``gpu``, ``container``, ``cluster``: ``chaos.output.support.NEEDS_WORDS``);
    a need it does not name is ``no``. ``rank`` orders the columns (shipped ones 0-9)."""

    key: str
    title: str
    works: Mapping[str, str] = field(default_factory=dict)
    rank: int = 100


@dataclass(frozen=True)
class TargetStart:
    """What ``start_target`` hands a target kind's ``create`` besides the spec."""

    url: str | None  # target.url or --target-url: where the load goes
    run_dir: Path
    seed: int
    run_id: str = ""
    record: ResourceRecorder | None = None
    gate: Any = None  # chaos.k8s.gate.ClusterGate: the allow-list a Kubernetes target applies as it resolves


class Account(Protocol):
    """Where a kind's dry-run account goes (``chaos.execution.dryrun.DryRun``): its lines, the requests
    made, the exit code the run would likely end with, and the two reads a dry run may make."""

    contacted: list[str]

    def say(self, text: str = "", indent: int = 0) -> None: ...

    def worst(self, code: int) -> None: ...

    async def get(self, url: str, headers: dict[str, str]) -> Capped | str:
        """One recorded GET: the response, or why there is none."""

    async def preflight(self, exp: Experiment, base: str, model: str) -> None:
        """The load's request, once, as the run's preflight sends it, said and recorded."""


class Target(ABC):
    """One kind of system under test (class-level facts) and one run's instance of it (start, stop,
    and where possible restart).

    A kind is one module of ``chaos.targets`` (or of another distribution, named by an entry point of
    the group ``streamchaos.targets``) holding one subclass decorated ``@target_kind``; nothing else
    changes. Its facts, read by the loader, the dry run, the support matrix, `streamchaos list targets`
    and ``start_target`` from ``TARGET_KINDS``:

    - ``kind`` (the value of ``target.kind``), ``summary`` (one line), ``order`` (its place in lists),
      ``started_by_run`` (each run starts a fresh one: nothing to settle between capacity probes);
    - ``section``: the schema of ``target:`` for this kind: ``COMMON_SECTION`` plus its own keys;
    - ``support``: its column(s) in the fault-support matrix;
    - ``create(spec, start)``: the instance for one run; ``reached_by_url(spec)``: whether a URL stands
      in for it (the run then drives the server already running there, kind ``openai``);
    - ``startup_allowance_s(spec)``: how long ``start()`` may take;
    - ``dry_run(...)``: what ``streamchaos run --dry-run`` says of it, touching nothing.

    ``outlives_runner``: it keeps running if the runner is killed (a container), so the runner keeps
    a watchdog that rolls the run back (``chaos.execution.rollback``) when it dies.
    """

    kind: ClassVar[str]
    summary: ClassVar[str]
    section: ClassVar[Schema] = COMMON_SECTION
    support: ClassVar[tuple[SupportColumn, ...]] = ()
    order: ClassVar[int] = 100  # shipped kinds 0-9: a plug-in kind is listed after them
    started_by_run: ClassVar[bool] = False  # each run starts a fresh one (capacity probes need not let it settle)

    info: TargetInfo
    outlives_runner: bool = False

    # -- the kind ----------------------------------------------------------------------------------
    @classmethod
    def own_keys(cls) -> tuple[str, ...]:
        """The keys of ``target:`` only this kind (among those that declare them) takes."""
        common = set(COMMON_SECTION.names())
        return tuple(name for name in cls.section.names() if name not in common)

    @classmethod
    def reached_by_url(cls, spec: TargetSpec) -> bool:
        """Whether a URL (``target.url`` or --target-url) stands in for this kind: the run then drives the
        server already running there instead of making one. True unless the kind says otherwise."""
        return True

    @classmethod
    @abstractmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        """This kind's target for one run, not started yet; ``SetupFailed`` where it cannot be made here."""

    @classmethod
    def startup_allowance_s(cls, spec: TargetSpec) -> float | None:
        """How long ``start()`` may take before the run gives up; None where nothing is started."""
        return spec.startup_timeout

    @classmethod
    @abstractmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        """A dry run's account on ``out``: what the run would start or reach, its start-up allowance, and
        ``out.worst(4)`` where it could not here. Nothing is started; read-only requests only where
        ``probe``, through ``out``. The target as the run would have it, and whether the run would start
        its serving process itself (so would know its pid)."""

    # -- one run's instance ------------------------------------------------------------------------
    @abstractmethod
    async def start(self) -> TargetInfo:
        """Start it (or reach it) and say where everything is."""

    @abstractmethod
    async def stop(self) -> None:
        """Leave nothing of it running; idempotent."""

    async def restart(self) -> None:
        """Stop it and start it again where it was (a fault that kills it asks); ``SetupFailed`` where it cannot be."""
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


# kind -> class: every target kind ``@target_kind`` made known (``chaos.targets.registry.kinds`` imports
# each module of the package, and the ``streamchaos.targets`` entry points, first).
TARGET_KINDS: dict[str, type[Target]] = {}
_Kind = TypeVar("_Kind", bound=type[Target])


def target_kind(cls: _Kind) -> _Kind:
    """Class decorator: make a target kind known to experiments (``target.kind``), the dry run, the
    support matrix, `streamchaos list targets` and ``start_target``."""
    if cls.kind in TARGET_KINDS and TARGET_KINDS[cls.kind] is not cls:
        raise AssertionError(f"target kind {cls.kind!r} registered twice")
    TARGET_KINDS[cls.kind] = cls
    return cls


@target_kind
class BuiltinStack(Target):
    """`streamchaos stack serve` as a child process on an ephemeral loopback port; with ``tls: true`` it
    serves HTTPS with the run's certificate (``chaos.host.certs.certs_for_run``, whose CA this process
    then trusts), with ``http: 2`` HTTP/2 through Hypercorn (h2c without tls)."""

    kind = "builtin"
    summary = "this project's own engine and OpenAI-compatible server, started as a child process on a loopback port"
    order = 0
    started_by_run = True
    support = (SupportColumn("builtin", "builtin (started by the run)", {
        "client": "yes", "proxy": "yes", "admin": "yes", "engine-hooks": "yes", "pid": "yes", "gpu": "GPU host",
    }, rank=0),)
    section = Schema((*COMMON_SECTION.params, *BUILTIN_KEYS))

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        require_engine("target kind builtin")
        if builtin_http(spec) == "2":
            require_hypercorn("target.http: 2")
        return cls(spec, start.run_dir / "stack.log", start.seed, run_dir=start.run_dir)

    @classmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        spec = exp.target
        where = _builtin_url(spec)
        out.say(f"target: the builtin stack, started as a child process on {where} and stopped at the end "
                "(not started now)")
        try:  # without the engine extra the run would stop at once (exit 4)
            require_engine("the experiment's target (kind builtin)")
        except SetupFailed as exc:
            out.say(f"NOT POSSIBLE HERE: {exc}", 1)
            out.worst(4)
        out.say(f"model {spec.model}, device {spec.device}, kv_blocks {spec.kv_blocks} x {spec.block_size} tokens, "
                f"max_num_seqs {spec.max_num_seqs}, max_model_len {spec.max_model_len}, startup_timeout "
                f"{format_duration(spec.startup_timeout)}", 1)
        lo, hi = getattr(spec, "reasoning_tokens", (0, 0))
        if hi > 0:
            out.say(f"reasons first: a chat answer's first {lo if lo == hi else f'{lo}-{hi}'} tokens stream as "
                    "delta.reasoning_content", 1)
        _say_protocol(spec, out)
        return TargetInfo(kind="builtin", base_url=f"{where}/v1", metrics_url=f"{where}/metrics",
                          admin_url=f"{where}/admin", device=spec.device, model=spec.model), True

    def __init__(self, spec: TargetSpec, log_path: Path, seed: int, *, run_dir: Path | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        self.seed = seed
        self.run_dir = run_dir if run_dir is not None else log_path.parent  # where tls: true keeps the run's pair
        self.tls: CertPair | None = None
        self.process: StackProcess | None = None
        self.info = TargetInfo(kind="builtin", base_url="", model=spec.model)
        self._port = 0
        self._token: str | None = None

    def serve_args(self) -> list[str]:
        return serve_args(self.spec, self._port, self.seed, self.tls)

    async def start(self) -> TargetInfo:
        # spawned here, in the loop's thread, so it dies with us (chaos.host.children); its own session
        # keeps a Ctrl-C in the terminal from reaching it before the runner stops it in order
        if self._token is None:  # one per run, kept across a restart
            self._token = configured_admin_token(self.spec) or secrets.token_urlsafe(32)
            register_secret(self._token)  # never recorded or printed (chaos.host.redact)
        if builtin_tls(self.spec) and self.tls is None:
            from chaos.host.certs import certs_for_run

            # the run's one pair (a hop or gateway with tls: true shares it), its CA trusted from now on by
            # this process's clients: the readiness probe below, the scraper, the admin client, preflight
            self.tls = await asyncio.to_thread(certs_for_run, self.run_dir)
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


@target_kind
class RemoteTarget(Target):
    """An OpenAI-compatible server that is already running (vLLM, SGLang, TGI, a gateway): kind openai,
    and any kind a URL stands in for (``reached_by_url``)."""

    kind = "openai"
    summary = ("any OpenAI-compatible streaming server already running at target.url or --target-url (vLLM, "
               "SGLang, TGI, llama.cpp, a gateway); neither started nor stopped")
    order = 1
    support = (
        SupportColumn("builtin-remote", "builtin elsewhere (--target-url + admin token)", {
            "client": "yes", "proxy": "yes", "admin": "yes", "engine-hooks": "yes", "gpu": "GPU host",
        }, rank=1),
        SupportColumn("remote", "any other server (--target-url)", {
            "client": "yes", "proxy": "yes", "gpu": "GPU host",
        }, rank=3),
    )

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        if not start.url:
            raise SetupFailed(f"target kind {spec.kind!r} needs a URL: set target.url in the experiment or pass "
                              "--target-url")
        return cls(spec, start.url)

    @classmethod
    def startup_allowance_s(cls, spec: TargetSpec) -> float | None:
        return None  # already running: one GET /v1/models (10s) says whether it answers

    @classmethod
    async def dry_run(cls, exp: Experiment, url: str | None, probe: bool, out: Account) -> tuple[TargetInfo, bool]:
        spec = exp.target
        if not url:
            out.say(f"target: kind {spec.kind} needs a URL: set target.url in the experiment or pass --target-url")
            out.worst(4)
            return TargetInfo(kind=spec.kind, base_url="(none)", model=spec.model), False
        base = url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        root = base[: -len("/v1")]
        admin_token = configured_admin_token(spec)
        kind = "openai" if spec.kind == "builtin" else spec.kind
        info = TargetInfo(kind=kind, base_url=base, metrics_url=spec.metrics_url or root + "/metrics", model=spec.model,
                          admin_url=f"{root}/admin" if admin_token else None)
        out.say(f"target: {kind} server at {base} (already running; streamchaos neither starts nor stops it)")
        if not probe:
            out.say("not contacted: refused above", 1)
            return info, False
        headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
        answer = await out.get(base + "/models", headers)
        if isinstance(answer, str) or answer.status_code >= 400:
            out.say(f"DOES NOT ANSWER: GET {base}/models: "
                    f"{answer if isinstance(answer, str) else f'HTTP {answer.status_code}'}", 1)
            out.worst(4)
            return info, False
        served = _served(answer)
        model = spec.model if not served or spec.model in served else served[0]
        out.say(f"answers GET /v1/models: serves {', '.join(served) or '(no list)'}; requests will name model "
                f"{model!r}", 1)
        await out.preflight(exp, base, exp.load.model or model)
        out.say(f"metrics read from {info.metrics_url} (reading only)", 1)
        out.say("admin API: " + (f"{root}/admin, used for in-process faults only if the server proves it holds the "
                                 "configured token (not asked in a dry run)" if admin_token else
                                 "none configured (target.admin_token_file or STREAMCHAOS_ADMIN_TOKEN): in-process "
                                 "faults are off"), 1)
        return replace(info, model=model), False

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


def _served(response: Capped) -> list[str]:
    """The model ids a ``/v1/models`` answer lists (at most 16, each clipped); none where it is malformed."""
    try:
        return [clip(m["id"]) or "" for m in response.json().get("data", [])][:16]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def target_facts(info: TargetInfo) -> dict[str, Any]:
    """What the journal keeps about a target (never its credentials)."""
    facts = {
        "kind": info.kind, "base_url": info.base_url, "metrics_url": info.metrics_url, "admin_url": info.admin_url,
        "pid": info.pid, "device": info.device, "model": info.model, "metrics": bool(info.metrics_url),
    }
    if info.container_id:
        facts["container"] = info.container_id[:12]
    return facts
