"""`early_close`: the share of streams that ended without a proper terminal event, against a budget.

A stream is complete when a non-null ``finish_reason`` and ``data: [DONE]`` were both seen and no
error came, in band or otherwise (``StreamRecord.is_complete``; reference §2.7: vLLM and TGI send
``[DONE]`` after an error event, so ``[DONE]`` alone proves nothing). The run's engine profile may
not require ``[DONE]`` (``transformers serve`` never sends it): the rule the run recorded in its
journal (``Observations.end_rule``) is the one applied, and the evidence says which it was. Streams a client fault hung
up on purpose are not judged and are counted separately.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import STRICT_END, EndRule, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS

__all__ = ["EarlyClose", "why_incomplete"]

SCHEMA = Schema(
    (
        Param("budget", "fraction", default=0.0, doc="the largest share of streams that may close early"),
        Param("min_samples", "int", default=1, min=1, doc="fewer judged streams than this: inconclusive"),
    )
)


def why_incomplete(stream: StreamRecord, rule: EndRule = STRICT_END) -> list[str]:
    """The reasons a stream is not complete, in the vocabulary of reference §2.7; empty if complete."""
    why: list[str] = []
    if stream.status is not None and stream.status >= 400:
        why.append("http_error")
    if stream.error is not None and f"{stream.error.kind}_error" not in why:
        why.append(f"{stream.error.kind}_error")  # read_error, timeout_error, ... (http_error once)
    if stream.in_band_error is not None:
        why.append("error_event")
    if stream.finish_reason is None and rule.finish_reason:
        why.append("no_finish_reason")
    if not stream.done_seen and rule.done:
        why.append("no_done")
    return why


@verifier
@dataclass(frozen=True, kw_only=True)
class EarlyClose(SlaSpec):
    kind = "early_close"
    summary = "share of streams that ended without finish_reason and [DONE] (hang-ups excluded)"
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ("end_of_stream",)
    sample_label = None

    budget: float
    min_samples: int

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a share of streams cut short: counts, no sample of values

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a ceiling on early closes is a policy, not a measurement")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        budget: float = self.budget
        min_samples: int = self.min_samples
        population = obs.population(phase)
        judged = [st for st in population if st.hangup is None]
        hung_up = len(population) - len(judged)
        rule = obs.end_rule
        offenders = [(st, why_incomplete(st, rule)) for st in judged if not st.is_complete(rule)]

        evidence: dict[str, Any] = {
            "streams": len(judged),
            "incomplete": len(offenders),
            "hung_up_excluded": hung_up,
            "end_rule": (("finish_reason" if rule.finish_reason else "")
                         + (" and [DONE]" if rule.done else " ([DONE] not required)")),
            "by_reason": dict(Counter(reason for _, why in offenders for reason in why)),
            "offenders": [
                {"id": st.id, "why": why, **({"error": st.error.message} if st.error else {})}
                for st, why in offenders[:MAX_IDS]
            ],
        }
        if len(judged) < min_samples:
            evidence["reason"] = f"{len(judged)} judged streams (hang-ups excluded), at least {min_samples} needed"
            return Verdict("early_close", phase, "inconclusive", None, budget, "fraction", len(judged), evidence)
        share = len(offenders) / len(judged)
        status: Status = "pass" if share <= budget else "fail"
        return Verdict("early_close", phase, status, share, budget, "fraction", len(judged), evidence)
