"""A finished run as llm-d Benchmark Reports v0.2.1: `streamchaos report RUN_DIR --as llm-d`.

One report per phase (a phase is one load under one set of faults, which is what a report describes),
laid out as llm-d-benchmark's published JSON Schema (``br_v0_2_1_json_schema.json``) has it: ``run``,
``scenario.stack`` (the target, as a ``generic`` component: the run does not know the accelerator an
``inference_engine`` component requires), ``scenario.load`` (the load, the phase as its ``treatment``)
and ``results.request_performance.aggregate`` (requests, latency, throughput, each a ``Statistics``
with its ``units``), plus ``results.session_performance`` for conversation workloads.

The figures are those of ``vllm_bench`` (successful requests only, numpy's linear percentiles, the
duration from the first request sent to the last successful one's last token), from our stamps
(``sla.definitions``). Streams that failed go to ``requests.failures``; streams that did not complete
(a client fault hung up, or the stream ended without its end) to ``requests.incomplete``. The faults in
force go where the schema takes free-form data: ``scenario.load.native.config`` (our load's own
configuration) and ``run.keywords``. What the run cannot know is left out, never filled in.

``phase_figures`` is shared with ``aiperf_export``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from chaos.model.experiment import LoadSpec
from chaos.model.observations import NS, Observations, StreamRecord
from chaos.output.phase_figures import PhaseFigures, phase_figures

__all__ = ["PhaseFigures", "llmd_report", "llmd_reports", "phase_figures"]

VERSION = "0.2.1"
TOOL = "streamchaos"


def _statistics(values: Sequence[float], units: str, scale: float = 1.0) -> dict[str, Any] | None:
    """A ``Statistics`` object; None (left out) for no values."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float) / scale
    out: dict[str, Any] = {"units": units, "mean": float(np.mean(arr)), "stddev": float(np.std(arr)),
                           "min": float(np.min(arr))}
    for p in (10, 25, 50, 75, 90, 95, 99):
        out[f"p{p}"] = float(np.percentile(arr, p))
    out["max"] = float(np.max(arr))
    return out


def _rate(value: float, units: str) -> dict[str, Any]:
    """A rate over the phase: one figure, so its ``Statistics`` holds the mean alone."""
    return {"units": units, "mean": value}


def _sequence_length(values: Sequence[int]) -> dict[str, Any]:
    lo, hi = min(values), max(values)
    if lo == hi:
        return {"distribution": "fixed", "value": lo}
    return {"distribution": "other", "value": float(np.mean(values)), "std_dev": float(np.std(values)),
            "min": lo, "max": max(hi, 1)}


def _cfg_id(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, tz=timezone.utc).isoformat()


def _note(obs: Observations, topic: str) -> dict[str, Any]:
    notes = obs.notes_on(topic)
    return dict(notes[-1].data) if notes else {}


def _stack(obs: Observations) -> list[dict[str, Any]] | None:
    target = _note(obs, "target")
    if not target:
        return None
    engine = _note(obs, "engine_profile")
    config = {k: target[k] for k in ("kind", "base_url", "model", "device") if target.get(k) is not None}
    standardized: dict[str, Any] = {"kind": "generic", "tool": str(engine.get("name") or target.get("kind", "unknown")),
                                    # llm-d requires it; the run records no engine version
                                    "tool_version": str(target.get("version") or "unknown")}
    standardized.update({k: config[k] for k in ("model", "base_url") if k in config})
    title = (engine.get("profile") or {}).get("title")
    metadata = {"label": "target", "cfg_id": _cfg_id(config), **({"description": str(title)} if title else {})}
    return [{"metadata": metadata, "standardized": standardized, "native": {"config": config}}]


def _load(obs: Observations, load: LoadSpec | None, figures: PhaseFigures) -> dict[str, Any] | None:
    """``scenario.load``; None where the run cannot say the input length (the schema requires it)."""
    if load is None or not figures.input_tokens:
        return None
    version = str(((_note(obs, "environment").get("versions") or {}).get("streamchaos")) or "unknown")
    standardized: dict[str, Any] = {
        "tool": TOOL, "tool_version": version, "parallelism": max(1, load.workers * load.shards),
        "source": "random" if load.prompts.source == "synthetic" else "sampled",
        "input_seq_len": _sequence_length(figures.input_tokens),
    }
    lo, hi = load.max_tokens
    if load.ignore_eos:  # only then is the output length enforced, not just capped
        standardized["output_seq_len"] = ({"distribution": "fixed", "value": lo} if lo == hi else
                                          {"distribution": "uniform", "value": (lo + hi) / 2, "min": lo, "max": hi})
    if load.workload.kind == "sessions":
        standardized["multi_turn"] = {"enabled": True}
    if load.rate is not None:
        standardized["rate_qps"] = load.rate
    else:
        standardized["concurrency"] = load.concurrency or 4  # the runner's default closed loop
    native_config = {
        "experiment": obs.experiment, "phase": figures.phase,
        "loop": "open" if load.rate is not None else "closed", "concurrency": load.concurrency, "rate": load.rate,
        "max_tokens": list(load.max_tokens), "endpoint": load.endpoint, "workload": load.workload.kind,
        "faults": [{"name": name, "kind": kind} for name, kind in figures.faults],
    }
    metadata = {"schema_version": "0.0.1", "cfg_id": _cfg_id(native_config),
                "description": f"streamchaos experiment {obs.experiment}, phase {figures.phase}",
                "treatment": figures.phase}
    return {"metadata": metadata, "standardized": standardized, "native": {"config": native_config}}


def _sessions(figures: PhaseFigures, population: list[StreamRecord]) -> dict[str, Any] | None:
    by_session: dict[str, list[StreamRecord]] = {}
    for st in population:
        if st.session is not None:
            by_session.setdefault(st.session, []).append(st)
    if not by_session:
        return None
    ok = {id(st) for st in figures.ok}
    hung = {id(st) for st in figures.hung_up}
    succeeded = sum(all(id(st) in ok for st in turns) for turns in by_session.values())
    sessions = {
        "total": len(by_session), "succeeded": succeeded, "failed": len(by_session) - succeeded,
        "total_events": sum(len(t) for t in by_session.values()),
        "total_events_completed": sum(id(st) in ok for t in by_session.values() for st in t),
        "total_events_cancelled": sum(id(st) in hung for t in by_session.values() for st in t),
        "events_per_session": _statistics([len(t) for t in by_session.values()], "count"),
    }
    return {"sessions": {k: v for k, v in sessions.items() if v is not None}}


def llmd_report(obs: Observations, phase: str, load: LoadSpec | None = None, run_id: str = "") -> dict[str, Any]:
    """One phase as a Benchmark Report v0.2.1 (a plain dict, ready for ``json.dumps``)."""
    figures = phase_figures(obs, phase)
    window = obs.phase(phase)
    run: dict[str, Any] = {"uid": f"{run_id or obs.experiment}:{phase}", "eid": run_id or obs.experiment}
    if window is not None and window.t_end is not None:
        start = obs.wall_t0 + (window.t_start - obs.t0) / NS
        end = obs.wall_t0 + (window.t_end - obs.t0) / NS
        run["time"] = {"start": _iso(start), "end": _iso(end), "duration": f"PT{end - start:.3f}S"}
    faults = ", ".join(f"{name} ({kind})" for name, kind in figures.faults) or "none"
    run["description"] = f"streamchaos experiment {obs.experiment}, phase {phase}; faults in force: {faults}"
    run["keywords"] = [TOOL, f"phase:{phase}", *(f"fault:{name}" for name, _ in figures.faults)]

    requests: dict[str, Any] = {"total": figures.total, "failures": len(figures.failed),
                                "incomplete": figures.not_completed,
                                "input_length": _statistics(figures.input_tokens, "count"),
                                "output_length": _statistics(figures.output_tokens, "count")}
    latency = {
        "time_to_first_token": _statistics(figures.ttft, "ms", 1e6),
        "normalized_time_per_output_token": _statistics(figures.ntpot, "ms/token", 1e6),
        "time_per_output_token": _statistics(figures.tpot, "ms/token", 1e6),
        "inter_token_latency": _statistics(figures.gaps, "ms/token", 1e6),
        "request_latency": _statistics(figures.e2e, "ms", 1e6),
    }
    aggregate: dict[str, Any] = {"requests": {k: v for k, v in requests.items() if v is not None}}
    latency = {k: v for k, v in latency.items() if v is not None}
    if latency:
        aggregate["latency"] = latency
    if figures.duration_s > 0:
        out_tokens, in_tokens = sum(figures.output_tokens), sum(figures.input_tokens)
        throughput = {"output_token_rate": _rate(out_tokens / figures.duration_s, "tokens/s"),
                      "request_rate": _rate(len(figures.ok) / figures.duration_s, "queries/s")}
        if len(figures.input_tokens) == len(figures.ok):  # every successful request's prompt is counted
            throughput["input_token_rate"] = _rate(in_tokens / figures.duration_s, "tokens/s")
            throughput["total_token_rate"] = _rate((in_tokens + out_tokens) / figures.duration_s, "tokens/s")
        aggregate["throughput"] = throughput
    results: dict[str, Any] = {"request_performance": {"aggregate": aggregate}}
    sessions = _sessions(figures, obs.population(phase))
    if sessions is not None:
        results["session_performance"] = sessions

    scenario: dict[str, Any] = {}
    stack = _stack(obs)
    if stack is not None:
        scenario["stack"] = stack
    load_section = _load(obs, load, figures)
    if load_section is not None:
        scenario["load"] = load_section
    report: dict[str, Any] = {"version": VERSION, "run": run}
    if scenario:
        report["scenario"] = scenario
    report["results"] = results
    return report


def llmd_reports(obs: Observations, load: LoadSpec | None = None, run_id: str = "") -> list[dict[str, Any]]:
    """One report per phase, in the run's order."""
    return [llmd_report(obs, p.name, load, run_id) for p in obs.phases]
