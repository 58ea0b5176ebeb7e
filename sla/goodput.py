"""`goodput`: the share (or the rate) of requests that met every objective at once.

A request is good when it completed (finish_reason, ``[DONE]``, no error) and met every listed
objective: ``ttft``, ``tpot`` and ``e2e`` as ``sla.definitions`` defines them. This is the
goodput of DistServe, of vLLM's ``bench serve --goodput`` (good completed requests / duration)
and of AIPerf (good request count / duration; good request fraction = good / (valid + errored)):
a stack whose p99 TTFT and p99 TPOT each pass can still serve few requests that meet both.

Misses: a request that failed (HTTP error, transport error, in-band error, cut without a terminal
event) is a miss, and so is one whose wait is censored past an objective (it waited longer than
the TTFT or E2E objective for content or a completion that had not come when it ended). A stream a client fault
hung up on purpose is judged by what was seen before: a miss if an objective was already
exceeded (no first token, or no completion, that long after sending is a known miss whatever came
later), otherwise left out (its fate is unknown) and counted in the evidence, as `ttft` does.
A single-token request has no TPOT and meets that objective, as in vLLM.

The verdict is a share with a Clopper-Pearson interval for the effective sample size of the
good/miss series in send order (``sla.stats.judge_share``): ``min_share`` passes when the lower
bound reaches it and fails when the upper bound stays under it. ``min_rate`` judges good requests
per second over the phase window, its bounds being the share's times the requests sent per second.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, STRICT_END, EndRule, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS, SHARE_CONFIDENCE
from sla.definitions import definition_line, e2e_ns, output_tokens, tpot_ns
from sla.stats import judge_share
from sla.stream_errors import error_kinds
from sla.throughput import window

__all__ = ["Objectives", "Goodput", "miss_excess_ns", "request_outcome"]

SCHEMA = Schema(
    (
        Param("ttft", "duration", doc="time to first token objective (sla.definitions ttft); unset: not judged"),
        Param("tpot", "duration",
              doc="time per output token objective, first token excluded (tpot); unset: not judged"),
        Param("e2e", "duration", doc="end-to-end latency objective (e2e); unset: not judged"),
        Param("min_share", "fraction", doc="the smallest share of judged requests that must be good"),
        Param("min_rate", "rate", doc="the fewest good requests per second over the phase window"),
        SHARE_CONFIDENCE,
    ),
    one_of=(("min_share", "min_rate"),),
)


@dataclass(frozen=True)
class Objectives:
    """Per-request latency objectives in seconds; None: not judged."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    def named(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft", self.ttft), ("tpot", self.tpot), ("e2e", self.e2e)) if v is not None}


def request_outcome(stream: StreamRecord, objectives: Objectives,
                    rule: EndRule = STRICT_END) -> tuple[bool | None, list[str]]:
    """(good, misses): True/False, or None when a client fault's hang-up leaves it unknown;
    ``misses`` names each objective missed and each way the request failed."""
    misses = _objectives_missed(stream, objectives, rule)
    if stream.hangup is not None:
        return (False, misses) if misses else (None, [])
    failures = error_kinds(stream)
    if failures:
        misses.extend(f"error:{kind}" for kind in failures)
    elif not stream.is_complete(rule):
        misses.append("incomplete")
    return not misses, misses


def _objectives_missed(stream: StreamRecord, objectives: Objectives, rule: EndRule) -> list[str]:
    """The latency objectives a request missed: by its figure, or by waiting past the objective
    for a first token (ttft) or a complete response (e2e) that never came."""
    waited = (stream.t_end - stream.t_sent) if stream.t_sent is not None and stream.t_end is not None else None
    complete = stream.is_complete(rule)
    checks = (
        ("ttft", objectives.ttft, stream.ttft_ns, True),
        ("e2e", objectives.e2e, e2e_ns(stream) if complete else None, True),
        ("tpot", objectives.tpot, tpot_ns(stream) if complete else None, False),  # only of a complete response
    )
    misses = []
    for name, objective, figure_ns, waiting_counts in checks:
        if objective is None:
            continue
        if figure_ns is not None:
            missed = figure_ns > objective * NS
        else:  # no figure: waited that long after sending without a first token / a complete response
            missed = waiting_counts and waited is not None and waited >= objective * NS
        if missed:
            misses.append(name)
    return misses


def miss_excess_ns(stream: StreamRecord, objectives: Objectives, rule: EndRule = STRICT_END) -> float:
    """How far a missed request is past its objectives, in ns, as a late clock would have to explain
    it: the largest of TTFT and E2E over their objectives and of TPOT's excess over all its gaps
    (a client late by L stamps the last token at most L late, so TPOT by L / (tokens - 1));
    infinite for a request that failed or did not complete, which no lateness explains."""
    if stream.hangup is None and (error_kinds(stream) or not stream.is_complete(rule)):
        return math.inf
    excess = 0.0
    waited = (stream.t_end - stream.t_sent) if stream.t_sent is not None and stream.t_end is not None else None
    if objectives.ttft is not None:
        ttft = stream.ttft_ns if stream.ttft_ns is not None else waited
        if ttft is not None:
            excess = max(excess, ttft - objectives.ttft * NS)
    if objectives.e2e is not None:
        e2e = e2e_ns(stream) if stream.is_complete(rule) else waited
        if e2e is not None:
            excess = max(excess, e2e - objectives.e2e * NS)
    if objectives.tpot is not None and stream.is_complete(rule):
        tpot = tpot_ns(stream)
        if tpot is not None:
            excess = max(excess, (tpot - objectives.tpot * NS) * (output_tokens(stream) - 1))
    return excess


@dataclass
class _Tally:
    """Each judged request's outcome (1 good, 0 missed, in send order) and what the misses were."""

    outcomes: list[float] = field(default_factory=list)
    miss_reasons: Counter[str] = field(default_factory=Counter)
    missed_ids: list[str] = field(default_factory=list)
    excesses: list[float] = field(default_factory=list)  # seconds past the objectives, per miss
    unknown: int = 0  # hung up by a client fault before any objective was missed


def _tally(population: Sequence[StreamRecord], objectives: Objectives, rule: EndRule) -> _Tally:
    tally = _Tally()
    for stream in population:
        good, misses = request_outcome(stream, objectives, rule)
        if good is None:
            tally.unknown += 1
            continue
        tally.outcomes.append(1.0 if good else 0.0)
        tally.miss_reasons.update(misses)
        if misses:
            tally.excesses.append(miss_excess_ns(stream, objectives, rule) / NS)
            if len(tally.missed_ids) < MAX_IDS:
                tally.missed_ids.append(stream.id)
    return tally


@verifier
@dataclass(frozen=True, kw_only=True)
class Goodput(SlaSpec):
    kind = "goodput"
    summary = "share (or rate) of requests that completed and met every ttft/tpot/e2e objective"
    schema = SCHEMA
    timing = True
    better = "higher"
    capacity_fit = True
    needs = ()
    sample_label = None

    ttft: float | None
    tpot: float | None
    e2e: float | None
    min_share: float | None
    min_rate: float | None
    confidence: float

    def samples(self, obs: Observations, phase: str | None) -> list[float]:
        """Each judged request's outcome (1 good, 0 missed), in send order; hung up before any objective
        was missed: left out."""
        return self._tally(obs, phase).outcomes

    def _tally(self, obs: Observations, phase: str | None) -> _Tally:
        population = sorted(obs.population(phase), key=lambda st: st.t_sent if st.t_sent is not None else 0)
        return _tally(population, Objectives(self.ttft, self.tpot, self.e2e), obs.end_rule)

    def budget_rule(self) -> BudgetRule:
        return (BudgetRule("share", "min_rate", "requests/s") if self.min_rate is not None
                else BudgetRule("share", "min_share", "fraction"))

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        objectives = Objectives(self.ttft, self.tpot, self.e2e)
        confidence: float = self.confidence
        by_rate = self.min_rate is not None
        floor = self.min_rate if by_rate else self.min_share
        assert floor is not None  # the schema's one_of: exactly one is given
        unit = "requests/s" if by_rate else "fraction"
        tally = self._tally(obs, phase)  # under the engine's end-of-stream rule, as the run recorded it
        outcomes, excesses = tally.outcomes, tally.excesses  # outcomes: self.samples(obs, phase)

        evidence: dict[str, Any] = {
            "objectives_s": objectives.named(),
            "definitions": [definition_line(name) for name in objectives.named()],
            "judged": len(outcomes),
            "good": int(sum(outcomes)),
            "misses_by_reason": dict(tally.miss_reasons),
            "missed_ids": tally.missed_ids,
            "hung_up_unknown": tally.unknown,  # hung up by a client fault before any objective was missed
            "equivalents": "vLLM bench serve: request goodput (req/s); AIPerf: goodput, good_request_fraction",
        }
        floor_share = floor
        scale = 1.0
        if by_rate:
            span = window(obs, phase)
            if span is None or span[1] <= span[0]:
                evidence["reason"] = "no closed phase window to divide by"
                return Verdict("goodput", phase, "inconclusive", None, floor, unit, len(outcomes), evidence)
            seconds = (span[1] - span[0]) / NS
            scale = len(outcomes) / seconds  # judged requests per second: share x scale = good per second
            evidence.update(window_s=seconds, judged_per_s=scale)
            floor_share = floor / scale if scale > 0 else float("inf")
        if floor_share > 1.0:
            evidence["reason"] = f"only {scale:.4g} requests/s were judged; no share of them can reach {floor:g}/s"
            status: Status = "fail" if outcomes else "inconclusive"
            return Verdict("goodput", phase, status, sum(outcomes) / (len(outcomes) / scale) if outcomes else None,
                           floor, unit, len(outcomes), evidence)

        status, share, lower, upper, judged = judge_share(outcomes, floor_share, confidence)
        evidence.update(judged)
        evidence["share"] = share
        if status == "fail" and excesses:
            # what a saturated load generator's lag would have to explain (chaos.execution.verify): the typical
            # miss's distance past its objectives; failures and cut streams are infinitely far
            evidence["excess_s"] = float(np.median(excesses))
        figure = share
        if by_rate and share is not None:
            figure = share * scale
            evidence["lower"] = None if lower is None else lower * scale
            evidence["upper"] = None if upper is None else upper * scale
        return Verdict("goodput", phase, status, figure, floor, unit, len(outcomes), evidence)
