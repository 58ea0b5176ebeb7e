"""The typed, immutable experiment: what the loader builds and the runner reads."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from chaos.model.capacity import CapacitySpec
from chaos.model.context import (
    AllowedTargets,
    ClusterRef,
    FaultAccount,
    HaltSpec,
    Reach,
    RunContext,
    SafetySpec,
    Scene,
)
from chaos.model.observations import Observations
from chaos.model.turns import Turns
from chaos.model.units import format_duration
from chaos.model.verdict import Unobservable, Verdict


class Fault(Protocol):
    """What the experiment holds of a fault entry, and what the run asks of it. ``faults.base.Fault``
    is the one implementation; the model names only this face of it, so the experiment does not
    import the fault families (which read the experiment): no experiment ↔ faults circle."""

    kind: ClassVar[str]
    summary: ClassVar[str]
    rbac_rules: ClassVar[tuple[Any, ...]]  # chaos.k8s.rbac.Rule

    @property
    def name(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...
    def problems(self, experiment: Experiment) -> list[tuple[str, str]]: ...
    def streams_opened(self) -> int: ...
    def rbac(self) -> tuple[Any, ...]: ...
    def reach(self, experiment: Experiment) -> tuple[Reach, ...]: ...
    def cluster_reach(self, cluster: ClusterRef) -> tuple[Reach, ...]: ...
    def describe(self, scene: Scene) -> FaultAccount: ...
    def activate(self, ctx: RunContext) -> Any: ...  # a faults.base.Injection


class SlaCheck(Protocol):
    """What the experiment holds of an SLA entry: its typed budgets and how they judge a run.
    ``sla.base.SlaSpec`` is the one implementation; named here by this face only, as faults are."""

    kind: ClassVar[str]
    summary: ClassVar[str]
    # the kind's facts, which the run, the reports, budgets and capacity probes read (sla/base.py says each)
    timing: ClassVar[bool]
    better: ClassVar[Literal["lower", "higher"]]
    capacity_fit: ClassVar[bool]
    needs: ClassVar[tuple[Literal["kv_usage", "running", "end_of_stream"], ...]]
    sample_label: ClassVar[str | None]

    @property
    def params(self) -> dict[str, Any]: ...
    def judge(self, obs: Observations, phase: str | None) -> Verdict: ...
    def samples(self, obs: Observations, phase: str | None) -> list[float] | None: ...
    def budget_rule(self) -> Any: ...  # an sla.base.BudgetRule
    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None: ...
    def lateness_explains(self, verdict: Verdict, lag_s: float) -> bool: ...


__all__ = [
    "PROMPT_CLASSES",
    "AllowedTargets",
    "Experiment",
    "Fault",
    "FrozenMap",
    "HopSpec",
    "KubernetesSpec",
    "LoadSpec",
    "PhaseSpec",
    "PromptSpec",
    "ProxySpec",
    "SafetySpec",
    "SlaCheck",
    "SlaEntry",
    "TargetSpec",
    "WorkloadSpec",
]

# Character classes the synthetic prompt generator draws from (load.prompts.mix keys).
PROMPT_CLASSES: tuple[str, ...] = ("ascii", "cjk", "emoji")


class FrozenMap(Mapping[str, Any]):
    """A read-only, picklable mapping (``MappingProxyType`` cannot cross to worker processes)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data: dict[str, Any] = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._data) == dict(other)

    def __hash__(self) -> int:
        # Keys only: values may be unhashable (lists, dicts); equal maps still hash equal.
        return hash(frozenset(self._data))

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._data,))


@dataclass(frozen=True)
class KubernetesSpec:
    """``target.kubernetes``: the pods that serve the target, and how the load reaches them."""

    namespace: str | None = None  # default: the kubeconfig context's, the pod's own in a cluster, else default
    service: str | None = None  # its selector and port name the pods; or give selector (and port)
    selector: tuple[tuple[str, str], ...] = ()  # matchLabels, sorted by key
    port: int | str | None = None  # Service port (name or number); with a selector only, the container port
    access: str = "auto"  # auto | service | endpoints | port-forward
    kubeconfig: str | None = None  # default: $KUBECONFIG, ~/.kube/config, then the pod's service account
    context: str | None = None  # kubeconfig context; default: its current-context
    path: str = "/v1"  # the OpenAI API root on the pods


@dataclass(frozen=True)
class TargetSpec:
    """The system under test: the builtin stack, a server reached by URL, or a container streamchaos starts."""

    kind: str = "builtin"  # a registered target kind (chaos.targets.registry.kinds): builtin, openai, vllm, ...
    url: str | None = None  # OpenAI API root, e.g. http://host:8000/v1
    metrics_url: str | None = None  # Prometheus endpoint; default: <url without /v1>/metrics
    model: str = "tiny"  # builtin: tiny or a checkpoint dir; openai: the served model name
    device: str = "auto"
    kv_blocks: int = 512
    block_size: int = 16
    max_num_seqs: int = 64
    max_model_len: int = 1024
    prefix_caching: bool = True  # automatic prefix caching (vLLM's default); vllm: --no-enable-prefix-caching if off
    # builtin: a chat answer's first N tokens are reasoning (delta.reasoning_content), N drawn per request
    # in [lo, hi]; (0, 0): none (chaos.stack.reasoning)
    reasoning_tokens: tuple[int, int] = (0, 0)
    # builtin: serve TLS with the run's certificate (chaos.host.certs) and/or HTTP/2 (Hypercorn: h2 by ALPN
    # over TLS, h2c with prior knowledge without; HTTP/1.1 on the same port either way)
    tls: bool = False
    http: str = "1.1"
    startup_timeout: float = 60.0  # seconds
    api_key: str | None = field(default=None, repr=False)  # secrets: kept out of reprs and logs
    api_key_env: str | None = None  # the environment variable holding the API key (read at run time)
    metrics_auth: str = "api_key"  # api_key (the target's key) | none | env:NAME | file:PATH (a bearer token)
    engine: str = "auto"  # an engine profile (chaos.model.engines) or auto: detected at warm-up
    admin_token: str | None = field(default=None, repr=False)
    admin_token_file: str | None = None  # a 0600 file holding the token (beside STREAMCHAOS_ADMIN_TOKEN)
    extra_args: tuple[str, ...] = ()
    executable: str | None = None  # vllm: the vLLM virtualenv's python (or its `vllm` command)
    cpus: str = "auto"  # vllm: auto | all | a CPU list such as 0-5,8 (chaos.host.cpuset)
    # docker: the image to run (none: the builtin stack from this host's Python, chaos.targets.host_image)
    image: str | None = None
    command: tuple[str, ...] = ()  # the image's command (arguments after its entrypoint)
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # (NAME, value), sorted; may hold secrets
    network: str = "host"  # host | bridge (the port published on 127.0.0.1)
    port: int | None = None  # where the server listens in the container; image default 8000, builtin: a free one
    volumes: tuple[str, ...] = ()  # HOST:CONTAINER[:ro|rw], read-only unless :rw
    hardening: str = "default"  # docker image targets: default (caps dropped, no-new-privileges) | none
    gpus: str | None = None  # all | N | device=0,1 (as `docker run --gpus`)
    kubernetes: KubernetesSpec | None = None  # kind kubernetes: where the pods are
    # a plug-in kind's own keys (its ``section``) that have no field above: (name, value), values made hashable
    options: tuple[tuple[str, Any], ...] = ()

    def option(self, name: str, default: Any = None) -> Any:
        """The value of a plug-in kind's own key (``options``); ``default`` where it has none."""
        return dict(self.options).get(name, default)


@dataclass(frozen=True)
class ProxySpec:
    """Toxiproxy between load and target (network faults need it)."""

    enabled: bool = False  # a `proxy:` section turns it on unless it says enabled: false
    server: str = "auto"  # auto | embedded | binary | docker | external
    url: str | None = None  # Toxiproxy API URL (server external/auto; TOXIPROXY_URL also counts)
    name: str = "streamchaos"
    listen: str = "127.0.0.1:0"  # host:port; a wildcard host means "reach it at the API URL's host"


@dataclass(frozen=True)
class HopSpec:
    """One hop of ``path:``, between the load (before the first hop) and the target (after the last).

    kinds: ``toxiproxy`` (the network faults' proxy; ``proxy`` holds its settings), ``stream`` (the
    embedded SSE-aware proxy that stream faults act on and that taps what it relays), the gateways the
    run starts itself (``nginx``, ``haproxy``, ``caddy``, ``litellm``), and ``url`` (a gateway the user
    already runs, reached at ``url``; what it forwards to is the user's business).
    """

    kind: str
    name: str  # unique in the path; the kind when not given (``stream-2`` for a second one)
    config: str | None = None  # a gateway: the absolute path of the user's configuration (replaces the shipped one)
    url: str | None = None  # kind url: the gateway's base URL (e.g. http://127.0.0.1:8080/v1)
    tap: bool = True  # a stream hop: record what it received and forwarded, per request
    # a gateway's knobs for the shipped configuration (read_timeout, gzip, buffering, ...): (name, value)
    options: tuple[tuple[str, Any], ...] = ()
    proxy: ProxySpec | None = None  # kind toxiproxy: its settings

    def option(self, name: str, default: Any = None) -> Any:
        """A gateway knob's value; ``default`` where the hop does not set it."""
        return dict(self.options).get(name, default)


@dataclass(frozen=True)
class PromptSpec:
    """Where prompts come from: synthetic text of a character mix, or a JSONL file."""

    source: str = "synthetic"  # synthetic | absolute path of a JSONL file
    min_chars: int = 16
    max_chars: int = 128
    mix: tuple[tuple[str, float], ...] = (("ascii", 0.7), ("cjk", 0.2), ("emoji", 0.1))


@dataclass(frozen=True)
class WorkloadSpec:
    """``load.workload``: what the requests are (docs/workloads.md). Each kind reads its own fields only."""

    kind: str = "single"  # single | sessions | shared_prefix | trace
    # sessions: turns per session (low, high; seeded per session), the user's pause after a reply ends
    # before the next turn (seconds, low, high), what a cut turn does (resume: resend it; end: a new
    # session) and a shared system message's length in characters (0: none)
    turns: tuple[int, int] = (4, 4)
    think_time: tuple[float, float] = (0.0, 0.0)
    on_cut: str = "resume"
    system_chars: int = 0
    # shared_prefix: P prefixes of L tokens (prefix_tokens, with the target's tokenizer) or characters
    # (prefix_chars), each request one of them (seeded) and a suffix of its own
    prefixes: int = 4
    prefix_tokens: int | None = None
    prefix_chars: int | None = None
    suffix_chars: tuple[int, int] = (16, 64)
    # trace: an absolute path, its layout, a speed factor (timestamps divided by it), the token block
    # equal hash_ids stand for, and ShareGPT answers' cap in tokens
    path: str | None = None
    layout: str = "mooncake"  # mooncake | sharegpt
    speed: float = 1.0
    block_tokens: int = 512
    max_output_tokens: int = 1024
    # whose tokenizer the load counts and makes prompts with: (target kind, target model); None: none
    # known (lengths in characters). Set by the loader from the target, not written by users.
    tokenizer: tuple[str, str] | None = None
    # the target's context in tokens where the experiment says it (builtin): a replayed conversation stops
    # before a turn that cannot fit. Set by the loader.
    context_tokens: int | None = None


@dataclass(frozen=True)
class HttpSpec:
    """``load.http``: the protocol the load client speaks (chaos.load.http1 / chaos.load.http2)."""

    version: str = "1.1"  # 1.1 | 2 (h2 over TLS by ALPN, h2c with prior knowledge over http://) | auto (ALPN decides)
    streams_per_connection: int = 100  # HTTP/2: streams one connection carries at once (the server's limit caps it)
    window: int = 65_535  # HTTP/2: each stream's receive window in bytes (SETTINGS_INITIAL_WINDOW_SIZE)
    # HTTP/1.1: auto (reuse connections unless the server closes them after a streamed response: the
    # preflight's keep-alive probe, chaos.load.keepalive) | on (reuse what the server leaves open) | off
    keep_alive: str = "auto"


@dataclass(frozen=True)
class LoadSpec:
    """The streaming load: closed loop (concurrency) or open loop (rate), and request shape."""

    endpoint: str = "completions"  # completions | chat
    model: str | None = None  # request's "model"; default: the target's
    concurrency: int | None = None  # closed loop; 4 when neither concurrency nor rate is given
    rate: float | None = None  # open loop, requests/s
    burstiness: float = 1.0  # Gamma shape of inter-arrival times; 1 = Poisson
    max_requests: int | None = None
    max_tokens: tuple[int, int] = (32, 32)
    temperature: float = 0.0
    ignore_eos: bool = True
    include_usage: bool = True
    request_timeout: float = 30.0  # seconds
    workers: int = 1
    # own: the generator in a process of its own on uvloop, even with one worker, where nothing of
    # the runner's (journal writes, progress, scrapes) shares its loop; runner: on the runner's loop
    process: str = "own"
    lag_threshold: float = 0.020  # seconds; see sections.py for why not 5ms
    prompts: PromptSpec = PromptSpec()
    shards: int = 1  # >1: the load is split across that many generator shards (chaos.load.shard_pool)
    shard_launch: str = "local"  # local: started by the runner | external: started elsewhere (pods)
    shard_listen: str = "127.0.0.1:0"  # where the coordinator listens for its shards
    shard_connect_timeout: float = 60.0  # seconds to wait for every shard to connect
    headers: tuple[tuple[str, str | None], ...] = ()  # over the SDK's defaults (chaos.load.sdk_headers); None: not sent
    # each request's own X-Request-Id: uuid (UUID-shaped, with the run's tag: chaos.model.request_ids) | sequence
    # (its record id, "0-17"); a load.headers entry for X-Request-Id replaces either
    request_ids: str = "uuid"
    # a closed-loop client's wait while nothing serves (a connect error, a 502/503/504, no response:
    # chaos.load.backoff): (initial s, max s, multiplier), the OpenAI SDK's by default; None
    # (``connect_backoff: off``): a fixed 50 ms pause after a connect error only
    connect_backoff: tuple[float, float, float] | None = (0.5, 8.0, 2.0)
    workload: WorkloadSpec = WorkloadSpec()  # what the requests are (load.workload)
    # passed through into chat request bodies: OpenAI tool definitions, tool_choice (auto | required |
    # none | {"type": "function", "function": {"name": ...}}), and reasoning false →
    # chat_template_kwargs.enable_thinking false (None: not sent)
    tools: tuple[FrozenMap, ...] = ()
    tool_choice: str | FrozenMap | None = None
    reasoning: bool | None = None
    http: HttpSpec = HttpSpec()

    def __post_init__(self) -> None:
        # One place for the default, so LoadSpec() and a YAML without load: agree. A Mooncake trace's
        # timestamps are its schedule: neither a concurrency nor a rate unless given (a concurrency then
        # bounds the streams in flight)
        timed = self.workload.kind == "trace" and self.workload.layout == "mooncake"
        if self.concurrency is None and self.rate is None and not timed:
            object.__setattr__(self, "concurrency", 4)


@dataclass(frozen=True)
class PhaseSpec:
    """One stretch of the timeline and the faults in force during it."""

    name: str
    duration: float  # seconds; a phase that runs until decided: its planned minimum
    faults: tuple[Fault, ...] = ()
    # seconds: the phase runs until every verdict judged on it is decided, from ``duration`` up to this
    # (``duration: {min, max}`` or ``until: decided``; chaos.execution.sequential); None: a fixed length
    max_duration: float | None = None

    @property
    def longest(self) -> float:
        """The most this phase may last, in seconds: ``max_duration``, else its fixed ``duration``."""
        return self.duration if self.max_duration is None else self.max_duration

    def length_text(self) -> str:
        """Its planned length as people read it: ``8s``, or ``4s–60s until decided``."""
        if self.max_duration is None:
            return format_duration(self.duration)
        return f"{format_duration(self.duration)}–{format_duration(self.max_duration)} until decided"


@dataclass(frozen=True)
class SlaEntry:
    """One verifier entry: its typed budgets, optional phase scope, expected outcome."""

    name: str  # defaults to kind; unique
    spec: SlaCheck  # the kind's frozen spec (sla.base.SlaSpec): its fields are the parsed budgets
    phases: tuple[str, ...] | None = None  # None = whole run; else one verdict per listed phase
    expect: Literal["pass", "fail"] = "pass"
    turns: Turns | None = None  # `turns:`: only these turns of the conversations are judged (None: every stream)
    when_unobservable: Unobservable = "tolerate"  # how a verdict whose evidence cannot exist here counts

    @property
    def kind(self) -> str:
        """A key of sla.base.REGISTRY."""
        return self.spec.kind

    @property
    def params(self) -> Mapping[str, Any]:
        """The budgets as a mapping, parsed (base units): for reports, proposals and messages."""
        return FrozenMap(self.spec.params)


@dataclass(frozen=True)
class Experiment:
    """A whole experiment, validated: every unit parsed, every kind resolved."""

    name: str
    description: str = ""
    seed: int = 0
    target: TargetSpec = TargetSpec()
    proxy: ProxySpec = ProxySpec()
    # the hops between load and target, load side first; a toxiproxy hop's settings are ``proxy`` too
    # (the old `proxy:` section is a path of one toxiproxy hop)
    path: tuple[HopSpec, ...] = ()
    load: LoadSpec = LoadSpec()
    phases: tuple[PhaseSpec, ...] = ()
    sla: tuple[SlaEntry, ...] = ()
    safety: SafetySpec = SafetySpec()
    capacity: CapacitySpec | None = None  # `capacity:`: what `streamchaos capacity` searches
    source: str | None = None  # file path it came from
    # the YAML it was validated from (a dict's, dumped): what the run keeps as experiment.yaml for
    # `verify`; out of reprs (it may hold a literal api_key) and of equality (same experiment, any spelling)
    text: str | None = field(default=None, repr=False, compare=False)

    @property
    def duration(self) -> float:
        """Sum of the phase durations, seconds (a phase that runs until decided: its minimum)."""
        return sum(p.duration for p in self.phases)

    @property
    def longest(self) -> float:
        """Sum of the most each phase may last, seconds (``PhaseSpec.longest``)."""
        return sum(p.longest for p in self.phases)

    def hop(self, name: str) -> HopSpec | None:
        """The hop of ``path`` called ``name``; None when there is none."""
        return next((h for h in self.path if h.name == name), None)

    def phase(self, name: str) -> PhaseSpec:
        """The phase called ``name`` (KeyError when there is none)."""
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)

    def faults(self) -> Iterator[tuple[PhaseSpec, Fault]]:
        """Every fault instance with the phase it belongs to, in timeline order."""
        for p in self.phases:
            for f in p.faults:
                yield p, f
