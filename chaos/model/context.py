"""What every layer of a run shares: the target, the proxy, the clients' rules, the safety settings.

A leaf module (it imports nothing of ours), so the load generator, the faults, the targets and the
runner can all speak these types without importing each other: a load worker process that
unpickles a ``ClientRule`` loads this module and ``chaos.load``, never ``faults``.

- ``TargetInfo`` / ``ProxyInfo``: the system under test and the Toxiproxy in front of it, as the
  runner brought them up; ``ClusterRef``: where a Kubernetes target's pods are (for ``k8s.*`` faults).
- ``SafetySpec``: the experiment's bounds (durations, GPU clock changes allowed or not, and
  ``AllowedTargets``: where beyond this host's loopback a run may act); ``Reach``: one thing a run
  or a fault acts on, as ``chaos.model.allowlist`` checks it.
- ``ClientPlan`` / ``ClientRule`` / ``ClientPolicy``: how each client behaves for one request; client
  faults install rules, the load generator draws a plan per request.
- ``BackgroundLoad``: streams a fault sends on its own (kv.pressure hog).
- ``RunContext``: all of the above for one run, handed to every fault activation.
- ``Scene`` / ``FaultAccount``: what a dry run knows without starting anything, and a fault's
  account against it of what it would change and how that is undone.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "AllowedTargets",
    "BackgroundLoad",
    "ClientPlan",
    "ClusterRef",
    "ClientPolicy",
    "ClientRule",
    "FaultAccount",
    "HaltSpec",
    "LeverSpec",
    "PromAlert",
    "HopInfo",
    "ProxyInfo",
    "Reach",
    "RunContext",
    "SafetySpec",
    "StopSource",
    "Scene",
    "TargetInfo",
]


@dataclass(frozen=True)
class ClusterRef:
    """Where a Kubernetes target lives: its namespace, the labels of its pods, and how to reach the
    API server (a kubeconfig file and context from configuration; None: the usual lookup)."""

    namespace: str
    selector: tuple[tuple[str, str], ...]  # matchLabels of the target's pods
    service: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    server: str = ""  # the API server URL configuration resolved (journaled, compared by rollback)
    # (Deployment, its pod template's labels as a selector) a k8s.scale names
    templates: tuple[tuple[str, str], ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.selector)


@dataclass(frozen=True)
class TargetInfo:
    """The system under test as the runner brought it up."""

    kind: str  # builtin | openai | vllm | docker | kubernetes
    base_url: str  # OpenAI API root the load generator uses *without* the proxy, e.g. http://127.0.0.1:P/v1
    metrics_url: str | None = None
    admin_url: str | None = None  # builtin stack only
    admin_token: str | None = field(default=None, repr=False)  # a secret: never printed
    pid: int | None = None  # the serving process, when the runner started it
    device: str = "cpu"  # where the engine runs: cpu | cuda:N
    model: str = ""
    container_id: str | None = None  # docker: the container the runner started (container faults act on it)
    cluster: ClusterRef | None = None  # kubernetes targets: the pods behind base_url


@dataclass(frozen=True)
class ProxyInfo:
    """The Toxiproxy proxy between load and target."""

    api_url: str  # e.g. http://127.0.0.1:8474
    proxy_name: str
    listen: str  # host:port the load generator connects to
    upstream: str  # host:port of the target
    server: str  # embedded | binary | docker | external
    supports_buffer: bool = False  # the non-standard `buffer` toxic (embedded server only)
    token: str | None = field(default=None, repr=False)  # the run's token of an embedded server: never printed


@dataclass(frozen=True)
class HopInfo:
    """One hop of the run's path as the runner brought it up (``path:``, load side first)."""

    name: str
    kind: str  # toxiproxy | stream | nginx | haproxy | caddy | litellm | url
    listen: str  # host:port the hop before it (or the load) connects to
    upstream: str  # the base URL it forwards to (the next hop's, or the target's); "" for a url hop (unknown)
    base_url: str = ""  # the OpenAI API root through this hop, e.g. http://127.0.0.1:P/v1
    control_url: str | None = None  # a stream hop: its control API (rules, status)
    control_token: str | None = field(default=None, repr=False)  # a secret: never printed
    pid: int | None = None  # the hop's process, when the runner started it
    version: str | None = None  # what the hop's binary says it is
    taps: bool = False  # a stream hop that records what it relays


@dataclass(frozen=True)
class AllowedTargets:
    """``safety.allowed_targets``: where beyond this host's loopback a run may act.

    Entries are kept as written (the loader checked their syntax); ``chaos.model.allowlist`` matches them.
    """

    # host names (``*.suffix``), IPs, CIDRs, host:port, or URLs (scheme, host, port, path prefix)
    hosts: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()  # Kubernetes namespaces (``*`` patterns)
    selectors: tuple[str, ...] = ()  # label selectors a cluster fault's own selector must imply


@dataclass(frozen=True)
class Reach:
    """One thing a run or a fault acts on, as the allow-list sees it: a URL, or a namespace (and selector)."""

    what: str  # for messages: "target", "proxy", "fault pod-kill (k8s.pod_kill)"
    url: str | None = None
    namespace: str | None = None  # a Kubernetes namespace: a cluster reach
    selector: str | None = None  # a label selector within the namespace (None: the whole namespace)
    namespace_only: bool = False  # the selector is not known yet (a Service not read yet): check the namespace alone


@dataclass(frozen=True)
class HaltSpec:
    """One live condition that stops a run early (``safety.halt_on``): see ``chaos.execution.halt``.

    ``kind``: ``error_share`` (failed streams' share over ``window`` above ``above``), ``ttft`` (the
    ``quantile`` of TTFT over ``window`` above ``above`` seconds), ``target_down`` (for ``window``
    seconds every stream that ended got no answer from the target: refused, reset, timed out; or every
    stream in flight got no byte from it for ``window`` seconds: a frozen target).
    """

    kind: str
    window: float = 5.0  # seconds of finished streams looked at
    above: float = 0.5  # a share (error_share) or seconds (ttft)
    quantile: float = 0.9  # ttft only
    min_streams: int = 10  # fewer finished streams in the window decide nothing
    name: str = ""  # how the halt reason calls it (defaults to the kind)


@dataclass(frozen=True)
class PromAlert:
    """One expression of a krkn alert profile (``safety.stop_when[].alerts``): it fires while the PromQL
    ``expr`` returns a series (or a non-zero scalar). ``severity``: ``critical`` halts the run and
    reverts its faults (and refuses to start it), ``error`` fails the run (a ``stop_when`` verdict),
    ``warning`` is recorded. ``description`` may hold ``{{$value}}`` and ``{{$labels.NAME}}``."""

    expr: str
    severity: str = "critical"  # critical | error | warning
    description: str = ""
    where: str = ""  # the key path it was read from (``safety.stop_when[0].alerts[1]``), for messages


@dataclass(frozen=True)
class StopSource:
    """One ``safety.stop_when`` entry: a signal of the fleet's own, read before the run starts and every
    ``every`` seconds while it runs (``chaos.fleet.stop_when``).

    ``source``: ``prometheus`` (``alerts`` evaluated as instant queries against ``url``) or
    ``alertmanager`` (an active, unsilenced alert matching every one of ``matchers`` halts).
    """

    source: str  # prometheus | alertmanager
    url: str  # the server's root (prometheus_url / alertmanager_url in the YAML)
    every: float = 5.0  # seconds between reads while the run runs
    alerts: tuple[PromAlert, ...] = ()  # prometheus
    matchers: tuple[str, ...] = ()  # alertmanager: label matchers, e.g. 'severity=~"critical|page"'
    bearer_token_env: str | None = None  # the variable holding a bearer token sent with each read
    timeout: float = 3.0  # seconds one read may take
    unreachable_halt: float = 30.0  # no answer for this long while the run runs halts it (0: never)
    name: str = ""  # how messages call it (defaults to the source)
    where: str = ""  # the key path it was read from (``safety.stop_when[0]``)


@dataclass(frozen=True)
class LeverSpec:
    """``safety.lever``: the fleet-wide stop switch (``chaos.fleet.lever``), checked before every run
    starts and every ``every`` seconds while it runs. The host file is always checked; a Kubernetes
    ConfigMap too when ``namespace`` is set."""

    file: str | None = None  # None: $STREAMCHAOS_LEVER_FILE, else chaos.fleet.lever.DEFAULT_FILE
    namespace: str | None = None  # the ConfigMap's namespace (Kubernetes game-days)
    configmap: str = "streamchaos-lever"
    kubeconfig: str | None = None  # the API server's kubeconfig and context (None: the usual lookup)
    context: str | None = None
    every: float = 1.0  # seconds between checks while the run runs


@dataclass(frozen=True)
class SafetySpec:
    """Bounds that keep a run from harming the machine or running forever."""

    max_duration: float = 600.0  # hard stop for the whole run, seconds
    drain_timeout: float = 10.0  # after the last phase: wait for in-flight streams
    cleanup_window: float = 2.0  # then keep scraping metrics this long (kv_cleanup)
    allow_gpu_clock_changes: bool = False
    scrape_interval: float = 0.2  # seconds, within [0.1, 1]
    allowed_targets: AllowedTargets | None = None  # None: loopback only, no cluster faults
    halt_on: tuple[HaltSpec, ...] = ()  # live conditions that stop the run early (chaos.execution.halt)
    halt_on_dead_target: bool = True  # the default condition: the first 20 streams all failed, or >= 95% over 2s
    min_fault_coverage: float = 0.9  # a fault in force for less of its phase's planned time is a run error
    stop_when: tuple[StopSource, ...] = ()  # the fleet's own signals: Prometheus expressions, Alertmanager alerts
    lever: LeverSpec = LeverSpec()  # the fleet-wide stop switch


@dataclass(frozen=True)
class ClientPlan:
    """How one client behaves for one request (client faults shape it)."""

    hangup_after_tokens: int | None = None
    hangup_after_s: float | None = None
    hangup_while_queued: bool = False  # hang up before the first byte arrives
    read_delay_s: float = 0.0  # pause before each network read
    read_rate_bps: float | None = None  # cap the client's read rate, bytes/s
    read_timeout_s: float | None = None  # asyncio read timeout per read
    faults: tuple[str, ...] = ()  # names of the faults that shaped this plan

    def merged(self, other: ClientPlan) -> ClientPlan:
        """Fields already set here win; ``other`` fills the rest."""
        updates: dict[str, Any] = {}
        default = ClientPlan()
        for f in fields(self):
            if f.name == "faults":
                continue
            if getattr(self, f.name) == getattr(default, f.name):
                updates[f.name] = getattr(other, f.name)
        return replace(self, **updates, faults=self.faults + other.faults)


class ClientRule(ABC):
    """A picklable rule a client fault installs while injected; drawn once per request."""

    fault: str

    @abstractmethod
    def draw(self, rng: random.Random) -> ClientPlan | None:
        """This request's plan, or None when the rule does not pick it (e.g. outside ``fraction``)."""


@dataclass
class ClientPolicy:
    """The client rules in force; the load generator asks it for each new request's plan."""

    rules: dict[str, ClientRule] = field(default_factory=dict)
    on_change: list[Callable[[dict[str, ClientRule]], None]] = field(default_factory=list)

    def install(self, rule: ClientRule) -> None:
        self.rules[rule.fault] = rule
        self._changed()

    def remove(self, fault: str) -> bool:
        removed = self.rules.pop(fault, None) is not None
        self._changed()
        return removed

    def plan(self, rng: random.Random) -> ClientPlan:
        plan = ClientPlan()
        for name in sorted(self.rules):
            drawn = self.rules[name].draw(rng)
            if drawn is not None:
                plan = plan.merged(drawn)
        return plan

    def _changed(self) -> None:
        for callback in self.on_change:
            callback(dict(self.rules))


class BackgroundLoad(Protocol):
    """Streams a fault sends on its own (kv.pressure hog), kept outside the SLA population."""

    async def start(self, fault: str, streams: int, prompt_chars: int, max_tokens: int,
                    settle_s: float = 0.0) -> int:
        """Open the fault's background streams; wait up to ``settle_s`` until every one has its first
        token (its prompt's KV blocks are held), and return how many have by then."""
        ...

    async def stop(self, fault: str) -> int:
        """Abort the fault's background streams; return how many were running."""
        ...


@dataclass
class RunContext:
    """One run's shared state, handed by the runner to every fault it activates.

    Mutable on purpose: ``target`` changes when the runner restarts it, ``phase`` and
    ``phase_duration_s`` as the timeline advances.
    """

    seed: int
    target: TargetInfo
    run_dir: Path
    safety: SafetySpec = SafetySpec()
    clients: ClientPolicy = field(default_factory=ClientPolicy)
    proxy: ProxyInfo | None = None
    hops: tuple[HopInfo, ...] = ()  # the path, load side first (the toxiproxy hop is ``proxy`` as well)
    background: BackgroundLoad | None = None
    phase: str = ""
    phase_duration_s: float | None = None  # of the current phase; None outside a timeline
    restart_target: Callable[[], Awaitable[None]] | None = None  # process.kill with restart

    def rng(self, fault_name: str) -> random.Random:
        """A generator seeded from the run's seed and the fault's name, so a run replays."""
        return random.Random(f"{self.seed}:{fault_name}")


@dataclass(frozen=True)
class Scene:
    """What a dry run knows of a run it does not carry out; faults describe themselves against it.

    ``target`` is the remote server as probed, or the builtin stack as it would be started (its URLs
    say so); ``proxy`` the Toxiproxy proxy as it would be created, or None without one.
    """

    target: TargetInfo
    proxy: ProxyInfo | None = None
    hops: tuple[HopInfo, ...] = ()  # the path as it would be started, load side first
    safety: SafetySpec = SafetySpec()
    target_spawned: bool = False  # the runner would start the serving process, so it would know its pid
    phase: str = ""
    phase_duration_s: float = 0.0


@dataclass(frozen=True)
class FaultAccount:
    """A fault's dry-run account: what inject would change, how revert (and rollback) undo it."""

    changes: str
    undo: str
    refused: str | None = None  # why activation would refuse it in this scene, when that is known
