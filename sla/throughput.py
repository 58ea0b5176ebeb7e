"""`throughput`: tokens or completed requests per second over a phase's window, against a floor.

Tokens are counted where they arrived: each token event (content, reasoning, a tool-call fragment)
inside the window counts, and when a stream reported ``usage.completion_tokens`` its tokens are
spread over its token events (a chunk can carry several tokens), so a stream straddling the window
edge counts only its inside part. Requests count when they completed (``StreamRecord.complete``)
inside the window. Without a closed window, or with no streams, there is nothing to divide by:
inconclusive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import rel_s
from sla.definitions import tokens_per_event

__all__ = ["Throughput", "window"]

SCHEMA = Schema(
    (
        Param("min_tokens_per_s", "rate", doc="the fewest generated tokens per second allowed"),
        Param("min_requests_per_s", "rate", doc="the fewest completed requests per second allowed"),
    ),
    one_of=(("min_tokens_per_s", "min_requests_per_s"),),
)


def window(obs: Observations, phase: str | None) -> tuple[int, int] | None:
    """The judged window in ns: the phase's, or from the first phase start to the last phase end."""
    if phase is not None:
        found = obs.phase(phase)
        if found is None or found.t_end is None:
            return None
        return found.t_start, found.t_end
    if not obs.phases or any(p.t_end is None for p in obs.phases):
        return None
    return min(p.t_start for p in obs.phases), max(p.t_end for p in obs.phases if p.t_end is not None)


def _tokens_in(stream: StreamRecord, t0: int, t1: int) -> tuple[float, bool]:
    """(tokens of ``stream`` that arrived in [t0, t1], whether usage counts were used)."""
    stamps = stream.t_tokens  # reasoning and tool-call fragments are generated tokens too, as usage counts them
    inside = sum(1 for t in stamps if t0 <= t <= t1)
    if not inside:
        return 0.0, False
    per_event = tokens_per_event(stream)
    return (inside * per_event, True) if per_event is not None else (float(inside), False)


@verifier
@dataclass(frozen=True, kw_only=True)
class Throughput(SlaSpec):
    kind = "throughput"
    summary = "generated tokens or completed requests per second over the phase window"
    schema = SCHEMA
    timing = True
    better = "higher"
    capacity_fit = True
    needs = ()
    sample_label = None
    decides_in_phase = False  # a rate over the whole window: the window is not over at a look

    min_tokens_per_s: float | None
    min_requests_per_s: float | None

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a point figure over the window, no sample of values

    def budget_rule(self) -> BudgetRule:
        return (BudgetRule("floor", "min_tokens_per_s", "tokens/s") if self.min_tokens_per_s is not None
                else BudgetRule("floor", "min_requests_per_s", "requests/s"))

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        by_tokens = self.min_tokens_per_s is not None
        floor = self.min_tokens_per_s if by_tokens else self.min_requests_per_s
        assert floor is not None  # the schema's one_of: exactly one is given
        unit = "tokens/s" if by_tokens else "requests/s"
        population = obs.population(phase)
        span = window(obs, phase)
        evidence: dict[str, Any] = {"streams": len(population)}
        if span is None:
            evidence["reason"] = (
                f"phase {phase!r} has no closed window" if phase is not None else "the run has no closed phase windows"
            )
            return Verdict("throughput", phase, "inconclusive", None, floor, unit, len(population), evidence)
        t0, t1 = span
        seconds = (t1 - t0) / NS
        evidence.update(window_start_s=rel_s(obs, t0), window_end_s=rel_s(obs, t1), window_s=seconds)
        if not population or seconds <= 0:
            evidence["reason"] = "no streams in the window" if not population else "the window is empty"
            return Verdict("throughput", phase, "inconclusive", None, floor, unit, len(population), evidence)

        counted = [_tokens_in(st, t0, t1) for st in population]
        tokens = sum(n for n, _ in counted)
        completed = sum(1 for st in population if obs.complete(st) and st.t_end is not None and t0 <= st.t_end <= t1)
        evidence.update(
            tokens=tokens,
            token_source="usage" if any(used for _, used in counted) else "content_events",
            completed_requests=completed,
            tokens_per_s=tokens / seconds,
            requests_per_s=completed / seconds,
        )
        figure = tokens / seconds if by_tokens else completed / seconds
        status: Status = "pass" if figure >= floor else "fail"
        return Verdict("throughput", phase, status, figure, floor, unit, len(population), evidence)
