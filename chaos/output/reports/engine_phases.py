"""What the engine's own counters say per phase: its prefix-cache hit rate, and TTFT split into time
queued and time in prefill, where it exports them (vLLM's names; the builtin stack uses them too).

A fault that flushes or squeezes the prefix cache shows as the hit rate falling in its phase and
rising again after; a KV-pressure burst shows as time queued, not prefill. Counters are read as
increments between scrapes, summed over label sets, with a drop taken as a restart (an engine kill
zeroes them), so a phase with a restart in it is never read as a negative rate. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from chaos.model.observations import MetricSample, Observations

__all__ = ["COUNTERS", "counter_increase", "engine_phases"]

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
COUNTERS = (HITS, QUERIES, f"{QUEUE}_sum", f"{QUEUE}_count", f"{PREFILL}_sum", f"{PREFILL}_count")


def counter_increase(samples: Sequence[MetricSample], start: int, end: int) -> float | None:
    """How much a counter rose from ``start`` to ``end`` (monotonic ns), summed over its label sets: from
    each set's last scrape at or before ``start`` (its first in the window when it began later) to its last
    at or before ``end``; a value below the one before it is a restart, its whole value counted as rise.
    None when no label set has two scrapes to compare."""
    by_labels: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for m in samples:
        if m.t <= end:
            by_labels.setdefault(tuple(sorted(m.labels.items())), []).append((m.t, m.value))
    total, seen = 0.0, False
    for points in by_labels.values():
        points.sort()
        before = [i for i, (t, _) in enumerate(points) if t <= start]
        first = before[-1] if before else 0
        window = points[first:]
        if len(window) < 2:
            continue
        seen = True
        for (_, a), (_, b) in zip(window, window[1:], strict=False):
            total += b - a if b >= a else b
    return total if seen else None


def _by_name(obs: Observations) -> dict[str, list[MetricSample]]:
    out: dict[str, list[MetricSample]] = {}
    for m in obs.metrics:
        if m.name in COUNTERS:
            out.setdefault(m.name, []).append(m)
    return out


def _mean(series: dict[str, list[MetricSample]], name: str, start: int, end: int) -> tuple[float | None, int]:
    total = counter_increase(series.get(f"{name}_sum", []), start, end)
    count = counter_increase(series.get(f"{name}_count", []), start, end)
    if total is None or not count:
        return None, int(count or 0)
    return round(total / count, 4), int(count)


def engine_phases(obs: Observations) -> dict[str, dict[str, Any]] | None:
    """Per phase: prefix-cache tokens queried and hit and the hit rate; mean queue and prefill seconds of
    the requests that finished them in the phase. None when the engine exports none of these."""
    series = _by_name(obs)
    if not series:
        return None
    out: dict[str, dict[str, Any]] = {}
    for window in obs.phases:
        end = window.t_end if window.t_end is not None else max((m.t for m in obs.metrics), default=window.t_start)
        entry: dict[str, Any] = {}
        queries = counter_increase(series.get(QUERIES, []), window.t_start, end)
        hits = counter_increase(series.get(HITS, []), window.t_start, end)
        if queries is not None:
            entry["prefix_cache_queried_tokens"] = int(queries)
            entry["prefix_cache_hit_tokens"] = int(hits or 0)
            entry["prefix_cache_hit_rate"] = round((hits or 0) / queries, 4) if queries else None
        for key, name in (("queue", QUEUE), ("prefill", PREFILL)):
            mean, count = _mean(series, name, window.t_start, end)
            if count:
                entry[f"{key}_mean_s"] = mean
                entry[f"{key}_requests"] = count
        if entry:
            out[window.name] = entry
    return out or None
