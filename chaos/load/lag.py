"""Self-calibration: how late the load generator's own event loop wakes up.

A task sleeps ``interval`` again and again and records how much later than asked it woke. When the
generator is saturated (too many events per second for one process) every stamp it takes is late
by about this much, so a p99 above the threshold marks the run's latency verdicts inconclusive.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["LagMonitor", "delay_summary", "lag_summary", "merged_lag", "merged_send_delay", "summed_stats"]


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


def merged_lag(per_process: Mapping[int, Iterable[float]], threshold_s: float) -> dict[str, Any]:
    """Lag over several load processes (workers, shards): all samples together, plus each one's own
    summary under ``"workers"``; saturated if the whole is or any one process is."""
    merged = lag_summary(itertools.chain.from_iterable(per_process.values()), threshold_s)
    merged["workers"] = {i: lag_summary(s, threshold_s) for i, s in sorted(per_process.items())}
    merged["saturated"] = merged["saturated"] or any(w["saturated"] for w in merged["workers"].values())
    return merged


def merged_send_delay(per_process: Mapping[int, Mapping[str, Iterable[float]]]) -> dict[str, dict[str, Any]]:
    """Per phase, the open-loop send delay of several load processes summarised together."""
    phases = sorted({p for d in per_process.values() for p in d})
    return {p: delay_summary(itertools.chain.from_iterable(d.get(p, ()) for d in per_process.values())) for p in phases}


def summed_stats(per_process: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The generators' counters (sent, in flight, overflows, abandoned, connect backoffs) added over several processes;
    the event loops they ran on; the most any of them had buffered for the runner, and the longest
    time one spent above its uplink's high-water mark (a runner that fell behind its load)."""
    keys = ("sent", "in_flight", "overflows", "abandoned", "connect_backoffs")
    out: dict[str, Any] = {k: sum(s.get(k, 0) for s in per_process.values()) for k in keys}
    out["connect_backoff_s"] = round(sum(s.get("connect_backoff_s", 0.0) for s in per_process.values()), 3)
    out["loops"] = sorted({str(kind) for s in per_process.values() for kind in s.get("loops", ())})
    for key in ("uplink_buffered_bytes", "uplink_over_high_water_s"):
        values = [s[key] for s in per_process.values() if key in s]
        if values:
            out[key] = max(values)
    spilled = [s["uplink_spilled_bytes"] for s in per_process.values() if "uplink_spilled_bytes" in s]
    if spilled:
        out["uplink_spilled_bytes"] = sum(spilled)
    for key in ("sessions", "sessions_trimmed"):  # a conversational workload's (chaos.load.workloads.sessions)
        counts = [s[key] for s in per_process.values() if key in s]
        if counts:
            out[key] = sum(counts)
    return out


class LagMonitor:
    """Start it on the generator's loop; ``summary()`` at any time; ``stop()`` when done."""

    def __init__(self, threshold_s: float = 0.005, interval_s: float = 0.01, keep: int = 200_000,
                 warmup_s: float = 0.1) -> None:
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
