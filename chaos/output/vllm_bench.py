"""A finished run's figures under vLLM ``bench serve``'s names: `streamchaos report RUN_DIR --as vllm-bench`.

The figures are computed as ``vllm/benchmarks/serve.py`` (``calculate_metrics``) computes them —
means, medians and percentiles with numpy's linear interpolation, TPOT only over requests with
more than one output token, ITL over every gap of every successful request, throughputs over the
benchmark duration — from our stamps (``sla.definitions``), so that a user can lay them beside a
``vllm bench serve`` report. Where the stamps differ (our clock starts at the socket, ours counts
only content events) ``sla.definitions`` says so; the printout repeats it in one line.

Successful requests are the complete ones (finish_reason, ``[DONE]``, no error); a stream a client
fault hung up on purpose is neither successful nor failed here and is counted on its own line.
The duration runs from the first request sent to the last successful request's last content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from chaos.model.observations import Observations
from chaos.output.phase_figures import phase_figures

__all__ = ["render_vllm_bench", "vllm_bench_figures"]

PERCENTILES = (99.0,)  # vLLM's default --metric-percentiles


def _stats_ms(values_ns: Sequence[float]) -> dict[str, float]:
    """mean, median, std and the percentiles in ms; zeros for no values, as vLLM prints them."""
    arr = np.asarray(values_ns, dtype=float) / 1e6 if len(values_ns) else np.zeros(1)
    out = {"mean": float(np.mean(arr)), "median": float(np.median(arr)), "std": float(np.std(arr))}
    for p in PERCENTILES:
        out[f"p{p:g}"] = float(np.percentile(arr, p))
    return out


def vllm_bench_figures(obs: Observations, phase: str | None = None) -> dict[str, Any]:
    """The run's (or one phase's) figures as vLLM ``bench serve`` names them."""
    f = phase_figures(obs, phase)
    tokens = sum(f.output_tokens)
    per_s = (lambda x: x / f.duration_s) if f.duration_s > 0 else (lambda x: 0.0)
    return {
        "phase": phase,
        "successful_requests": len(f.ok),
        "failed_requests": len(f.failed) + len(f.cut),
        "hung_up_by_client_faults": len(f.hung_up),
        "benchmark_duration_s": f.duration_s,
        "total_generated_tokens": int(tokens),
        "request_throughput": per_s(len(f.ok)),
        "output_throughput": per_s(tokens),
        "ttft_ms": _stats_ms(f.ttft),
        "tpot_ms": _stats_ms(f.tpot),
        "itl_ms": _stats_ms(f.gaps),
        "e2el_ms": _stats_ms(f.e2e),
    }


def _line(label: str, value: float | int, digits: int = 2) -> str:
    text = f"{value}" if isinstance(value, int) else f"{value:.{digits}f}"
    return f"{label:<40} {text:<10}"


def _section(title: str) -> str:
    return title.center(50, "-")


def render_vllm_bench(figures: dict[str, Any], experiment: str = "") -> str:
    """The figures in the layout of vLLM's "Serving Benchmark Result" block."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    if experiment:
        phase = f" (phase {figures['phase']})" if figures["phase"] else ""
        lines.append(f"{'Experiment:':<40} {experiment}{phase}")
    lines += [
        _line("Successful requests:", figures["successful_requests"]),
        _line("Failed requests:", figures["failed_requests"]),
        _line("Benchmark duration (s):", figures["benchmark_duration_s"]),
        _line("Total generated tokens:", figures["total_generated_tokens"]),
        _line("Request throughput (req/s):", figures["request_throughput"]),
        _line("Output token throughput (tok/s):", figures["output_throughput"]),
    ]
    for key, title, short in (
        ("ttft_ms", "Time to First Token", "TTFT"),
        ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl_ms", "Inter-token Latency", "ITL"),
        ("e2el_ms", "End-to-end Latency", "E2EL"),
    ):
        stats = figures[key]
        lines.append(_section(title))
        lines.append(_line(f"Mean {short} (ms):", stats["mean"]))
        lines.append(_line(f"Median {short} (ms):", stats["median"]))
        for p in PERCENTILES:
            lines.append(_line(f"P{p:g} {short} (ms):", stats[f"p{p:g}"]))
    lines.append("=" * 50)
    if figures["hung_up_by_client_faults"]:
        lines.append(f"({figures['hung_up_by_client_faults']} streams hung up by client faults are in neither count)")
    lines.append("streamchaos stamps: the clock starts at the socket and only content events are timed "
                 "(see `streamchaos list slas`, metric definitions)")
    return "\n".join(lines)
