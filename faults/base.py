"""What every fault is: a frozen spec with typed parameters, activated once per run into an Injection.

A fault family is one module that defines ``Fault`` subclasses and decorates each with
``@register``; nothing else changes when a fault is added. A ``Fault`` is the experiment's entry
as data: a frozen, keyword-only dataclass whose fields are the kind's parameters (parsed by its
``schema``, in base units), so an ``Experiment`` holding it can be run any number of times, even
concurrently. Everything that belongs to one run lives in the ``Injection`` that
``Fault.activate(ctx)`` returns. The runner drives it as

    injection = fault.activate(ctx)        before the run: can it act here? (FaultUnsupported otherwise)
    undo = injection.plan()                journal: what will change and how to undo it (fsync'd)
    evidence = await injection.inject()    journal: proof that it took effect
    evidence = await injection.revert()    journal: what was undone (idempotent)

and ``Fault.rollback(undo)`` (a classmethod, synchronous, idempotent) undoes a ``plan`` record in
another process after the runner was killed: ``streamchaos rollback RUN_DIR`` calls it for every
plan without a matching revert.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

from chaos.model.context import ClusterRef, FaultAccount, Reach, RunContext, Scene
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import IN_FLIGHT
from chaos.model.params import Schema

if TYPE_CHECKING:
    from chaos.k8s.rbac import Rule
    from chaos.model.experiment import Experiment

__all__ = ["REGISTRY", "Fault", "Injection", "register"]


@dataclass(frozen=True, kw_only=True)
class Fault(ABC):
    """One fault entry of an experiment: its name and its parsed parameters, nothing of any run."""

    kind: ClassVar[str]
    summary: ClassVar[str]
    schema: ClassVar[Schema] = Schema()
    rbac_rules: ClassVar[tuple[Rule, ...]] = ()  # what it calls on the Kubernetes API (`streamchaos manifests rbac`)
    # whom it can touch: every stream alive while it is in force (IN_FLIGHT), or only the streams sent in
    # its own phase (PHASE_SCOPE); the runner writes it on the plan event, and a stream is judged in the
    # phase of the fault that touched it (``Observations.population``)
    scope: ClassVar[str] = IN_FLIGHT
    # the protocols of the load's streams it acts on (docs/support.md's protocol column): most act on both;
    # HTTP/2's own frames (``h2.*``) need a stream hop that speaks HTTP/2 to the load
    protocols: ClassVar[tuple[str, ...]] = ("http/1.1", "h2")

    name: str

    @classmethod
    def from_params(cls, name: str, params: Mapping[str, Any]) -> Self:
        """The spec from values its schema already parsed (every parameter present, defaults filled)."""
        return cls(name=name, **{k: tuple(v) if isinstance(v, list) else v for k, v in params.items()})

    @classmethod
    def parse(cls, name: str, raw: Mapping[str, Any]) -> Self:
        """The spec from raw YAML values (``latency: 100ms``); ``ExperimentInvalid`` when they are wrong."""
        values, problems = cls.schema.parse(raw)
        if problems:
            raise ExperimentInvalid("; ".join(f"{cls.kind}{'.' + key if key else ''}: {message}"
                                              for key, message in problems))
        return cls.from_params(name, values)

    @property
    def params(self) -> dict[str, Any]:
        """The parameters as a mapping (for reports and messages)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        """Cross-section checks at load time, as ``(key, message)``; ``experiment`` is the parsed one."""
        return []

    def streams_opened(self) -> int:
        """Streams the fault opens beside the load's own while in force (background streams): what
        the run's open-file limit must allow for (``chaos.host.fd_limit``)."""
        return 0

    def rbac(self) -> tuple[Rule, ...]:
        """The RBAC rules this fault, as configured, calls (its kind's ``rbac_rules``; a kind acting on one
        named object limits them to it)."""
        return self.rbac_rules

    def reach(self, experiment: Experiment) -> tuple[Reach, ...]:
        """What this fault acts on beyond the run's own target and proxy (a Kubernetes namespace and
        selector, another host), for ``safety.allowed_targets``; checked before anything starts."""
        return ()

    def cluster_reach(self, cluster: ClusterRef) -> tuple[Reach, ...]:
        """What this fault acts on in a Kubernetes target's cluster, once the target is resolved (a
        namespace and a pod selector), for ``safety.allowed_targets``; checked before any fault acts."""
        return ()

    def describe(self, scene: Scene) -> FaultAccount:
        """A dry run's account of this fault (pure: nothing is contacted); kinds give a sharper one."""
        # overridden or not: a bound classmethod's __func__, which mypy's callable type does not show
        rolled_back = type(self).rollback.__func__ is not Fault.rollback.__func__  # type: ignore[attr-defined]
        return FaultAccount(
            changes=f"{self.summary} ({self.schema.format(self.params) or 'no parameters'})",
            undo="reverted when the phase ends" + ("; `streamchaos rollback` undoes it after a crash" if rolled_back
                                                   else "; nothing of it outlives the run"),
        )

    @abstractmethod
    def activate(self, ctx: RunContext) -> Injection:
        """This fault for one run; raise ``FaultUnsupported``/``FaultPermissionDenied`` when it cannot act
        in ``ctx``."""

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        """Undo a ``plan`` record from another process after a crash; idempotent."""
        return {"skipped": "nothing outlives the run for this kind"}


class Injection(ABC):
    """One fault acting in one run: owns that run's state and knows how to undo it.

    ``outlives_runner``: what it changes survives the runner's death (GPU clocks, a stopped
    process), so the runner keeps a watchdog while it is active. ``step_timeout_s``: how long the
    runner lets one inject or revert take before it gives up on it (a restart of vLLM takes longer).
    """

    outlives_runner: ClassVar[bool] = False
    step_timeout_s: float = 20.0  # one inject or revert may not hold the run hostage

    def __init__(self, fault: Fault, ctx: RunContext) -> None:
        self.fault = fault
        self.ctx = ctx

    @property
    def name(self) -> str:
        return self.fault.name

    @property
    def kind(self) -> str:
        return self.fault.kind

    def plan(self) -> dict[str, Any]:
        """What ``inject`` will change and how to undo it, as JSON data for ``rollback``."""
        return {}

    @abstractmethod
    async def inject(self) -> dict[str, Any]:
        """Apply the fault; return evidence that it took effect (an ``undo`` key adds to the plan's)."""

    @abstractmethod
    async def revert(self) -> dict[str, Any]:
        """Undo the fault; idempotent; return what was undone."""

    def scheduled(self) -> asyncio.Future[Any] | None:
        """What ``inject`` left to do later in the phase (an action at ``at``), if anything: the runner
        reports its failure when it happens, as the fault's, and ends the run with it."""
        return None


REGISTRY: dict[str, type[Fault]] = {}
_FaultType = TypeVar("_FaultType", bound=type[Fault])


def register(cls: _FaultType) -> _FaultType:
    """Class decorator: make a fault kind known to experiments, `streamchaos list` and rollback."""
    if cls.kind in REGISTRY and REGISTRY[cls.kind] is not cls:
        raise AssertionError(f"fault kind {cls.kind!r} registered twice")
    REGISTRY[cls.kind] = cls
    return cls
