"""`ttft`: a quantile of the time from request sent to first non-empty content, against a budget.

What counts: every judged stream that produced content, including streams a client fault hung up
on *after* their first content (that first content was really seen). Excluded from the sample
but counted in the evidence: streams hung up on before any content (the client left on purpose)
and streams that produced no content at all (an error, an empty completion, a cut stream) —
their time to first content does not exist; `errors` and `early_close` judge them.
Time to first byte is reported beside the figure: a TTFB far below TTFT points at a server or a
proxy that holds content back (a buffering proxy shows TTFT equal to end-to-end latency).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from chaos.observations import Observations, StreamRecord
from chaos.params import Param, Schema
from sla.base import Verdict, verifier
from sla.common import CONFIDENCE, MAX_IDS, QuantileParam, content_less_reason, quantile_label, s, summary_s
from sla.stats import judge_quantile

__all__ = ["ttft", "ttft_samples"]

SCHEMA = Schema(
    (
        QuantileParam("quantile", default=0.99, doc="which quantile of TTFT is budgeted (0.99 or p99)"),
        Param("budget", "duration", required=True, doc="the most the quantile may be"),
        CONFIDENCE,
    )
)


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


@verifier("ttft", SCHEMA, "time to first non-empty content token, a quantile against a budget")
def ttft(obs: Observations, params: Mapping[str, Any], phase: str | None) -> Verdict:
    q: float = params["quantile"]
    budget: float = params["budget"]
    confidence: float = params["confidence"]
    population = obs.population(phase)
    values_ns, hung_up, no_content = ttft_samples(population)
    with_content = [st for st in population if st.ttft_ns is not None]

    status, figure, _, _, evidence = judge_quantile([v / 1e9 for v in values_ns], q, budget, confidence)
    label = quantile_label(q)
    ttfb_ns = [st.ttfb_ns for st in with_content if st.ttfb_ns is not None]
    shown = sorted({0.5, 0.9, 0.99, q})
    evidence["ttft"] = summary_s(values_ns, shown)
    evidence["ttfb"] = summary_s(ttfb_ns, shown)  # first byte, beside first content
    evidence[f"ttfb_{label}"] = evidence["ttfb"][label]
    evidence["ttft_over_e2e_p50"] = _buffering_ratio(with_content)
    evidence["hung_up_before_content"] = len(hung_up)
    evidence["no_content"] = len(no_content)
    evidence["no_content_by_reason"] = dict(Counter(content_less_reason(st) for st in no_content))
    evidence["no_content_ids"] = [st.id for st in no_content[:MAX_IDS]]
    slowest = sorted(with_content, key=lambda st: st.ttft_ns or 0, reverse=True)[:3]
    evidence["slowest"] = [{"id": st.id, "ttft_s": s(st.ttft_ns)} for st in slowest]
    return Verdict(
        sla="ttft",
        phase=phase,
        status=status,
        figure=figure,
        budget=budget,
        unit="s",
        samples=len(values_ns),
        evidence=evidence,
    )


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
