"""A sampler polled in a worker thread while a run lasts: its samples to the run's sink, a failure
said once as a note (and polling stops), the task cancelled and awaited on every exit path. The GPU
telemetry and the host record are two of these."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable

from chaos.model.observations import MetricSample, Note

__all__ = ["MAX_SAMPLING_S", "polled"]

MAX_SAMPLING_S = 24 * 3600.0  # bounded like every loop here; a run's own max_duration is far lower


@contextlib.asynccontextmanager
async def polled(sample: Callable[[], Iterable[MetricSample]], sink: Callable[[MetricSample | Note], None], *,
                 period_s: float, name: str, errors: tuple[type[BaseException], ...]) -> AsyncIterator[None]:
    """Call ``sample`` (in a thread: it may block on a driver or /proc) every ``period_s`` while
    entered; one of ``errors`` becomes a ``{name}_error`` note and ends the polling."""

    async def poll() -> None:
        deadline = time.monotonic() + MAX_SAMPLING_S
        while time.monotonic() < deadline:
            try:
                for record in await asyncio.to_thread(lambda: list(sample())):
                    sink(record)
            except errors as exc:
                sink(Note(topic=f"{name}_error", t=time.monotonic_ns(), data={"error": str(exc)}))
                return
            await asyncio.sleep(period_s)

    task = asyncio.create_task(poll(), name=name.replace("_", "-"))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
