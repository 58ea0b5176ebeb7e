"""A finished run as AIPerf's ``profile_export_aiperf.json``: `streamchaos report RUN_DIR --as aiperf`.

The layout is AIPerf's ``JsonExportData`` (``schema_version`` 1.0): one ``JsonMetricResult`` per metric
tag (``unit``, ``avg``, percentiles, ``min``, ``max``, ``std``), ``error_summary``, ``start_time`` and
``end_time``, with AIPerf's units (ms for latencies, ``requests/sec``, ``tokens/sec``, ``tokens``).
The figures are computed as AIPerf defines its metrics, from our stamps (``sla.definitions``):

* ``inter_token_latency`` is per request, (request latency - TTFT) / (output tokens - 1): what vLLM
  and llm-d call TPOT. The gaps between chunks are AIPerf's ``inter_chunk_latency``.
* ``request_count`` counts the successful requests; ``error_request_count`` the rest: the failed ones,
  the ones a client fault hung up on purpose (AIPerf counts its own cancellations as errors) and the
  ones cut short. ``error_summary`` says which is which.

``aiperf_version`` is left out (AIPerf did not make this file); the run's own identity and the faults
in force go in a ``streamchaos`` key, which the export's ``extra="allow"`` admits.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from chaos.model.observations import NS, Observations
from chaos.output.phase_figures import phase_figures

__all__ = ["SCHEMA_VERSION", "aiperf_export"]

SCHEMA_VERSION = "1.0"  # JsonExportData.SCHEMA_VERSION in ai-dynamo/aiperf's export_models.py
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def _metric(values: Sequence[float], unit: str, scale: float = 1.0) -> dict[str, Any] | None:
    """A ``JsonMetricResult`` over per-request values; None (left out) for no values."""
    if not values:
        return None
    arr = np.asarray(values, dtype=float) / scale
    out: dict[str, Any] = {"unit": unit, "avg": float(np.mean(arr))}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    out.update(min=float(np.min(arr)), max=float(np.max(arr)), std=float(np.std(arr)))
    return out


def _single(value: float, unit: str) -> dict[str, Any]:
    """A run-level figure (a count, a throughput): AIPerf writes it as ``avg`` alone."""
    return {"unit": unit, "avg": value}


def _iso(obs: Observations, t: int) -> str:
    return datetime.fromtimestamp(obs.wall_t0 + (t - obs.t0) / NS, tz=timezone.utc).isoformat()


def aiperf_export(obs: Observations, phase: str | None = None, run_id: str = "",
                  cancelled: bool = False) -> dict[str, Any]:
    """The run (or one phase) as ``profile_export_aiperf.json`` (a plain dict, ready for ``json.dumps``).
    ``cancelled``: the run did not end as planned (halted, interrupted, or its journal has no end), AIPerf's
    ``was_cancelled``."""
    f = phase_figures(obs, phase)
    per_user = [1e9 / t for t in f.tpot if t > 0]  # tokens/sec/user: 1 / ITL, per request
    metrics: dict[str, dict[str, Any] | None] = {
        "time_to_first_token": _metric(f.ttft, "ms", 1e6),
        "time_to_second_token": _metric(f.ttst, "ms", 1e6),
        "inter_token_latency": _metric(f.tpot, "ms", 1e6),
        "inter_chunk_latency": _metric(f.gaps, "ms", 1e6),
        "request_latency": _metric(f.e2e, "ms", 1e6),
        "output_token_throughput_per_user": _metric(per_user, "tokens/sec/user"),
        "output_sequence_length": _metric(f.output_tokens, "tokens"),
        "input_sequence_length": _metric(f.input_tokens, "tokens"),
        "request_count": _single(len(f.ok), "requests"),
        "error_request_count": _single(len(f.failed) + f.not_completed, "requests"),
        "total_output_tokens": _single(sum(f.output_tokens), "tokens"),
        "total_isl": _single(sum(f.input_tokens), "tokens") if f.input_tokens else None,
        "benchmark_duration": _single(f.duration_s, "sec"),
    }
    if f.duration_s > 0:
        metrics["request_throughput"] = _single(len(f.ok) / f.duration_s, "requests/sec")
        metrics["output_token_throughput"] = _single(sum(f.output_tokens) / f.duration_s, "tokens/sec")
    errors = [{"error_details": {"code": code, "type": kind, "message": message}, "count": n}
              for (code, kind, message), n in f.errors.most_common()]
    by_fault: dict[str, int] = {}
    for st in f.hung_up:
        assert st.hangup is not None
        by_fault[st.hangup.fault] = by_fault.get(st.hangup.fault, 0) + 1
    errors += [{"error_details": {"code": None, "type": "ClientHangup",
                                  "message": f"hung up on purpose by client fault {fault}"}, "count": n}
               for fault, n in sorted(by_fault.items())]
    if f.cut:
        errors.append({"error_details": {"code": None, "type": "IncompleteStream",
                                         "message": "the stream ended without finish_reason/[DONE] and no error"},
                       "count": len(f.cut)})
    export: dict[str, Any] = {"schema_version": SCHEMA_VERSION,
                              "benchmark_id": f"{run_id or obs.experiment}:{phase or 'run'}"}
    export.update({tag: value for tag, value in metrics.items() if value is not None})
    export["was_cancelled"] = cancelled
    export["error_summary"] = errors
    if f.t_first_sent is not None:
        export["start_time"] = _iso(obs, f.t_first_sent)
    if f.t_last_token is not None:
        export["end_time"] = _iso(obs, f.t_last_token)
    export["streamchaos"] = {
        "experiment": obs.experiment, "run_id": run_id or None, "phase": phase,
        "faults": [{"name": name, "kind": kind} for name, kind in f.faults],
        "streams": f.total, "failed": len(f.failed), "hung_up_by_client_faults": len(f.hung_up),
        "incomplete": len(f.cut),
        "definitions": "clock starts at the socket send; inter_token_latency = per-request "
                       "(last token - first token) / (output tokens - 1); see `streamchaos list slas`",
    }
    return export
