"""What the views read off a run, as plain numbers: time spans, metric series, per-bin rates. Pure.

Times are seconds from the run's start (``Observations.t0``); the report dict's phases and faults are
already in those seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chaos.model.observations import NS, Observations, StreamRecord
from chaos.output.reports.plot import Window
from sla.definitions import tokens_per_event

__all__ = [
    "GPU_CLOCK_SERIES",
    "GPU_POWER_SERIES",
    "KV_SERIES",
    "RUNNING_SERIES",
    "WAITING_SERIES",
    "bin_width",
    "fault_windows",
    "first_series",
    "phase_windows",
    "rel_s",
    "run_end",
    "run_start",
    "stream_tokens",
]

# The first series present wins (the builtin stack exports vLLM's names; SGLang and TGI have theirs).
KV_SERIES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
             "streamchaos_kv_blocks_used",
             "tgi_batch_current_max_tokens")
RUNNING_SERIES = ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size")
WAITING_SERIES = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")
GPU_CLOCK_SERIES = ("gpu_sm_clock_mhz",)
GPU_POWER_SERIES = ("gpu_power_watts",)


def rel_s(obs: Observations, t: int | None) -> float | None:
    return None if t is None else (t - obs.t0) / NS


def phase_windows(report: dict[str, Any], end: float) -> list[Window]:
    return [Window(p["name"], p["start_s"], p["end_s"] if p["end_s"] is not None else end)
            for p in report.get("phases", [])]


def fault_windows(report: dict[str, Any], end: float) -> list[Window]:
    """Each injected fault from its inject to its revert (or the end of the run when never reverted)."""
    return [Window(f["name"], f["injected_at"], f["reverted_at"] if f["reverted_at"] is not None else end)
            for f in report.get("faults", []) if f.get("injected_at") is not None]


def run_end(report: dict[str, Any], obs: Observations) -> float:
    """The last moment anything was observed, in seconds: the time axis of every timeline view."""
    ends: list[float] = [p["end_s"] or p["start_s"] for p in report.get("phases", [])]
    ends += [f["reverted_at"] or f["injected_at"] or 0.0 for f in report.get("faults", [])]
    stamps = [s.t_end or s.t_sent for s in obs.streams if (s.t_end or s.t_sent) is not None]
    if stamps:
        ends.append((max(t for t in stamps if t is not None) - obs.t0) / NS)
    if obs.metrics:
        ends.append((max(m.t for m in obs.metrics) - obs.t0) / NS)
    return max([*ends, 1.0])


def run_start(report: dict[str, Any], obs: Observations) -> float:
    """Where timeline views begin: a little before the first scrape or phase (the stack's start-up is not shown)."""
    starts = [p["start_s"] for p in report.get("phases", [])]
    if obs.metrics:
        starts.append((min(m.t for m in obs.metrics) - obs.t0) / NS)
    return max(0.0, min(starts, default=0.0) - 0.5)


def first_series(obs: Observations, names: Sequence[str]) -> tuple[str, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The first of ``names`` that was scraped: (name, seconds, value summed over label sets per scrape)."""
    for name in names:
        samples = obs.series(name)
        if samples:
            by_t: dict[int, float] = {}
            for m in samples:
                by_t[m.t] = by_t.get(m.t, 0.0) + m.value
            times = sorted(by_t)
            return name, (np.array(times, dtype=float) - obs.t0) / NS, np.array([by_t[t] for t in times])
    return "", np.zeros(0), np.zeros(0)


def bin_width(end_s: float) -> float:
    """Rates are counted in bins: at least 0.25 s, and at most ~200 bins over the run."""
    return max(0.25, end_s / 200.0)


def stream_tokens(stream: StreamRecord) -> tuple[list[int], float]:
    """(token stamps, tokens per stamp): a chunk may carry several tokens; when the server reported
    ``usage.completion_tokens`` they are spread over the token events (content, reasoning, tool-call
    fragments), as `throughput` counts them."""
    per_event = tokens_per_event(stream)
    return stream.t_tokens, per_event if per_event is not None else 1.0
