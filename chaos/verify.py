"""Judging observations against an experiment's SLA entries; used live and by `streamchaos verify`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from chaos.observations import Observations
from sla.base import REGISTRY, Verdict

__all__ = ["TIMING_SLAS", "judge_all"]

# Verdicts a saturated load generator can falsify: its own lag inflates every measured time.
TIMING_SLAS = frozenset({"ttft", "itl", "throughput", "recovery"})


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
            if saturated and entry.kind in TIMING_SLAS and verdict.status == "fail":
                # a slow client is never mistaken for a slow server
                evidence = dict(verdict.evidence, inconclusive_cause="load generator saturated", client_lag=client_lag)
                verdict = replace(verdict, status="inconclusive", evidence=evidence)
            verdicts.append(verdict)
    return verdicts
