"""`ttft`: a quantile of the time from request sent to the first token, against a budget.

``to: token`` (the default) stops the clock at the first token of any kind: content, reasoning
(``delta.reasoning_content``) or a tool-call fragment (AIPerf's TTFT, GuideLLM's since it counts
reasoning). ``to: output`` stops it at the first visible output, content or a tool call but not
reasoning (AIPerf's TTFO): what a user of a reasoning model waits for. Without reasoning the two are
the same figure.

What counts: every judged stream that produced what the clock stops at, including streams a client
fault hung up on *after* it (it was really seen). Streams that waited for it and never got it — a
read timeout, a client that gave up after a time, a stream still waiting when the run ended, and
with ``to: output`` a reasoning stream cut before its output — are right-censored: their figure is
known to exceed how long they waited. When that wait already exceeds the budget they count as over
budget (at the wait, a lower bound), so a server that never answers cannot pass; when it does not,
their figure is unknown and they are left out. Other streams without it (HTTP or connect errors, an
empty completion, a client that left while queued) are excluded and counted in the evidence;
`errors` and `early_close` judge them.
Time to first byte is reported beside the figure: a TTFB far below TTFT points at a server or a
proxy that holds content back (a buffering proxy shows TTFT equal to end-to-end latency).
Under open-loop arrivals the evidence also gives the schedule delay (scheduled → sent: a client
backlog, or the in-flight cap's queue) and TTFT measured from the scheduled time, as its own
figure: a user who arrived on schedule waited that long, whatever the client's queue hid
(coordinated omission; the failure of ``vllm bench serve`` reported as vLLM #54101).
From the client's connection stamps the evidence also takes TTFT apart (``ttft_parts``: the TCP connect
and TLS handshake of a new connection, request → response head, head → first token; ``sla.ttft_parts``),
with how many streams came on a new connection and over which protocol.
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
from sla.ttft_parts import parts_evidence

__all__ = ["TO", "first_stamp", "judged_in_send_order", "Ttft", "ttft_samples"]

TO = ("token", "output")  # what the clock stops at: the first token of any kind, or the first visible output

SCHEMA = Schema(
    (
        QuantileParam("quantile", default=0.99, doc="which quantile of TTFT is budgeted (0.99 or p99)"),
        Param("budget", "duration", required=True, doc="the most the quantile may be"),
        Param("to", "choice", "token", choices=TO,
              doc="token: to the first token of any kind, reasoning included (AIPerf's TTFT); output: to the first "
                  "visible output, content or a tool call (AIPerf's TTFO)"),
        CONFIDENCE,
    )
)


def first_stamp(stream: StreamRecord, to: str = "token") -> int | None:
    """When the clock of ``to`` stops for ``stream``: its first token (any kind) or its first output."""
    return stream.t_first_token if to == "token" else stream.t_first_output


def _value_ns(stream: StreamRecord, to: str) -> int | None:
    return stream.ttft_ns if to == "token" else stream.ttfo_ns


def judged_in_send_order(population: list[StreamRecord], budget: float, to: str = "token") -> list[int]:
    """The judged TTFTs in ns, in the order the requests were sent (ties keep the journal order):
    the TTFT (``to: token``) or TTFO (``to: output``) of every stream that has one, and the wait of every
    stream censored past ``budget``. The order matters: the interval's effective sample size comes from
    its autocorrelation."""
    judged: list[tuple[int, int, int]] = []
    for index, stream in enumerate(population):
        value = _value_ns(stream, to)
        if value is None:
            wait = _censored_wait_ns(stream, to)
            value = wait if wait is not None and wait >= budget * 1e9 else None
        if value is not None:
            judged.append((stream.t_sent if stream.t_sent is not None else 0, index, value))
    judged.sort()
    return [value for _, _, value in judged]


def ttft_samples(streams: list[StreamRecord], to: str = "token") -> tuple[list[int], list[StreamRecord],
                                                                          list[StreamRecord]]:
    """(TTFT in ns of streams with a first token (or output), hung up before it, without it for another
    reason)."""
    values: list[int] = []
    hung_up: list[StreamRecord] = []
    no_content: list[StreamRecord] = []
    for stream in streams:
        ttft_ns = _value_ns(stream, to)
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
    summary = ("time to first token (any kind, reasoning included) or, with to: output, to first visible output: "
               "a quantile against a budget")
    schema = SCHEMA
    timing = True
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = "time to first token"

    quantile: float
    budget: float
    confidence: float
    to: str = "token"

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        population = obs.population(phase)
        values = self._samples(population)
        status, figure, _, _, evidence = judge_quantile(values, self.quantile, self.budget, self.confidence)
        evidence.update(_evidence(population, values, self.budget, self.quantile, self.to))
        return Verdict("ttft", phase, status, figure, self.budget, "s", len(values), evidence)

    def samples(self, obs: Observations, phase: str | None) -> list[float]:
        """TTFT (or TTFO) in seconds, in send order: every stream that has one, and every wait censored past
        the budget (counted at the wait, a lower bound)."""
        return self._samples(obs.population(phase))

    def _samples(self, population: list[StreamRecord]) -> list[float]:
        return [v / NS for v in judged_in_send_order(population, self.budget, self.to)]

    def budget_rule(self) -> BudgetRule:
        return BudgetRule("quantile", "budget", "s")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        # the live halt times the first token of any kind; with to: output it is still sound (a stream's
        # first output never comes before its first token), only later to trip
        return HaltSpec("ttft", window=window_s, above=factor * self.budget, quantile=self.quantile,
                        min_streams=min_streams)


def _evidence(population: list[StreamRecord], values: list[float], budget: float, q: float,
              to: str = "token") -> dict[str, Any]:
    """What a TTFT verdict shows beside its figure: the distribution, first byte beside first token (or
    output), the streams censored or left out and why, the open-loop schedule, the slowest streams, and
    for reasoning streams the figure the other ``to`` gives. Pure."""
    _, hung_up, no_content = ttft_samples(population, to)
    with_content = [st for st in population if _value_ns(st, to) is not None]
    waited = [w for w in (_censored_wait_ns(st, to) for st in hung_up + no_content) if w is not None]
    over_budget = [w for w in waited if w >= budget * 1e9]
    label = quantile_label(q)
    ttfb_ns = [st.ttfb_ns for st in with_content if st.ttfb_ns is not None]
    shown = sorted({0.5, 0.9, 0.99, q})
    evidence: dict[str, Any] = {"definition": definition_line("ttft" if to == "token" else "ttfo"), "to": to}
    evidence["ttft"] = summary_seconds(values, shown)
    reasoning = [st for st in population if st.t_reasoning]
    if reasoning:  # the other clock beside it: how much of the wait was reasoning
        evidence["reasoning_streams"] = len(reasoning)
        evidence["ttfo" if to == "token" else "ttft_any_token"] = summary_s(
            [v for v in (_value_ns(st, "output" if to == "token" else "token") for st in population)
             if v is not None], shown)
    evidence["ttfb"] = summary_s(ttfb_ns, shown)  # first byte, beside first token
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
            [first - st.t_scheduled for st in population
             if st.t_scheduled is not None and st.t_sent is not None
             and (first := first_stamp(st, to)) is not None], shown)
    parts = parts_evidence(with_content, [first_stamp(st, to) for st in with_content], shown)
    if parts is not None:  # connect, TLS handshake, request → head, head → first token (sla.ttft_parts)
        evidence["ttft_parts"] = parts
    slowest = sorted(with_content, key=lambda st: _value_ns(st, to) or 0, reverse=True)[:3]
    evidence["slowest"] = [{"id": st.id, "ttft_s": s(_value_ns(st, to))} for st in slowest]
    return evidence


def _censored_wait_ns(stream: StreamRecord, to: str = "token") -> int | None:
    """How long a stream waited for a first token (or output) it never got, when it was really waiting."""
    if first_stamp(stream, to) is not None or not ended_waiting(stream):
        return None
    assert stream.t_sent is not None and stream.t_end is not None
    return stream.t_end - stream.t_sent


def _buffering_ratio(streams: list[StreamRecord]) -> float | None:
    """Median of TTFT / end-to-end over streams with several token events: near 1 means the
    whole response arrived at once (a buffering proxy), near 1/n means tokens flowed."""
    ratios = []
    for st in streams:
        stamps = st.t_tokens
        if len(stamps) < 2 or st.t_sent is None or st.ttft_ns is None:
            continue
        e2e = stamps[-1] - st.t_sent
        if e2e > 0:
            ratios.append(st.ttft_ns / e2e)
    return float(np.median(ratios)) if ratios else None
