"""Judging observations against an experiment's SLA entries; used live and by `streamchaos verify`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chaos.observations import Observations
from sla.base import REGISTRY, Verdict

__all__ = ["TIMING_SLAS", "judge_all"]

# Verdicts a saturated load generator can falsify: its own lag inflates every measured time.
TIMING_SLAS = frozenset({"ttft", "itl", "throughput", "recovery", "goodput", "fluidity"})


def _within_client_lag(verdict: Verdict, client_lag: dict[str, Any]) -> bool:
    """Could the generator's own lag explain this failure? Only for times over budget by less than it.

    A figure 500 ms over a TTFT budget is not explained by a client whose event loop runs 30 ms
    late; one 10 ms over is, and is reported inconclusive rather than blamed on the server.
    """
    if verdict.sla not in TIMING_SLAS:
        return False
    lag_s = float(client_lag.get("p99_ms") or 0.0) / 1000.0
    if isinstance(verdict.evidence.get("excess_s"), (int, float)):
        return float(verdict.evidence["excess_s"]) <= lag_s  # a ratio verdict that says its excess in seconds
    if verdict.unit != "s" or verdict.figure is None or verdict.budget is None:
        return True  # rates and ratios cannot be compared with a lag: be cautious
    return verdict.figure - verdict.budget <= lag_s


def judge_all(experiment: Any, obs: Observations, *, client_lag: dict[str, Any] | None = None) -> list[Verdict]:
    """One verdict per SLA entry and scoped phase, with ``expect`` and the entry's name applied."""
    import sla  # noqa: F401 - registers every verifier

    saturated = bool(client_lag and client_lag.get("saturated"))
    verdicts: list[Verdict] = []
    for entry in experiment.sla:
        spec = REGISTRY[entry.kind]
        for phase in entry.phases or (None,):
            verdict = spec.fn(obs, entry.params, phase)
            verdict = replace(verdict, expect=entry.expect, name=entry.name)
            if saturated and verdict.status == "fail" and _within_client_lag(verdict, client_lag or {}):
                # a slow client is never mistaken for a slow server
                evidence = dict(verdict.evidence, inconclusive_cause="load generator saturated", client_lag=client_lag)
                verdict = replace(verdict, status="inconclusive", evidence=evidence)
            verdicts.append(verdict)
    return verdicts
