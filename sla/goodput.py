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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaos.observations import NS, STRICT_END, EndRule, Observations, StreamRecord
from chaos.params import Param, Schema
from sla.base import Status, Verdict, verifier
from sla.common import MAX_IDS, SHARE_CONFIDENCE
from sla.definitions import definition_line, e2e_ns, output_tokens, tpot_ns
from sla.errors import error_kinds
from sla.stats import judge_share
from sla.throughput import window

__all__ = ["Objectives", "goodput", "miss_excess_ns", "request_outcome"]

SCHEMA = Schema(
    (
        Param("ttft", "duration", doc="time to first token objective (sla.definitions ttft); unset: not judged"),
        Param("tpot", "duration", doc="time per output token objective, first token excluded (tpot); unset: not judged"),
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


def request_outcome(stream: StreamRecord, objectives: Objectives, rule: EndRule = STRICT_END) -> tuple[bool | None, list[str]]:
    """(good, misses): True/False, or None when a client fault's hang-up leaves it unknown;
    ``misses`` names each objective missed and each way the request failed."""
    misses: list[str] = []
    waited = (stream.t_end - stream.t_sent) if stream.t_sent is not None and stream.t_end is not None else None
    ttft = stream.ttft_ns
    if objectives.ttft is not None:
        if ttft is not None and ttft > objectives.ttft * NS:
            misses.append("ttft")
        elif ttft is None and waited is not None and waited >= objectives.ttft * NS:
            misses.append("ttft")  # no first token that long after sending, whatever came later
    if objectives.e2e is not None:
        e2e = e2e_ns(stream) if stream.is_complete(rule) else None
        if e2e is not None and e2e > objectives.e2e * NS:
            misses.append("e2e")
        elif e2e is None and waited is not None and waited >= objectives.e2e * NS:
            misses.append("e2e")  # still not complete that long after sending
    if objectives.tpot is not None and stream.is_complete(rule):
        tpot = tpot_ns(stream)
        if tpot is not None and tpot > objectives.tpot * NS:
            misses.append("tpot")
    if stream.hangup is not None:
        return (False, misses) if misses else (None, [])
    failures = error_kinds(stream)
    if failures:
        misses.extend(f"error:{kind}" for kind in failures)
    elif not stream.is_complete(rule):
        misses.append("incomplete")
    return not misses, misses


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


@verifier("goodput", SCHEMA, "share (or rate) of requests that completed and met every ttft/tpot/e2e objective")
def goodput(obs: Observations, params: Mapping[str, Any], phase: str | None) -> Verdict:
    objectives = Objectives(params.get("ttft"), params.get("tpot"), params.get("e2e"))
    confidence: float = params["confidence"]
    by_rate = params.get("min_rate") is not None
    floor: float = params["min_rate"] if by_rate else params["min_share"]
    unit = "requests/s" if by_rate else "fraction"
    population = sorted(obs.population(phase), key=lambda st: st.t_sent if st.t_sent is not None else 0)
    rule = obs.end_rule  # the engine's end-of-stream rule, as the run recorded it

    outcomes: list[float] = []
    miss_reasons: Counter[str] = Counter()
    missed_ids: list[str] = []
    excesses: list[float] = []
    unknown = 0
    for stream in population:
        good, misses = request_outcome(stream, objectives, rule)
        if good is None:
            unknown += 1
            continue
        outcomes.append(1.0 if good else 0.0)
        miss_reasons.update(misses)
        if misses:
            excesses.append(miss_excess_ns(stream, objectives, rule) / NS)
            if len(missed_ids) < MAX_IDS:
                missed_ids.append(stream.id)

    evidence: dict[str, Any] = {
        "objectives_s": objectives.named(),
        "definitions": [definition_line(name) for name in objectives.named()],
        "judged": len(outcomes),
        "good": int(sum(outcomes)),
        "misses_by_reason": dict(miss_reasons),
        "missed_ids": missed_ids,
        "hung_up_unknown": unknown,  # hung up by a client fault before any objective was missed
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
        # what a saturated load generator's lag would have to explain (chaos.verify): the typical
        # miss's distance past its objectives; failures and cut streams are infinitely far
        evidence["excess_s"] = float(np.median(excesses))
    figure = share
    if by_rate and share is not None:
        figure = share * scale
        evidence["lower"] = None if lower is None else lower * scale
        evidence["upper"] = None if upper is None else upper * scale
    return Verdict("goodput", phase, status, figure, floor, unit, len(outcomes), evidence)
