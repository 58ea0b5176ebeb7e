"""`recovery`: after a fault is reverted, the TTFT distribution is back near the baseline phase's.

The judged phase's TTFT sample is compared with the baseline phase's by a one-sided Mann-Whitney
U test (is the judged phase stochastically slower?). Statistical significance alone is not a
failure — with thousands of samples a 2% shift is significant — so a fail also needs the median
ratio over ``max_ratio`` and the judged median later than ``max_ratio`` x the baseline's by more than
``slack``. The slack is the host's share: on a time-sliced CPU a stream's first token waits for the
scheduler, and an unchanged stack's median TTFT moved 5.9 → 10.7 ms and 10.1 → 17.5 ms (1.7-1.8x, p
1e-12) between two 4 s phases beside two busy neighbours on 2 cores (the soak, docs/measured.md), 1.2-2.3
ms past 1.5x. A ratio alone calls those failed; a millisecond-scale TTFT needs an absolute floor as
well, as a float comparison needs ``atol`` beside ``rtol``. A stack that has not recovered is late by
far more (kv-pressure's queued phase: ~0.5 s over a ~50 ms baseline).
TTFT samples are chosen as `ttft` chooses them (streams with content).
Without a ``phase`` the last phase to start is judged: the usual place of a recovery phase.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, Observations
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.stats import rank_shift
from sla.ttft import ttft_samples

__all__ = ["MIN_SAMPLES", "Recovery"]

MIN_SAMPLES = 8  # per side; the U test has no power below this

SCHEMA = Schema(
    (
        Param("baseline", "str", doc="the phase to compare with; default the first phase"),
        Param("alpha", "float", default=0.05, min=1e-6, max=0.5, doc="significance of the rank test"),
        Param("max_ratio", "float", default=1.5, min=1.0, doc="the largest allowed median TTFT ratio judged/baseline"),
        Param("slack", "duration", default=0.01, min=0.0,
              doc="how much later than max_ratio x the baseline median the judged median may be (host scheduling)"),
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


@verifier
@dataclass(frozen=True, kw_only=True)
class Recovery(SlaSpec):
    kind = "recovery"
    summary = "after revert, the TTFT distribution returns to the baseline phase's"
    schema = SCHEMA
    timing = True
    better = "lower"
    capacity_fit = False
    needs = ()
    sample_label = "time to first content"

    baseline: str | None
    alpha: float
    max_ratio: float
    slack: float

    def samples(self, obs: Observations, phase: str | None) -> list[float]:
        """TTFT in seconds of the phase's streams with content: one side of the rank test (the other is
        the baseline phase's)."""
        return [v / NS for v in ttft_samples(obs.population(phase))[0]]

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a recovery ratio compares phases of one run; it is not a baseline figure")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None  # a probe is one window: there is no baseline phase to recover to

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        alpha: float = self.alpha
        max_ratio: float = self.max_ratio
        phases = _ordered_phases(obs)
        baseline: str | None = self.baseline or (phases[0] if phases else None)
        judged = phase if phase is not None else (phases[-1] if phases else None)
        evidence: dict[str, Any] = {"baseline_phase": baseline, "judged_phase": judged, "alpha": alpha,
                                    "slack_s": self.slack}

        def inconclusive(reason: str, samples: int = 0) -> Verdict:
            evidence["reason"] = reason
            return Verdict("recovery", phase, "inconclusive", None, max_ratio, "ratio", samples, evidence)

        if baseline is None or judged is None:
            return inconclusive("no phases to compare")
        if baseline == judged:
            return inconclusive(f"the judged phase is the baseline phase {baseline!r}; scope recovery to a later phase")
        base_s = self.samples(obs, baseline)
        after_s = self.samples(obs, judged)
        evidence.update(baseline_samples=len(base_s), judged_samples=len(after_s))
        if len(base_s) < MIN_SAMPLES or len(after_s) < MIN_SAMPLES:
            return inconclusive(
                f"the rank test needs at least {MIN_SAMPLES} TTFT samples on each side; "
                f"baseline {baseline!r} has {len(base_s)}, {judged!r} has {len(after_s)}",
                min(len(base_s), len(after_s)),
            )

        base_median = statistics.median(base_s)
        after_median = statistics.median(after_s)
        ratio = after_median / base_median if base_median > 0 else float("inf")
        test = rank_shift(after_s, base_s, alpha)
        evidence.update(
            baseline_p50_s=base_median,
            judged_p50_s=after_median,
            u_statistic=test.statistic,
            p_value=test.p_value,
            significant=test.significant,
        )
        # how much later the judged median is than the ratio allows, in seconds: what a saturated
        # client's own lag would have to explain for a failure not to be the server's
        excess_s = after_median - base_median * max_ratio
        status: Status = "fail" if test.significant and ratio > max_ratio and excess_s > self.slack else "pass"
        if ratio > max_ratio:
            evidence["excess_s"] = excess_s
        return Verdict("recovery", phase, status, ratio, max_ratio, "ratio", min(len(base_s), len(after_s)), evidence)
