"""`itl`: a quantile of the gaps between token events, against a budget, plus the longest stall.

The sample is every gap between consecutive token events of every judged stream (per chunk,
as the client saw it: a chunk may carry several tokens), streams in the order they were sent and
each stream's gaps in order. ``within`` says which events: ``all`` (the default) every event that
carried a token, content, reasoning or a tool-call fragment, merged in time order; ``reasoning`` or
``content`` only the events of that kind, so a stall inside the reasoning phase and one in the
visible answer are told apart. ``all`` is the default because it is today's figure for every stream
without reasoning or tool calls (their token events are their content events) and, for the others,
the gaps a reader of the whole stream waits through, as vLLM bench's ITL and AIPerf's inter-chunk
latency time every chunk: a default of ``content`` would leave a stall in the reasoning phase (a
stall a user of a reasoning model waits through, and the one a gateway's idle timeout cuts) out of
the default verdict. Gaps within one stream are correlated: the interval is computed for
the series' effective sample size (``sla.correlation``), which is why n_eff is in the evidence.
`max_stall` is the check that does not depend on any interval: one gap longer than the stall
budget fails the verdict, which is what a blocked event loop or a coalescing proxy produces.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, Observations
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Verdict, verifier
from sla.common import CONFIDENCE, QuantileParam, rel_s, s, summary_s
from sla.definitions import definition_line
from sla.stats import judge_quantile

__all__ = ["WITHIN", "gaps_in_send_order", "Itl"]

WITHIN = ("all", "reasoning", "content")

SCHEMA = Schema(
    (
        QuantileParam("quantile", default=0.99, doc="which quantile of the gaps is budgeted (0.99 or p99)"),
        Param("budget", "duration", required=True, doc="the most the gap quantile may be"),
        Param("max_stall", "duration", doc="the longest single gap allowed; unset: not checked"),
        Param("within", "choice", "all", choices=WITHIN,
              doc="all: gaps between every token event (content, reasoning, tool-call fragments, merged); reasoning "
                  "or content: gaps between that kind's events only"),
        CONFIDENCE,
    )
)


def gaps_in_send_order(obs: Observations, phase: str | None, within: str = "all") -> list[int]:
    """Every gap in ns, streams in the order they were sent, each stream's gaps in order."""
    population = sorted(obs.population(phase), key=lambda st: st.t_sent if st.t_sent is not None else 0)
    return [gap for stream in population for gap in stream.gaps_within(within)]


@verifier
@dataclass(frozen=True, kw_only=True)
class Itl(SlaSpec):
    kind = "itl"
    summary = ("gaps between token events (all, or within reasoning or content only): a quantile against a budget, "
               "and the longest stall")
    schema = SCHEMA
    timing = True
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = "gap between token events"

    quantile: float
    budget: float
    max_stall: float | None
    confidence: float
    within: str = "all"

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        q: float = self.quantile
        budget: float = self.budget
        max_stall: float | None = self.max_stall
        confidence: float = self.confidence

        gaps_ns: list[int] = []
        longest: tuple[int, str, int] | None = None  # (gap, stream id, when the gap ended)
        streams_with_gaps = 0
        population = sorted(obs.population(phase), key=lambda st: st.t_sent if st.t_sent is not None else 0)
        for stream in population:
            stream_gaps = stream.gaps_within(self.within)
            if not stream_gaps:
                continue
            streams_with_gaps += 1
            gaps_ns.extend(stream_gaps)
            i = max(range(len(stream_gaps)), key=stream_gaps.__getitem__)
            if longest is None or stream_gaps[i] > longest[0]:
                longest = (stream_gaps[i], stream.id, stream.stamps_within(self.within)[i + 1])

        values = [g / NS for g in gaps_ns]  # the gaps above, in seconds (``samples``)
        status, figure, _, _, evidence = judge_quantile(values, q, budget, confidence)
        evidence["definition"] = definition_line("itl")
        evidence["within"] = self.within
        evidence["gaps"] = summary_s(gaps_ns, sorted({0.5, 0.9, 0.99, q}))
        evidence["streams"] = streams_with_gaps
        evidence["longest_stall_s"] = s(longest[0]) if longest else None
        evidence["longest_stall_stream"] = longest[1] if longest else None
        evidence["longest_stall_ended_at_s"] = rel_s(obs, longest[2]) if longest else None
        evidence["decided_by"] = "quantile"
        shown_figure, shown_budget = figure, budget

        if max_stall is not None:
            over = [g for g in gaps_ns if g / 1e9 > max_stall]
            evidence["max_stall_s"] = max_stall
            evidence["gaps_over_max_stall"] = len(over)
            if over and longest is not None:
                # One stall over its budget decides, whatever the quantile says; the table then shows
                # the stall against its own budget so that figure and budget explain the fail.
                status = "fail"
                evidence["decided_by"] = "max_stall"
                shown_figure, shown_budget = longest[0] / 1e9, max_stall

        return Verdict(
            sla="itl",
            phase=phase,
            status=status,
            figure=shown_figure,
            budget=shown_budget,
            unit="s",
            samples=len(gaps_ns),
            evidence=evidence,
        )

    def samples(self, obs: Observations, phase: str | None) -> list[float]:
        """Every gap between the token events ``within`` names, in seconds, streams in send order."""
        return [g / NS for g in gaps_in_send_order(obs, phase, self.within)]

    def budget_rule(self) -> BudgetRule:
        return BudgetRule("quantile", "budget", "s")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None  # no live gap halt: a probe's gaps are judged when its window ends
