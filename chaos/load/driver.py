"""What the runner and faults drive: the load driver, in this process, in worker processes or as
shards, chosen from ``load.workers`` and ``load.shards``. Above the three implementations, so none
of them imports another's driver code (the workers ↔ shards circle this replaced)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from chaos.load.generator import LoadGenerator
from chaos.load.workers import WorkerPool
from chaos.load.workload import LoadSpecLike, LoadTarget
from chaos.model.context import ClientPolicy
from chaos.model.errors import SetupFailed
from chaos.model.observations import Note, StreamRecord

if TYPE_CHECKING:
    from chaos.load.shard_pool import ShardPool

__all__ = ["LoadDriver", "make_load", "running_load"]


class LoadDriver(Protocol):
    """What the runner and faults drive: a ``LoadGenerator`` in this process or a ``WorkerPool``."""

    phase: str

    async def ready(self) -> None: ...
    async def run(self, deadline_ns: int) -> None: ...
    async def move_deadline(self, deadline_ns: int) -> None: ...
    async def drain(self, timeout: float) -> int: ...
    async def aclose(self) -> None: ...
    async def start(self, fault: str, streams: int, prompt_chars: int, max_tokens: int,
                    settle_s: float = 0.0) -> int: ...
    async def stop(self, fault: str) -> int: ...
    def lag_stats(self) -> dict[str, Any]: ...
    def send_delay_stats(self) -> dict[str, dict[str, Any]]: ...
    def stats(self) -> dict[str, Any]: ...


@contextlib.asynccontextmanager
async def running_load(
    spec: LoadSpecLike,
    target: LoadTarget,
    *,
    policy: ClientPolicy,
    sink: Callable[[StreamRecord], None],
    run_dir: Path | None = None,
    notes: Callable[[Note], None] | None = None,
    run_id: str = "",
    lifetime_s: float = 3600.0,
) -> AsyncIterator[LoadDriver]:
    """The load driver while entered; on exit every open stream is cancelled (recorded) and it closes.

    With ``load.shards`` above 1 it is a ``ShardPool`` (``chaos.load.shard_pool``): entering it waits
    for every shard to connect; ``run_dir`` holds their journal shards, ``notes`` hears how they
    were merged, ``lifetime_s`` bounds how long a shard may outlive a silent coordinator.
    """
    driver: LoadDriver
    pool: ShardPool | None = None
    if int(getattr(spec, "shards", 1)) > 1:
        if run_dir is None:
            raise SetupFailed("load.shards needs the run directory for the journal shards")
        driver = pool = _shard_pool(spec, target, policy=policy, sink=sink, run_dir=run_dir, notes=notes, run_id=run_id,
                                    lifetime_s=lifetime_s)
    else:
        driver = make_load(spec, target, policy=policy, sink=sink)
    try:
        if pool is not None:
            await pool.open()
        yield driver
    finally:
        with contextlib.suppress(Exception):
            await driver.drain(0.0)
        with contextlib.suppress(Exception):
            await driver.aclose()


def _shard_pool(spec: LoadSpecLike, target: LoadTarget, **kwargs: Any) -> ShardPool:
    from chaos.load.shard_pool import ShardPool  # the shard protocol only when a run asks for shards

    return ShardPool(spec, target, **kwargs)


def make_load(
    spec: LoadSpecLike, target: LoadTarget, *, policy: ClientPolicy, sink: Callable[[StreamRecord], None],
) -> LoadGenerator | WorkerPool:
    """A ``WorkerPool`` for ``workers`` above 1 or ``process: own`` (the experiment's default: the load
    in a process of its own on uvloop), a ``LoadGenerator`` on this loop for ``process: runner``."""
    if max(1, spec.workers) > 1 or getattr(spec, "process", "runner") == "own":
        return WorkerPool(spec, target, policy=policy, sink=sink)
    return LoadGenerator(spec, target, policy=policy, sink=sink)
