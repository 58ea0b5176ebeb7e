"""`recovery`: after a fault is reverted, the TTFT distribution is back near the baseline phase's.

The judged phase's TTFT sample is compared with the baseline phase's by a one-sided Mann-Whitney
U test (is the judged phase stochastically slower?). Statistical significance alone is not a
failure — with thousands of samples a 2% shift is significant — so a fail also needs the median
ratio over ``max_ratio``. TTFT samples are chosen as `ttft` chooses them (streams with content).
Without a ``phase`` the last phase to start is judged: the usual place of a recovery phase.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from chaos.observations import Observations
from chaos.params import Param, Schema
from sla.base import Status, Verdict, verifier
from sla.stats import rank_shift
from sla.ttft import ttft_samples

__all__ = ["MIN_SAMPLES", "recovery"]

MIN_SAMPLES = 8  # per side; the U test has no power below this

SCHEMA = Schema(
    (
        Param("baseline", "str", doc="the phase to compare with; default the first phase"),
        Param("alpha", "float", default=0.05, min=1e-6, max=0.5, doc="significance of the rank test"),
        Param("max_ratio", "float", default=1.5, min=1.0, doc="the largest allowed median TTFT ratio judged/baseline"),
    )
)


def _ordered_phases(obs: Observations) -> list[str]:
    if obs.phases:
        return [p.name for p in sorted(obs.phases, key=lambda p: p.t_start)]
    seen: dict[str, int] = {}  # no windows recorded: order phases by their first stream
    for st in obs.streams:
        if st.t_sent is not None:
            seen[st.phase] = min(seen.get(st.phase, st.t_sent), st.t_sent)
    return sorted(seen, key=seen.__getitem__)


@verifier("recovery", SCHEMA, "after revert, the TTFT distribution returns to the baseline phase's")
def recovery(obs: Observations, params: Mapping[str, Any], phase: str | None) -> Verdict:
    alpha: float = params["alpha"]
    max_ratio: float = params["max_ratio"]
    phases = _ordered_phases(obs)
    baseline: str | None = params.get("baseline") or (phases[0] if phases else None)
    judged = phase if phase is not None else (phases[-1] if phases else None)
    evidence: dict[str, Any] = {"baseline_phase": baseline, "judged_phase": judged, "alpha": alpha}

    def inconclusive(reason: str, samples: int = 0) -> Verdict:
        evidence["reason"] = reason
        return Verdict("recovery", phase, "inconclusive", None, max_ratio, "ratio", samples, evidence)

    if baseline is None or judged is None:
        return inconclusive("no phases to compare")
    if baseline == judged:
        return inconclusive(f"the judged phase is the baseline phase {baseline!r}; scope recovery to a later phase")
    base_ns = ttft_samples(obs.population(baseline))[0]
    after_ns = ttft_samples(obs.population(judged))[0]
    evidence.update(baseline_samples=len(base_ns), judged_samples=len(after_ns))
    if len(base_ns) < MIN_SAMPLES or len(after_ns) < MIN_SAMPLES:
        return inconclusive(
            f"the rank test needs at least {MIN_SAMPLES} TTFT samples on each side; "
            f"baseline {baseline!r} has {len(base_ns)}, {judged!r} has {len(after_ns)}",
            min(len(base_ns), len(after_ns)),
        )

    base_median = statistics.median(base_ns) / 1e9
    after_median = statistics.median(after_ns) / 1e9
    ratio = after_median / base_median if base_median > 0 else float("inf")
    test = rank_shift(after_ns, base_ns, alpha)
    evidence.update(
        baseline_p50_s=base_median,
        judged_p50_s=after_median,
        u_statistic=test.statistic,
        p_value=test.p_value,
        significant=test.significant,
    )
    status: Status = "fail" if test.significant and ratio > max_ratio else "pass"
    if status == "fail":
        # how much later the judged median is than the ratio allows, in seconds: what a saturated
        # client's own lag would have to explain for this failure not to be the server's
        evidence["excess_s"] = after_median - base_median * max_ratio
    return Verdict("recovery", phase, status, ratio, max_ratio, "ratio", min(len(base_ns), len(after_ns)), evidence)
