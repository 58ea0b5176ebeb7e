"""`fluidity`: tokens delivered by per-token deadlines at a target pace, slack carried forward.

A reader takes tokens at a pace. A token that arrives before the reader needs it builds slack,
and slack hides a later stall; a stall before any slack is built is seen at once. Two stacks
with the same p90 gap can therefore read very differently: one that stalls at the second token
and one that stalls near the end of a long, fast stream. This is Etalon's fluidity-index
(Agrawal et al. 2024; ``etalon/metrics/metric_utils.py``, ``get_request_level_deadline_miss_rate``),
computed the same way:

- the first token's deadline is ``ttft`` after the request was sent (unset: the first token is
  not judged and deadlines start at it); every later token's is ``pace`` after the one before,
  plus the slack carried forward: slack grows by ``deadline - arrival`` for each token on time;
- a late token misses every deadline that passed before it came (``1 + (wait - slack - ttft) //
  pace`` for the first token, ``(gap - slack) // pace`` for later ones), and the slack resets;
- a stream that ended while waiting for its next token (a timeout, a cut read, a client that gave
  up) misses the deadlines that passed by then; tokens are content events, as for ``itl``.

The figure is the share of all deadlines met (pooled over the judged streams, in send order),
judged against ``min_on_time`` with a Clopper-Pearson interval for the series' effective size
(misses come in runs, so it is much smaller than the number of deadlines). ``max_missed_run``,
when given, fails the verdict on its own when one stream misses more deadlines in a row: what a
reader experiences as a stall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Verdict, verifier
from sla.common import SHARE_CONFIDENCE, ended_waiting, rel_s
from sla.stats import judge_share

__all__ = ["StreamDeadlines", "deadlines", "Fluidity"]

SCHEMA = Schema(
    (
        Param("pace", "duration", required=True, min=1e-6, doc="the target time between tokens (content events)"),
        Param("ttft", "duration",
              doc="the first token's deadline after sending; unset: deadlines start at the first token"),
        Param("min_on_time", "fraction", default=0.95, doc="the smallest share of deadlines that must be met"),
        Param("max_missed_run", "int", min=1,
              doc="the most deadlines one stream may miss in a row; unset: not checked"),
        SHARE_CONFIDENCE,
    )
)


@dataclass
class StreamDeadlines:
    """One stream's deadlines: 1 met, 0 missed, in order; and its longest run of misses."""

    stream_id: str
    outcomes: list[int] = field(default_factory=list)
    longest_run: int = 0
    longest_run_at: int | None = None  # stamp of the token (or end) that closed the longest run
    lateness_ns: list[float] = field(default_factory=list)  # per late token: how far past its deadline
    current_run: int = 0  # misses since the last deadline met

    def add(self, met: bool, missed: int = 0, at: int | None = None, late_ns: float = 0.0) -> None:
        if met:
            self.outcomes.append(1)
            self.current_run = 0
            return
        self.lateness_ns.append(late_ns)
        self.outcomes.extend([0] * missed)
        self.current_run += missed  # misses right before these extend the run
        if self.current_run > self.longest_run:
            self.longest_run, self.longest_run_at = self.current_run, at

    @property
    def index(self) -> float | None:
        return sum(self.outcomes) / len(self.outcomes) if self.outcomes else None


def deadlines(stream: StreamRecord, pace: float, ttft: float | None) -> StreamDeadlines:
    """The deadline outcomes of one stream (pace and ttft in seconds). Slack earned by an early
    token carries forward to the next deadline; a miss spends it all."""
    out = StreamDeadlines(stream.id)
    if stream.t_sent is None:
        return out
    d_pace, d_ttft = pace * NS, None if ttft is None else ttft * NS
    slack = 0.0
    if stream.t_content and d_ttft is not None:
        slack = _meet(out, stream.t_content[0] - stream.t_sent, d_ttft, slack, d_pace, stream.t_content[0], first=True)
    for before, after in zip(stream.t_content, stream.t_content[1:], strict=False):  # consecutive pairs
        slack = _meet(out, after - before, d_pace, slack, d_pace, after, first=False)
    if ended_waiting(stream) and stream.t_end is not None:
        # a stream that ended while waiting for its next token missed the deadlines that passed
        missed, late = _missed_while_waiting(stream, d_pace, d_ttft, slack)
        if missed > 0:
            out.add(False, missed, stream.t_end, late)
    return out


def _meet(out: StreamDeadlines, wait: float, deadline: float, slack: float, d_pace: float, at: int, *,
          first: bool) -> float:
    """Record one wait against its deadline (plus the slack carried); the slack carried on."""
    if wait <= deadline + slack:
        out.add(True)
        return slack + deadline - wait
    late = wait - slack - deadline
    # the first token's own deadline counts as one miss, then one per pace it ran past it
    missed = 1 + math.floor(late / d_pace) if first else math.floor((wait - slack) / d_pace)
    out.add(False, missed, at, late)
    return 0.0


def _missed_while_waiting(stream: StreamRecord, d_pace: float, d_ttft: float | None, slack: float) -> tuple[int, float]:
    """(deadlines missed, how late) by a stream that ended waiting for its next (or first) token."""
    assert stream.t_end is not None and stream.t_sent is not None
    if stream.t_content:
        waited = stream.t_end - stream.t_content[-1]
        return (math.floor((waited - slack) / d_pace) if waited > d_pace + slack else 0), waited - slack - d_pace
    if d_ttft is not None:
        waited = stream.t_end - stream.t_sent
        return (1 + math.floor((waited - d_ttft) / d_pace) if waited > d_ttft else 0), waited - d_ttft
    return 0, 0.0


@verifier
@dataclass(frozen=True, kw_only=True)
class Fluidity(SlaSpec):
    kind = "fluidity"
    summary = "share of tokens on time against per-token deadlines at a pace, slack carried forward"
    schema = SCHEMA
    timing = True
    better = "higher"
    capacity_fit = True
    needs = ()
    sample_label = None

    pace: float
    ttft: float | None
    min_on_time: float
    max_missed_run: int | None
    confidence: float

    def samples(self, obs: Observations, phase: str | None) -> list[float]:
        """Each deadline's outcome (1 on time, 0 missed), streams in send order, each stream's in order."""
        return [float(v) for d in self._per_stream(obs, phase) for v in d.outcomes]

    def _per_stream(self, obs: Observations, phase: str | None) -> list[StreamDeadlines]:
        population = sorted(obs.population(phase), key=lambda st: st.t_sent if st.t_sent is not None else 0)
        return [d for d in (deadlines(st, self.pace, self.ttft) for st in population) if d.outcomes]

    def budget_rule(self) -> BudgetRule:
        return BudgetRule("share", "min_on_time", "fraction")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        pace: float = self.pace
        ttft: float | None = self.ttft
        floor: float = self.min_on_time
        max_run: int | None = self.max_missed_run
        confidence: float = self.confidence
        per_stream = self._per_stream(obs, phase)
        series = [v for d in per_stream for v in d.outcomes]  # = self.samples(obs, phase)

        status, share, _, _, evidence = judge_share(series, floor, confidence)
        worst = max(per_stream, key=lambda d: d.longest_run, default=None)
        indices = [d.index for d in per_stream if d.index is not None]
        evidence.update(
            share=share,
            pace_s=pace,
            ttft_s=ttft,
            deadlines=len(series),
            missed=len(series) - int(sum(series)),
            streams=len(per_stream),
            stream_index_p10=float(np.quantile(indices, 0.1)) if indices else None,
            streams_at_least_90pct=sum(1 for i in indices if i >= 0.9),  # Etalon's per-request criterion
            longest_missed_run=worst.longest_run if worst else 0,
            longest_missed_run_stream=worst.stream_id if worst and worst.longest_run else None,
            longest_missed_run_at_s=rel_s(obs, worst.longest_run_at) if worst and worst.longest_run else None,
            decided_by="share",
            equivalents="Etalon fluidity-index (pooled as its service-level deadline miss rate)",
        )
        figure, budget, unit = share, floor, "fraction"
        if max_run is not None:
            evidence["max_missed_run"] = max_run
            if worst is not None and worst.longest_run > max_run:
                # one stall a reader sees decides, whatever the share; the table shows the run against its budget
                status = "fail"
                evidence["decided_by"] = "missed_run"
                figure, budget, unit = float(worst.longest_run), float(max_run), "deadlines"
        lateness = [late for d in per_stream for late in d.lateness_ns]
        if evidence["decided_by"] == "missed_run" and worst is not None and max_run is not None:
            # what a saturated load generator's lag would have to explain (chaos.execution.verify): the
            # stall beyond the budget, in seconds. Not the median lateness: a frozen engine's one 2 s
            # stall per stream sits among many tokens a busy box made a few ms late, and that median
            # (a few ms) let a 20 ms client lag excuse a 40-deadline stall (a CI run of container-freeze)
            evidence["excess_s"] = (worst.longest_run - max_run) * pace
        elif status == "fail" and lateness:
            # the same for a share verdict: how late the typical late token was past its deadline
            evidence["excess_s"] = float(np.median(lateness)) / NS
        if not series:
            evidence["reason"] = "no deadlines: no judged stream produced content or waited past its first deadline"
        return Verdict("fluidity", phase, status, figure, budget, unit, len(series), evidence)
