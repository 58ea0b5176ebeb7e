"""A sampler polled in a worker thread while a run lasts: its samples to the run's sink, a failure
said once as a note (and polling stops), the task cancelled and awaited on every exit path. The GPU
telemetry and the host record are two of these."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable

from chaos.host.cadence import sleep_to_next_tick
from chaos.model.observations import MetricSample, Note

__all__ = ["MAX_SAMPLING_S", "polled"]

MAX_SAMPLING_S = 24 * 3600.0  # bounded like every loop here; a run's own max_duration is far lower


@contextlib.asynccontextmanager
async def polled(sample: Callable[[], Iterable[MetricSample]], sink: Callable[[MetricSample | Note], None], *,
                 period_s: float, name: str, errors: tuple[type[BaseException], ...],
                 in_thread: Callable[[], bool] = lambda: True) -> AsyncIterator[None]:
    """Call ``sample`` at once, then on every tick of ``period_s`` while entered; one of ``errors``
    becomes a ``{name}_error`` note and ends the polling. ``in_thread`` (asked before each call):
    call it in a worker thread, as a sample that may block or take long must be (a GPU driver);
    a quick one that cannot block is called on the loop, which costs no thread hand-off and no
    second wake-up of the loop for its result."""

    async def poll() -> None:
        deadline = time.monotonic() + MAX_SAMPLING_S
        while time.monotonic() < deadline:
            try:
                records = await asyncio.to_thread(lambda: list(sample())) if in_thread() else list(sample())
                for record in records:
                    sink(record)
            except errors as exc:
                sink(Note(topic=f"{name}_error", t=time.monotonic_ns(), data={"error": str(exc)}))
                return
            await sleep_to_next_tick(period_s)  # on the run's shared ticks (chaos.host.cadence)

    task = asyncio.create_task(poll(), name=name.replace("_", "-"))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
