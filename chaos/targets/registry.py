"""Which target an experiment starts: every kind found (``kinds``), the class a spec makes
(``target_class``), ``start_target`` and the resources ``running_target``/``started``; the schema of
``target:`` drawn from the kinds (``target_schema``).

A kind is found without naming it anywhere: ``kinds`` imports every module of this package (each
``@target_kind`` registers its class in ``chaos.targets.base.TARGET_KINDS``) and every entry point of
the group ``streamchaos.targets`` (a distribution's own kinds). Each kind's module imports its heavy
dependencies (the Docker SDK, the Kubernetes client, vLLM) only where a target of it is made.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import AsyncIterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.model.errors import SetupFailed
from chaos.model.params import Param, Schema
from chaos.targets.base import COMMON_SECTION, TARGET_KINDS, RemoteTarget, ResourceRecorder, Target, TargetStart

if TYPE_CHECKING:
    from chaos.model.experiment import TargetSpec

__all__ = [
    "ENTRY_POINT_GROUP", "TargetStart", "kinds", "running_target", "start_target", "started", "target_class",
    "target_schema",
]

ENTRY_POINT_GROUP = "streamchaos.targets"
_found = False


def kinds() -> dict[str, type[Target]]:
    """Every target kind, in list order (``order``, then name): the package's modules and the entry
    points imported once, then whatever ``@target_kind`` registered (a test's throwaway kind too)."""
    global _found
    if not _found:
        # this package's modules, found by path: importing chaos.targets here would be an import circle
        for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
            importlib.import_module(f"{__package__}.{module.name}")
        for point in entry_points(group=ENTRY_POINT_GROUP):
            point.load()
        _found = True
    return dict(sorted(TARGET_KINDS.items(), key=lambda item: (item[1].order, item[0])))


def target_schema() -> Schema:
    """The schema of ``target:``: ``kind`` (one of the kinds), the keys every kind takes, then each
    kind's own, in list order. Which of them a given kind takes is its ``section``."""
    found = kinds()
    params = {p.name: p for p in COMMON_SECTION.params}
    for cls in found.values():
        for param in cls.section.params:
            params.setdefault(param.name, param)
    kind = Param("kind", "choice", "builtin", choices=tuple(found), doc="which system under test")
    return Schema((kind, *params.values()))


def target_class(spec: TargetSpec, url: str | None) -> type[Target]:
    """The class that makes ``spec``'s target when ``url`` (target.url or --target-url) is given or not:
    the kind's own, or the remote server's where a URL stands in for it. The run and the dry run ask
    this same question, so they cannot disagree."""
    cls = kinds().get(spec.kind)
    if cls is None:
        raise SetupFailed(f"target kind {spec.kind!r} is not known here; known: {', '.join(kinds())}")
    return RemoteTarget if url and cls.reached_by_url(spec) else cls


def start_target(spec: TargetSpec, *, target_url: str | None, run_dir: Path, seed: int, run_id: str = "",
                 record: ResourceRecorder | None = None, gate: Any = None) -> Target:
    """The target the experiment names (not started); ``target_url`` (the CLI's --target-url) makes it remote."""
    start = TargetStart(target_url or spec.url, run_dir, seed, run_id, record, gate)
    return target_class(spec, start.url).create(spec, start)


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
