"""Which target an experiment starts: the kind → factory registry ``TARGET_KINDS``, ``start_target``
and the resources ``running_target``/``started``. Above every kind's module (``base``, ``docker``,
``vllm``, ``kubernetes``), which import only ``base``: the targets have no import circle."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.model.errors import SetupFailed
from chaos.targets.base import BuiltinStack, RemoteTarget, ResourceRecorder, Target, require_engine

if TYPE_CHECKING:
    from chaos.model.experiment import TargetSpec

__all__ = ["TARGET_KINDS", "TargetFactory", "TargetStart", "running_target", "start_target", "started"]


@contextlib.asynccontextmanager
async def running_target(spec: TargetSpec, *, target_url: str | None, run_dir: Path, seed: int, run_id: str = "",
                         record: ResourceRecorder | None = None, gate: Any = None) -> AsyncIterator[Target]:
    """The system under test while entered: started (or reached), and stopped on every exit path.

    ``run_id`` and ``record`` (the journal's ``resource`` method) are for targets that create
    something outside this process (a container): it is labelled with the run and journaled, so
    ``streamchaos rollback`` can remove it after a crash. ``gate`` (a ``chaos.k8s.gate.ClusterGate``):
    the allow-list a Kubernetes target applies as it resolves itself.
    """
    target = start_target(spec, target_url=target_url, run_dir=run_dir, seed=seed, run_id=run_id, record=record,
                          gate=gate)
    async with started(target):
        yield target


@contextlib.asynccontextmanager
async def started(target: Target) -> AsyncIterator[Target]:
    """A target made by ``start_target``, started while entered and stopped on every exit path."""
    try:
        await target.start()
        yield target
    finally:
        with contextlib.suppress(Exception):  # a target that died meanwhile has nothing left to stop
            await target.stop()


@dataclass(frozen=True)
class TargetStart:
    """What ``start_target`` hands a target kind's factory besides the spec."""

    url: str | None  # target.url or --target-url: where the load goes
    run_dir: Path
    seed: int
    run_id: str = ""
    record: ResourceRecorder | None = None
    gate: Any = None


# A target kind's factory: the target the spec makes, or None where the spec makes no target of this
# kind here (a URL was given instead: the target is then remote). Each imports its kind lazily, so
# a run loads only the dependencies of the kind it starts (the Docker SDK, the Kubernetes client).
TargetFactory = Callable[["TargetSpec", TargetStart], "Target | None"]


def _builtin(spec: TargetSpec, start: TargetStart) -> Target | None:
    if start.url:
        return None
    require_engine("target kind builtin")
    return BuiltinStack(spec, start.run_dir / "stack.log", start.seed)


def _vllm(spec: TargetSpec, start: TargetStart) -> Target | None:
    if start.url:
        return None
    from chaos.targets.vllm import VllmTarget  # vLLM in its own virtualenv, under a process guard

    return VllmTarget(spec, run_dir=start.run_dir, seed=start.seed, record=start.record)


def _docker(spec: TargetSpec, start: TargetStart) -> Target | None:
    if start.url:
        return None
    from chaos.targets.docker import DockerTarget  # the Docker SDK only where a container runs

    return DockerTarget(spec, run_dir=start.run_dir, seed=start.seed, run_id=start.run_id, record=start.record)


def _kubernetes(spec: TargetSpec, start: TargetStart) -> Target | None:
    if spec.kubernetes is None:  # no cluster section: a URL it is
        return None
    from chaos.targets.kubernetes import KubernetesTarget  # a URL only overrides where the load goes

    return KubernetesTarget(spec, start.url, start.gate)


TARGET_KINDS: dict[str, TargetFactory] = {
    "builtin": _builtin,
    "vllm": _vllm,
    "docker": _docker,
    "kubernetes": _kubernetes,
}


def start_target(spec: TargetSpec, *, target_url: str | None, run_dir: Path, seed: int, run_id: str = "",
                 record: ResourceRecorder | None = None, gate: Any = None) -> Target:
    """The target the experiment names (``TARGET_KINDS[spec.kind]``); ``target_url`` (the CLI's
    --target-url) makes it remote."""
    start = TargetStart(target_url or spec.url, run_dir, seed, run_id, record, gate)
    factory = TARGET_KINDS.get(spec.kind)
    target = factory(spec, start) if factory is not None else None
    if target is not None:
        return target
    if start.url:
        return RemoteTarget(spec, start.url)
    raise SetupFailed(
        f"target kind {spec.kind!r} needs a URL: set target.url in the experiment or pass --target-url"
    )
