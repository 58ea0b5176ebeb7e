"""`ttft`: a quantile of the time from request sent to first non-empty content, against a budget.

What counts: every judged stream that produced content, including streams a client fault hung up
on *after* their first content (that first content was really seen). Streams that waited for
content and never got it — a read timeout, a client that gave up after a time, a stream still
waiting when the run ended — are right-censored: their TTFT is known to exceed how long they
waited. When that wait already exceeds the budget they count as over budget (at the wait, a lower
bound), so a server that never answers cannot pass; when it does not, their TTFT is unknown and
they are left out. Other streams without content (HTTP or connect errors, an empty completion,
a client that left while queued) are excluded and counted in the evidence; `errors` and
`early_close` judge them.
Time to first byte is reported beside the figure: a TTFB far below TTFT points at a server or a
proxy that holds content back (a buffering proxy shows TTFT equal to end-to-end latency).
Under open-loop arrivals the evidence also gives the schedule delay (scheduled → sent: a client
backlog, or the in-flight cap's queue) and TTFT measured from the scheduled time, as its own
figure: a user who arrived on schedule waited that long, whatever the client's queue hid
(coordinated omission; the failure of ``vllm bench serve`` reported as vLLM #54101).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Verdict, verifier
from sla.common import (
    CONFIDENCE,
    MAX_IDS,
    QuantileParam,
    content_less_reason,
    ended_waiting,
    quantile_label,
    s,
    summary_s,
    summary_seconds,
)
from sla.definitions import definition_line
from sla.stats import judge_quantile

__all__ = ["judged_in_send_order", "Ttft", "ttft_samples"]

SCHEMA = Schema(
    (
        QuantileParam("quantile", default=0.99, doc="which quantile of TTFT is budgeted (0.99 or p99)"),
        Param("budget", "duration", required=True, doc="the most the quantile may be"),
        CONFIDENCE,
    )
)


def judged_in_send_order(population: list[StreamRecord], budget: float) -> list[int]:
    """The judged TTFTs in ns, in the order the requests were sent (ties keep the journal order):
    the TTFT of every stream with content, and the wait of every stream censored past ``budget``.
    The order matters: the interval's effective sample size comes from its autocorrelation."""
    judged: list[tuple[int, int, int]] = []
    for index, stream in enumerate(population):
        value = stream.ttft_ns
        if value is None:
            wait = _censored_wait_ns(stream)
            value = wait if wait is not None and wait >= budget * 1e9 else None
        if value is not None:
            judged.append((stream.t_sent if stream.t_sent is not None else 0, index, value))
    judged.sort()
    return [value for _, _, value in judged]


def ttft_samples(streams: list[StreamRecord]) -> tuple[list[int], list[StreamRecord], list[StreamRecord]]:
    """(TTFT in ns of streams with content, hung up before content, no content for another reason)."""
    values: list[int] = []
    hung_up: list[StreamRecord] = []
    no_content: list[StreamRecord] = []
    for stream in streams:
        ttft_ns = stream.ttft_ns
        if ttft_ns is not None:
            values.append(ttft_ns)
        elif stream.hangup is not None:
            hung_up.append(stream)
        else:
            no_content.append(stream)
    return values, hung_up, no_content


@verifier
@dataclass(frozen=True, kw_only=True)
class Ttft(SlaSpec):
    kind = "ttft"
    summary = "time to first non-empty content token, a quantile against a budget"
    schema = SCHEMA
    timing = True
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = "time to first content"

    quantile: float
    budget: float
    confidence: float

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        values = self.samples(obs, phase)
        status, figure, _, _, evidence = judge_quantile(values, self.quantile, self.budget, self.confidence)
        evidence.update(_evidence(obs.population(phase), values, self.budget, self.quantile))
        return Verdict("ttft", phase, status, figure, self.budget, "s", len(values), evidence)

    def samples(self, obs: Observations, phase: str | None) -> list[float]:
        """TTFT in seconds, in send order: every stream with content, and every wait censored past the
        budget (counted at the wait, a lower bound)."""
        return [v / NS for v in judged_in_send_order(obs.population(phase), self.budget)]

    def budget_rule(self) -> BudgetRule:
        return BudgetRule("quantile", "budget", "s")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return HaltSpec("ttft", window=window_s, above=factor * self.budget, quantile=self.quantile,
                        min_streams=min_streams)


def _evidence(population: list[StreamRecord], values: list[float], budget: float, q: float) -> dict[str, Any]:
    """What a TTFT verdict shows beside its figure: the distribution, first byte beside first content,
    the streams censored or left out and why, the open-loop schedule, the slowest streams. Pure."""
    _, hung_up, no_content = ttft_samples(population)
    with_content = [st for st in population if st.ttft_ns is not None]
    waited = [w for w in (_censored_wait_ns(st) for st in hung_up + no_content) if w is not None]
    over_budget = [w for w in waited if w >= budget * 1e9]
    label = quantile_label(q)
    ttfb_ns = [st.ttfb_ns for st in with_content if st.ttfb_ns is not None]
    shown = sorted({0.5, 0.9, 0.99, q})
    evidence: dict[str, Any] = {"definition": definition_line("ttft")}
    evidence["ttft"] = summary_seconds(values, shown)
    evidence["ttfb"] = summary_s(ttfb_ns, shown)  # first byte, beside first content
    evidence[f"ttfb_{label}"] = evidence["ttfb"][label]
    evidence["ttft_over_e2e_p50"] = _buffering_ratio(with_content)
    evidence["censored_over_budget"] = len(over_budget)  # waited past the budget for content that never came
    evidence["censored_unknown"] = len(waited) - len(over_budget)
    evidence["hung_up_before_content"] = len(hung_up)
    evidence["no_content"] = len(no_content)
    evidence["no_content_by_reason"] = dict(Counter(content_less_reason(st) for st in no_content))
    evidence["no_content_ids"] = [st.id for st in no_content[:MAX_IDS]]
    delays = [max(0, st.t_sent - st.t_scheduled) for st in population
              if st.t_scheduled is not None and st.t_sent is not None]
    if delays:  # open loop: what the arrival schedule saw, beside what the wire saw
        evidence["schedule_delay"] = summary_s(delays, shown)
        evidence["ttft_from_scheduled"] = summary_s(
            [st.t_first_content - st.t_scheduled for st in population
             if st.t_scheduled is not None and st.t_sent is not None and st.t_first_content is not None], shown)
    slowest = sorted(with_content, key=lambda st: st.ttft_ns or 0, reverse=True)[:3]
    evidence["slowest"] = [{"id": st.id, "ttft_s": s(st.ttft_ns)} for st in slowest]
    return evidence


def _censored_wait_ns(stream: StreamRecord) -> int | None:
    """How long a stream waited for content it never got, when it was really waiting for it."""
    if stream.t_first_content is not None or not ended_waiting(stream):
        return None
    assert stream.t_sent is not None and stream.t_end is not None
    return stream.t_end - stream.t_sent


def _buffering_ratio(streams: list[StreamRecord]) -> float | None:
    """Median of TTFT / end-to-end over streams with several content events: near 1 means the
    whole response arrived at once (a buffering proxy), near 1/n means tokens flowed."""
    ratios = []
    for st in streams:
        if len(st.t_content) < 2 or st.t_sent is None or st.ttft_ns is None:
            continue
        e2e = st.t_content[-1] - st.t_sent
        if e2e > 0:
            ratios.append(st.ttft_ns / e2e)
    return float(np.median(ratios)) if ratios else None
