"""Self-calibration: how late the load generator's own event loop wakes up.

A task sleeps ``interval`` again and again and records how much later than asked it woke. When the
generator is saturated (too many events per second for one process) every stamp it takes is late
by about this much, so a p99 above the threshold marks the run's latency verdicts inconclusive.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

__all__ = ["LagMonitor", "delay_summary", "lag_summary"]


def _quantile(ordered: list[float], q: float) -> float:
    """Nearest-rank quantile of an ascending list (empty → 0)."""
    if not ordered:
        return 0.0
    rank = max(0, min(len(ordered) - 1, int(round(q * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def lag_summary(samples_s: Iterable[float], threshold_s: float) -> dict[str, Any]:
    """``{"p50_ms", "p99_ms", "max_ms", "samples", "threshold_ms", "saturated"}`` from lag samples."""
    ordered = sorted(samples_s)
    p99 = _quantile(ordered, 0.99)
    return {
        "p50_ms": _quantile(ordered, 0.50) * 1e3,
        "p99_ms": p99 * 1e3,
        "max_ms": (ordered[-1] if ordered else 0.0) * 1e3,
        "samples": len(ordered),
        "threshold_ms": threshold_s * 1e3,
        "saturated": bool(ordered) and p99 > threshold_s,
    }


def delay_summary(samples_s: Iterable[float]) -> dict[str, Any]:
    """``{"p50_ms", "p99_ms", "max_ms", "samples"}`` of delays in seconds (the open loop's send delay)."""
    ordered = sorted(samples_s)
    return {
        "p50_ms": _quantile(ordered, 0.50) * 1e3,
        "p99_ms": _quantile(ordered, 0.99) * 1e3,
        "max_ms": (ordered[-1] if ordered else 0.0) * 1e3,
        "samples": len(ordered),
    }


class LagMonitor:
    """Start it on the generator's loop; ``summary()`` at any time; ``stop()`` when done."""

    def __init__(self, threshold_s: float = 0.005, interval_s: float = 0.01, keep: int = 200_000, warmup_s: float = 0.1) -> None:
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.warmup_s = warmup_s  # the first wake-ups measure start-up work (first connects), not steady state
        self.samples: deque[float] = deque(maxlen=keep)  # seconds late, newest last
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="lag-monitor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        started = time.monotonic()
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self.interval_s)
            woke = time.monotonic()
            if woke - started >= self.warmup_s:
                self.samples.append(max(0.0, woke - asked - self.interval_s))

    def summary(self) -> dict[str, Any]:
        return lag_summary(self.samples, self.threshold_s)
