"""A synthetic run of any size, for report size and speed checks: seeded, no processes.

Streams arrive at a steady rate over three phases; in the middle one a fault window slows first
content and cuts a share of streams; the engine's gauges are scraped every 200 ms.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from chaos.model.observations import (
    ErrorInfo,
    FaultEvent,
    Hangup,
    MetricSample,
    Observations,
    PhaseWindow,
    StreamRecord,
)
from sla.base import Verdict

NS = 1_000_000_000


def synthetic_run(streams: int = 10_000, tokens: int = 48, seconds: float = 300.0,
                  seed: int = 7) -> tuple[dict[str, Any], Observations]:
    """(report dict, observations) shaped as a real run's."""
    from chaos.output.report import environment, fault_timeline

    rng = np.random.default_rng(seed)
    t0 = 1_000 * NS
    obs = Observations(experiment="synthetic", t0=t0, wall_t0=1.7e9)
    third = seconds / 3
    phases = [("baseline", 1.0, 1.0 + third), ("fault", 1.0 + third, 1.0 + 2 * third),
              ("recovery", 1.0 + 2 * third, 1.0 + seconds)]
    for name, a, b in phases:
        obs.add(PhaseWindow(name, t0 + int(a * NS), t0 + int(b * NS)))
    f_at, f_end = t0 + int(phases[1][1] * NS), t0 + int(phases[1][2] * NS)
    obs.add(FaultEvent("slow", "network.latency", "plan", f_at - 1000, "fault", undo={"toxic": "latency_downstream"}))
    obs.add(FaultEvent("slow", "network.latency", "inject", f_at, "fault", evidence={"latency_ms": 100}))
    obs.add(FaultEvent("slow", "network.latency", "revert", f_end, "fault", evidence={"removed": True}))
    sent = np.sort(rng.uniform(1.0, 1.0 + seconds, streams))
    for i, at in enumerate(sent):
        phase = next(name for name, a, b in phases if a <= at < b or name == "recovery")
        t_sent = t0 + int(at * NS)
        slow = phase == "fault"
        ttft = rng.lognormal(np.log(0.03 if not slow else 0.13), 0.3)
        gaps = rng.lognormal(np.log(0.01), 0.4, tokens - 1)
        stamps = (t_sent + int(ttft * NS) + np.concatenate([[0], np.cumsum(gaps * NS)])).astype(np.int64).tolist()
        record = StreamRecord(id=f"0-{i}", phase=phase, t_sent=t_sent, t_first_byte=stamps[0],
                              t_first_content=stamps[0], t_content=stamps, t_end=stamps[-1] + 1000, status=200,
                              finish_reason="length", done_seen=True, usage={"completion_tokens": tokens})
        if slow and rng.random() < 0.02:
            cut = stamps[: tokens // 2]
            record.t_content, record.t_end, record.finish_reason, record.done_seen = cut, cut[-1], None, False
            record.error = ErrorInfo("read", "peer closed connection")
        elif rng.random() < 0.005:
            record.hangup = Hangup("client.disconnect", "after_tokens", stamps[5])
            record.t_content, record.t_end = stamps[:6], stamps[5]
        obs.add(record)
    for t in np.arange(0.0, seconds + 2.0, 0.2):
        stamp = t0 + int(t * NS)
        for name, value in (("vllm:kv_cache_usage_perc", rng.uniform(0.1, 0.6)),
                            ("vllm:num_requests_running", rng.integers(0, 16)),
                            ("vllm:num_requests_waiting", rng.integers(0, 4))):
            obs.add(MetricSample(name, {"model_name": "tiny"}, float(value), stamp))
    verdicts = [Verdict("ttft", p, "pass", 0.05, 0.5, "s", 3000,
                        {"quantile": 0.99, "confidence": 0.95, "lower": 0.04, "upper": 0.06})
                for p in ("baseline", "fault", "recovery")]
    verdicts.append(Verdict("itl", None, "inconclusive", 0.02, 0.02, "s", 470_000,
                            {"quantile": 0.99, "confidence": 0.95, "lower": 0.019, "upper": 0.021,
                             "samples_needed": 2_000_000}))
    report = {
        "experiment": "synthetic", "description": "a synthetic run", "seed": seed, "status": "completed",
        "exit_code": 3,
        "error": None, "start": 1.7e9, "end": 1.7e9 + seconds, "duration_s": seconds, "target": None, "proxy": None,
        "phases": [{"name": n, "start_s": a, "end_s": b} for n, a, b in phases], "faults": fault_timeline(obs),
        "gpu": {}, "environment": environment(obs),
        "load": {"streams": streams, "background_streams": 0, "complete": streams, "hung_up_on_purpose": 0,
                 "client_lag": {}},
        "sla": [{"name": "ttft", "kind": "ttft", "params": {"quantile": 0.99, "budget": 0.5, "confidence": 0.95}},
                {"name": "itl", "kind": "itl",
                 "params": {"quantile": 0.99, "budget": 0.02, "max_stall": None, "confidence": 0.95}}],
        "verdicts": [v.to_dict() for v in verdicts],
    }
    return report, obs
