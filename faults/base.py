"""What every fault is: a kind with a parameter schema, a symmetric inject/revert, an offline rollback.

A fault family is one module that defines ``Fault`` subclasses and decorates each with
``@register``; nothing else changes when a fault is added. The runner drives each fault as

    fault.check(env)                      before the run: can it act here? (FaultUnsupported otherwise)
    undo = fault.plan(env)                journal: what will change and how to undo it (fsync'd)
    evidence = await fault.inject(env)    journal: proof that it took effect
    evidence = await fault.revert(env)    journal: what was undone (idempotent)

and ``Fault.rollback(undo)`` (a classmethod, synchronous, idempotent) undoes a ``plan`` record in
another process after the runner was killed: ``streamchaos rollback RUN_DIR`` calls it for every
plan without a matching revert.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol

from chaos.params import Schema

__all__ = [
    "REGISTRY",
    "BackgroundLoad",
    "ClientPlan",
    "ClientPolicy",
    "ClientRule",
    "Fault",
    "FaultEnv",
    "ProxyInfo",
    "TargetInfo",
    "register",
]


@dataclass(frozen=True)
class TargetInfo:
    """The system under test as the runner brought it up."""

    kind: str  # builtin | openai | vllm | docker | kubernetes
    base_url: str  # OpenAI API root the load generator uses *without* the proxy, e.g. http://127.0.0.1:P/v1
    metrics_url: str | None = None
    admin_url: str | None = None  # builtin stack only
    admin_token: str | None = field(default=None, repr=False)  # a secret: kept out of reprs, logs and the journal
    pid: int | None = None  # the serving process, when the runner started it
    device: str = "cpu"  # where the engine runs: cpu | cuda:N
    model: str = ""


@dataclass(frozen=True)
class ProxyInfo:
    """The Toxiproxy proxy between load and target."""

    api_url: str  # e.g. http://127.0.0.1:8474
    proxy_name: str
    listen: str  # host:port the load generator connects to
    upstream: str  # host:port of the target
    server: str  # embedded | binary | docker | external
    supports_buffer: bool = False  # the non-standard `buffer` toxic (embedded server only)


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

    async def start(self, fault: str, streams: int, prompt_chars: int, max_tokens: int) -> None: ...

    async def stop(self, fault: str) -> int:
        """Abort the fault's background streams; return how many were running."""
        ...


@dataclass
class FaultEnv:
    """What a fault may act on, handed to it by the runner."""

    seed: int
    target: TargetInfo
    run_dir: Path
    clients: ClientPolicy = field(default_factory=ClientPolicy)
    proxy: ProxyInfo | None = None
    background: BackgroundLoad | None = None
    phase: str = ""
    restart_target: Callable[[], Awaitable[None]] | None = None  # process.kill with restart
    extras: dict[str, Any] = field(default_factory=dict)

    def rng(self, fault_name: str) -> random.Random:
        """A generator seeded from the run's seed and the fault's name, so a run replays."""
        return random.Random(f"{self.seed}:{fault_name}")


class Fault(ABC):
    """One fault entry of an experiment, parsed and ready to act."""

    kind: ClassVar[str]
    summary: ClassVar[str]
    schema: ClassVar[Schema] = Schema()

    def __init__(self, name: str, params: Mapping[str, Any]) -> None:
        self.name = name
        self.params = dict(params)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.params!r})"

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        """Cross-section checks at load time, as ``(key, message)``; ``experiment`` is the parsed one."""
        return []

    def check(self, env: FaultEnv) -> None:
        """Raise ``FaultUnsupported``/``FaultPermissionDenied`` when it cannot act in ``env``."""

    def plan(self, env: FaultEnv) -> dict[str, Any]:
        """What ``inject`` will change and how to undo it, as JSON data for ``rollback``."""
        return {}

    @abstractmethod
    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        """Apply the fault; return evidence that it took effect."""

    @abstractmethod
    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        """Undo the fault; idempotent; return what was undone."""

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        """Undo a ``plan`` record from another process after a crash; idempotent."""
        return {"skipped": "nothing outlives the run for this kind"}


REGISTRY: dict[str, type[Fault]] = {}


def register(cls: type[Fault]) -> type[Fault]:
    """Class decorator: make a fault kind known to experiments, `streamchaos list` and rollback."""
    if cls.kind in REGISTRY and REGISTRY[cls.kind] is not cls:
        raise AssertionError(f"fault kind {cls.kind!r} registered twice")
    REGISTRY[cls.kind] = cls
    return cls
