"""`capacity`: after a pod or scale fault, the ready pods are back to their count before it, in time.

Needs a Kubernetes target, whose pod watch records ``streamchaos_k8s_pods_ready`` (pods Ready and
not terminating) at every change. Each disruption is judged on its own:

- ``k8s.pod_kill`` / ``k8s.pod_evict``: from the first delete or eviction request (``requested_at_ns``
  in the fault's evidence) until the ready count, having dropped, is back at its value just before;
- ``k8s.scale`` that lowered the replicas: from the revert that restored them until the ready count
  is back at its value before the inject.

Capacity is back when the ready count has returned to that value *and held there* for ``hold``
(default 5 s), or until the disruption's phase ended if that comes first (or the observations did):
a replacement that became Ready and dropped again (a crash loop, a flapping probe) is a relapse,
listed in the evidence, and the recovery is measured to the return that held, so a relapse that
outlasts the budget fails.

The figure is the longest of those recovery times; ``pass`` when every one is within ``within``,
``fail`` when one took longer (or had not recovered ``within`` after it started, however the run
went on), ``inconclusive`` when the observations end before that could be known. Requests that
failed meanwhile (an error, or a stream cut without its terminal event, not hung up by a client
fault) are counted among the streams that ended in each window; ``max_failed`` turns that share into
a budget too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, FaultEvent, MetricSample, Observations
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import rel_s
from sla.stream_errors import error_kinds

__all__ = ["READY_SERIES", "Capacity", "disruptions", "returns"]

READY_SERIES = "streamchaos_k8s_pods_ready"
POD_KINDS = ("k8s.pod_kill", "k8s.pod_evict")

SCHEMA = Schema((
    Param("within", "duration", required=True, doc="how long the ready pods may take to come back"),
    Param("hold", "duration", 5.0,
          doc="how long the count must stay back to count as back (cut short by the phase's end)"),
    Param("max_failed", "fraction", None,
          doc="the largest share of streams ending meanwhile that may fail (default: counted, not judged)"),
))


@dataclass(frozen=True)
class Disruption:
    """One fault's loss of capacity: measured from ``start`` against the ready count at ``baseline_t``."""

    fault: str
    kind: str
    phase: str
    start: int  # ns: the first delete/evict request, or the scale's revert
    baseline_t: int  # ns: the ready count just before this is the one to get back to
    restored: bool = True  # a scale whose revert did not restore the replicas cannot recover


def disruptions(obs: Observations, phase: str | None = None) -> list[Disruption]:
    """The capacity losses the run's k8s faults caused, in time order. Pure."""
    out: list[Disruption] = []
    by_fault: dict[tuple[str, str], list[FaultEvent]] = {}
    for event in obs.faults:
        if event.kind.startswith("k8s.") and (phase is None or event.phase == phase):
            by_fault.setdefault((event.fault, event.phase), []).append(event)
    for (name, fault_phase), events in by_fault.items():
        kind = events[0].kind
        if kind in POD_KINDS:
            requested = [int(p["requested_at_ns"]) for e in events if e.action in ("inject", "revert")
                         for p in e.evidence.get("pods") or [] if isinstance(p, Mapping) and p.get("requested_at_ns")]
            if requested:
                out.append(Disruption(name, kind, fault_phase, min(requested), min(requested)))
        elif kind == "k8s.scale":
            inject = next((e for e in events if e.action == "inject"), None)
            revert = next((e for e in events if e.action in ("revert", "rollback")), None)
            if inject is None or revert is None:
                continue
            before, after = inject.evidence.get("replicas_before"), inject.evidence.get("replicas_set")
            if isinstance(before, int) and isinstance(after, int) and after < before:
                out.append(Disruption(name, kind, fault_phase, revert.t, inject.t,
                                      bool(revert.evidence.get("restored", True))))
    return sorted(out, key=lambda d: d.start)


def _value_at(samples: list[MetricSample], t: int) -> float | None:
    """The step function's value at ``t`` (the last sample at or before it)."""
    value = None
    for m in samples:
        if m.t > t:
            break
        value = m.value
    return value


def _last_t(obs: Observations) -> int:
    stamps = [m.t for m in obs.target_metrics()] + [st.t_end for st in obs.streams if st.t_end is not None]
    return max(stamps, default=obs.t0)


def _failed_meanwhile(obs: Observations, start: int, end: int) -> tuple[int, int]:
    """(failed, ended): judged streams that ended in [start, end], and those that failed among them."""
    ended = failed = 0
    for st in obs.population():
        if st.hangup is not None or st.t_end is None or not start <= st.t_end <= end:
            continue
        ended += 1
        if error_kinds(st) or not st.complete:
            failed += 1
    return failed, ended


def returns(samples: list[MetricSample], start: int, baseline: float,
            at_start: float | None = None) -> list[tuple[int, int | None]]:
    """The spans from ``start`` on in which the ready count was back at ``baseline`` or above: ``(from,
    until)`` (``until`` None: still back at the last sample). ``at_start``: the count at ``start``. Pure."""
    spans: list[tuple[int, int | None]] = []
    back_since = start if at_start is not None and at_start >= baseline else None
    for m in samples:
        if m.t <= start:
            continue
        if m.value >= baseline and back_since is None:
            back_since = m.t
        elif m.value < baseline and back_since is not None:
            spans.append((back_since, m.t))
            back_since = None
    if back_since is not None:
        spans.append((back_since, None))
    return spans


def _phase_end(obs: Observations, phase: str) -> int | None:
    window = obs.phase(phase)
    return window.t_end if window is not None else None


def _held_return(obs: Observations, spans: list[tuple[int, int | None]], phase: str, hold: float, last: int,
                 row: dict[str, Any]) -> tuple[int | None, list[dict[str, Any]]]:
    """(when the count came back and stayed back, the returns that did not hold). Back means back
    and staying back: for ``hold``, or until the phase (or the observations) ended."""
    phase_end = _phase_end(obs, phase)
    relapses: list[dict[str, Any]] = []
    for i, (since, until) in enumerate(spans):
        needed = since + round(hold * NS)
        if phase_end is not None and since < phase_end:
            needed = min(needed, phase_end)
        needed = min(needed, last)
        if until is None or until >= needed:
            row["held_s"] = round(((until if until is not None else last) - since) / NS, 3)
            return since, relapses
        back_again = spans[i + 1][0] if i + 1 < len(spans) else None
        relapses.append({"back_s": rel_s(obs, since), "relapsed_s": rel_s(obs, until),
                         "held_s": round((until - since) / NS, 3),
                         "down_s": round(((back_again if back_again is not None else last) - until) / NS, 3)})
    return None, relapses


def _judge(obs: Observations, d: Disruption, samples: list[MetricSample], within: float, hold: float,
           last: int) -> dict[str, Any]:
    baseline = _value_at(samples, d.baseline_t - 1)
    row: dict[str, Any] = {"fault": d.fault, "kind": d.kind, "phase": d.phase, "from_s": rel_s(obs, d.start),
                           "baseline_ready": baseline}
    if baseline is None:
        return {**row, "outcome": "unknown", "why": f"no {READY_SERIES} sample before the disruption"}
    after = [m for m in samples if m.t > d.start]
    if d.kind in POD_KINDS:
        dip = next((m for m in after if m.value < baseline), None)
        if dip is None:
            row["note"] = "the ready count never dropped below its value before"
        spans: list[tuple[int, int | None]] = [(d.start, None)] if dip is None else returns(samples, dip.t, baseline)
    else:
        spans = returns(samples, d.start, baseline, _value_at(samples, d.start))
    recovered_t, relapses = _held_return(obs, spans, d.phase, hold, last, row)
    if relapses:
        row["relapses"] = relapses
    lowest = min([m.value for m in samples if d.baseline_t <= m.t <= (recovered_t or last)], default=baseline)
    end = recovered_t if recovered_t is not None else last
    failed, ended = _failed_meanwhile(obs, d.start, end)
    row.update(lowest_ready=lowest, failed_streams=failed, streams_ended=ended,
               failed_share=round(failed / ended, 4) if ended else None)
    if not d.restored:
        return {**row, "outcome": "not_restored",
                "why": "the scale's revert did not restore the replicas (see its evidence)"}
    if recovered_t is not None:
        took = (recovered_t - d.start) / NS
        return {**row, "recovered_after_s": round(took, 3), "outcome": "recovered" if took <= within else "late"}
    waited = (last - d.start) / NS
    if waited > within:
        return {**row, "recovered_after_s": None, "waited_s": round(waited, 3), "outcome": "not_back"}
    return {**row, "recovered_after_s": None, "waited_s": round(waited, 3), "outcome": "undecided",
            "why": f"the observations end {waited:.1f}s after the disruption, before the {within:g}s budget ran out"}


@verifier
@dataclass(frozen=True, kw_only=True)
class Capacity(SlaSpec):
    kind = "capacity"
    summary = "after k8s pod/scale faults, ready pods back to their count before within a budget; failures meanwhile"
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = None
    decides_in_phase = False  # pods come back within its budget, often after the phase

    within: float
    hold: float
    max_failed: float | None

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a time read off the ready-pods series, not a sample of streams

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("the time pods take to come back is the cluster's, not a load figure: "
                                 "keep the stated bound")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        within: float = self.within
        hold: float = self.hold
        max_failed: float | None = self.max_failed
        evidence: dict[str, Any] = {"within_s": within, "hold_s": hold, "max_failed": max_failed,
                                    "series": READY_SERIES}

        def verdict(status: Status, figure: float | None, samples: int, reason: str = "") -> Verdict:
            if reason:
                evidence["reason"] = reason
            return Verdict("capacity", phase, status, figure, within, "s", samples, evidence)

        samples = obs.series(READY_SERIES)
        found = disruptions(obs, phase)
        if not samples:
            return verdict("inconclusive", None, 0,
                           f"no {READY_SERIES} samples: capacity is recorded for a kind: kubernetes target only")
        if not found:
            return verdict("inconclusive", None, 0,
                           "no k8s.pod_kill, k8s.pod_evict or k8s.scale (down) took capacity away"
                           + (f" in phase {phase}" if phase else ""))
        last = _last_t(obs)
        rows = [_judge(obs, d, samples, within, hold, last) for d in found]
        evidence["disruptions"] = rows
        figures = [r.get("recovered_after_s") if r.get("recovered_after_s") is not None else r.get("waited_s")
                   for r in rows]
        figure = max((f for f in figures if f is not None), default=None)
        too_many = [r for r in rows
                    if max_failed is not None and r.get("failed_share") is not None and r["failed_share"] > max_failed]
        if any(r["outcome"] in ("late", "not_back", "not_restored") for r in rows) or too_many:
            return verdict("fail", figure, len(rows))
        if any(r["outcome"] in ("undecided", "unknown") for r in rows):
            return verdict("inconclusive", figure, len(rows), "; ".join(r["why"] for r in rows if r.get("why")))
        return verdict("pass", figure, len(rows))
