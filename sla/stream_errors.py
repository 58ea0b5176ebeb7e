"""`errors`: the share of streams that failed (HTTP status >= 400, a transport error, an in-band error).

Streams a client fault hung up on purpose are not judged: the hang-up is the fault, not a failure
of the target. A stream can fail in several ways at once; it counts once in the figure and under
each of its ways in the breakdown.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS

__all__ = ["error_kinds", "Errors"]

SCHEMA = Schema((Param("budget", "fraction", default=0.0, doc="the largest share of streams that may fail"),))


def error_kinds(stream: StreamRecord) -> list[str]:
    """How a stream failed: ``http``, the transport error's kind (connect, read, timeout, ...),
    ``in_band``; empty when it did not."""
    kinds: list[str] = []
    if stream.status is not None and stream.status >= 400:
        kinds.append("http")
    if stream.error is not None and stream.error.kind not in kinds:
        kinds.append(stream.error.kind)
    if stream.in_band_error is not None and "in_band" not in kinds:
        kinds.append("in_band")
    return kinds


HALT_ERROR_SHARE = 0.25  # a capacity probe under an errors budget of 0%: a quarter of streams failed is plainly over


@verifier
@dataclass(frozen=True, kw_only=True)
class Errors(SlaSpec):
    kind = "errors"
    summary = "share of streams that failed: HTTP >= 400, transport or in-band errors"
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = None

    budget: float

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a share of failed streams: counts, no sample of values

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a ceiling on failures is a policy, not a measurement")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        if self.budget > 0.0:
            return None  # a tolerated share: the window's verdict decides
        # under a budget of 0% one failure fails the window; a quarter failed is plainly over
        return HaltSpec("error_share", window=window_s, above=HALT_ERROR_SHARE, min_streams=min_streams)

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        budget: float = self.budget
        population = obs.population(phase)
        judged = [st for st in population if st.hangup is None]
        failed = [(st, error_kinds(st)) for st in judged]
        failed = [(st, kinds) for st, kinds in failed if kinds]

        evidence: dict[str, Any] = {
            "streams": len(judged),
            "failed": len(failed),
            "hung_up_excluded": len(population) - len(judged),
            "by_kind": dict(Counter(kind for _, kinds in failed for kind in kinds)),
            "by_status": dict(Counter(_status_label(st) for st, _ in failed)),
            "first": [
                {
                    "id": st.id,
                    "kinds": kinds,
                    "status": st.status,
                    "message": (st.error.message if st.error else st.in_band_error or "")[:200],
                }
                for st, kinds in failed[:MAX_IDS]
            ],
        }
        if not judged:
            evidence["reason"] = "no judged streams (hang-ups excluded)"
            return Verdict("errors", phase, "inconclusive", None, budget, "fraction", 0, evidence)
        share = len(failed) / len(judged)
        status: Status = "pass" if share <= budget else "fail"
        return Verdict("errors", phase, status, share, budget, "fraction", len(judged), evidence)


def _status_label(stream: StreamRecord) -> str:
    """The HTTP status a failed stream got ("200" for a stream cut after a good start), or "none"."""
    status = stream.status if stream.status is not None else (stream.error.status if stream.error else None)
    return str(status) if status is not None else "none"
