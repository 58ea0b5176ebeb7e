"""`abort_propagation`: while clients leave, the engine runs no more requests than the clients hold open.

A server that keeps generating for a departed client shows it while the fault is in force: its
running-requests gauge climbs above the streams the load generator still has open. ``kv_cleanup``
cannot see that under a closed-loop storm that never goes quiet (it looks once load ends, when the
orphans have finished anyway); this verifier judges every scrape taken while clients were leaving:
while a client fault (``client.disconnect``, ``client.timeout``) was in force, and while any other
fault was in force during which a judged client left a stream the server was still serving (a read
timeout, the request timeout, a reset it saw: ``sla.engine_series.client_left``), from its inject to
its revert, in the judged phase when one is given. Every way a client goes away counts: a server
that aborts on a hang-up but generates on after a timeout or a reset fails as well.

Per scrape at time t, the *orphan excess* is ``running(t) - allowed(t)``, clamped at 0, where
``running`` is the engine's running-requests series (``vllm:num_requests_running``,
``sglang:num_running_reqs``, ... as the run's engine profile names them; summed over label sets,
each engine of a data-parallel target counting its own) and ``allowed`` is the most streams (every
stream of the run, background load too) the clients held open at any one instant of
``[t - grace, t + grace]``. The window absorbs a correct engine's skew: a gauge updated after the
engine's last step shows the running list of up to a step or a log interval ago, and a scrape is
stamped before its request (the value is read a response time later). ``grace`` defaults to one
scrape interval (the series' median spacing). The count is an instant's, not every stream that
touched the window: under a storm each client hangs up and reconnects many times a second, and
counting all of those would hide the orphans. An abort that takes an engine step to land makes a
correct engine one request over for a few milliseconds; ``max_excess`` (1) and ``sustain`` absorb that.

A scrape is *in excess* when its excess exceeds ``max_excess``. The verdict fails when consecutive
scrapes in excess span at least ``sustain`` (the figure: the longest such run, in seconds); passes
otherwise. Inconclusive, with the reason, when no running-requests series was scraped (a missing
series is unknown, never zero), when no such fault was in force, or when the
scrapes inside its windows are too few or span less than ``sustain``. ``unobservable``, with the
reason, when the target cannot show a running-requests series at all (no metrics endpoint, /metrics
answering 404, an engine without metrics, a profile naming none and no ``running_series``:
``sla.engine_series.unobservable``).
KV usage, where the engine exports it, is evidence only (its level in scrapes with and without excess):
how much cache one request holds depends on its length, so it cannot be compared with stream counts.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, MetricSample, Observations
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import rel_s, stream_end
from sla.engine_series import (
    LEFT_HOW,
    client_left,
    pick,
    profile_series,
    scrape_failures,
    totals,
    unjudged_reason,
    unobservable,
)

__all__ = ["ExcessSummary", "AbortPropagation", "excess_series", "most_open", "scrape_interval_ns", "summarise"]

HANGUP_FAULT = "client.disconnect"
CLIENT_FAULTS = (HANGUP_FAULT, "client.timeout")  # faults that make clients leave by design
MIN_SCRAPES = 3  # fewer scrapes in the fault's windows cannot show a sustained excess

SCHEMA = Schema(
    (
        Param("sustain", "duration", default=1.0,
              doc="how long consecutive scrapes may show orphaned requests before the verdict fails"),
        Param("max_excess", "int", default=1, min=0,
              doc="running requests above the clients' open streams a scrape may show without counting as excess"),
        Param("grace", "duration",
              doc="how far the running gauge may lag a scrape, or trail it: the most streams open at one instant "
                  "within it are allowed; unset: one scrape interval"),
        Param("running_series", "str", doc="the running-requests series to read instead of the built-in fallbacks"),
    )
)


@dataclass(frozen=True)
class ExcessSummary:
    """The per-scrape excess series of the fault's windows, summarised."""

    scrapes: int
    max_excess: float
    mean_excess: float
    share_with_excess: float  # scrapes whose excess is above 0
    share_in_excess: float  # scrapes whose excess is above the allowed max_excess
    longest_run_s: float  # the longest span of consecutive scrapes in excess
    longest_run_scrapes: int
    longest_run_from: int | None  # the monotonic stamp of its first scrape


def _departures(obs: Observations, phase: str | None) -> list[tuple[int, str]]:
    """(when, how) every judged client left a stream the server was still serving (``client_left``)."""
    return sorted(left for st in obs.population(phase) if not st.background and (left := client_left(st)) is not None)


def _windows(obs: Observations, phase: str | None,
             departures: Sequence[tuple[int, str]]) -> list[tuple[int, int, str]]:
    """[inject, revert, fault] of every fault (in ``phase`` if given) that makes clients leave: a client fault,
    or any fault while it was in force a client left (a read timeout, a reset); an unreverted one ends at
    its phase's end or the last scrape."""
    last = max((m.t for m in obs.target_metrics()), default=0)
    out: list[tuple[int, int, str]] = []
    events = sorted(obs.faults, key=lambda e: e.t)
    for inject in (e for e in events if e.action == "inject"):
        if phase is not None and inject.phase != phase:
            continue
        revert = next((e for e in events if e.fault == inject.fault and e.action in ("revert", "rollback", "error")
                       and e.t >= inject.t), None)
        window = obs.phase(inject.phase)
        end = revert.t if revert is not None else (window.t_end if window is not None and window.t_end else last)
        if inject.kind in CLIENT_FAULTS or any(inject.t <= t <= end for t, _ in departures):
            out.append((inject.t, end, inject.fault))
    return out


def scrape_interval_ns(samples: Sequence[MetricSample]) -> int | None:
    """The median spacing of a series' scrape times, or None with fewer than two. Pure."""
    times = sorted({m.t for m in samples})
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return int(statistics.median(gaps)) if gaps else None


def most_open(spans: Sequence[tuple[int, int | None]], lo: int, hi: int) -> int:
    """The most streams in flight at any one instant of ``[lo, hi]``; a stream is in flight on ``[sent, end)``. Pure."""
    inside = [(sent, end) for sent, end in spans if sent <= hi and (end is None or end > lo)]
    level = sum(1 for sent, _ in inside if sent <= lo)
    best = level
    # ends before sends at one instant: a stream that ended at τ is not in flight at τ
    steps = sorted([(end, 0, -1) for _, end in inside if end is not None and end <= hi]
                   + [(sent, 1, 1) for sent, _ in inside if sent > lo])
    for _, _, delta in steps:
        level += delta
        best = max(best, level)
    return best


def excess_series(obs: Observations, running: Sequence[tuple[int, float]], windows: Sequence[tuple[int, int]],
                  grace_ns: int) -> list[tuple[int, float, int]]:
    """(t, excess, allowed) for each running total scraped inside a window: ``allowed`` is the most streams
    the clients held open at any instant within ``grace_ns`` of the scrape. Pure."""
    spans = [(st.t_sent, stream_end(st)) for st in obs.streams if st.t_sent is not None]
    out: list[tuple[int, float, int]] = []
    for t, value in running:
        if not any(start <= t <= end for start, end in windows):
            continue
        allowed = most_open(spans, t - grace_ns, t + grace_ns)
        out.append((t, max(0.0, value - allowed), allowed))
    return out


def summarise(series: Sequence[tuple[int, float, int]], max_excess: int,
              windows: Sequence[tuple[int, int]]) -> ExcessSummary:
    """Max, mean, shares and the longest run of consecutive scrapes in excess (a run never crosses windows). Pure."""
    excess = [e for _, e, _ in series]
    best: tuple[int, int, int | None] = (0, 0, None)  # (span ns, scrapes, start)
    run_start: int | None = None
    run_n = 0
    prev_window: int | None = None
    for t, e, _ in series:
        window = next(i for i, (a, b) in enumerate(windows) if a <= t <= b)
        if e > max_excess and (run_start is None or window != prev_window):
            run_start, run_n = t, 0
        if e > max_excess:
            assert run_start is not None
            run_n += 1
            if (t - run_start, run_n) > best[:2]:
                best = (t - run_start, run_n, run_start)
        else:
            run_start, run_n = None, 0
        prev_window = window
    n = len(series)
    return ExcessSummary(
        scrapes=n,
        max_excess=max(excess, default=0.0),
        mean_excess=sum(excess) / n if n else 0.0,
        share_with_excess=sum(1 for e in excess if e > 0) / n if n else 0.0,
        share_in_excess=sum(1 for e in excess if e > max_excess) / n if n else 0.0,
        longest_run_s=best[0] / NS,
        longest_run_scrapes=best[1],
        longest_run_from=best[2],
    )


def _kv_evidence(obs: Observations, usage_names: Sequence[str], series: Sequence[tuple[int, float, int]],
                 max_excess: int, stale_ns: int) -> dict[str, Any] | None:
    """KV usage in scrapes in excess and the others, when the engine exports a usage series."""
    name = pick(obs, usage_names)
    if name is None:
        return None
    usage = dict(totals(obs.series(name), stale_ns))
    inside = [usage[t] for t, e, _ in series if e > max_excess and t in usage]
    outside = [usage[t] for t, e, _ in series if e <= max_excess and t in usage]
    return {
        "series": name,
        "max": max(inside + outside, default=None),
        "mean_in_excess": sum(inside) / len(inside) if inside else None,
        "mean_otherwise": sum(outside) / len(outside) if outside else None,
    }


@verifier
@dataclass(frozen=True, kw_only=True)
class AbortPropagation(SlaSpec):
    kind = "abort_propagation"
    summary = ("while clients leave (hang-ups, read timeouts, resets), the engine runs no more requests than the "
               "clients hold open")
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ("running",)
    sample_label = None
    decides_in_phase = False  # the running gauge after each hang-up, scraped after the phase too

    sustain: float
    max_excess: int
    grace: float | None
    running_series: str | None

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a count of orphaned requests read off a metric series

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("orphaned requests are a bug, not a load figure: keep the stated bound")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        sustain: float = self.sustain
        max_excess: int = self.max_excess
        evidence: dict[str, Any] = {"sustain_s": sustain, "max_excess": max_excess}

        def verdict(status: Status, figure: float | None, samples: int, reason: str = "") -> Verdict:
            if reason:
                evidence["reason"] = reason
            return Verdict("abort_propagation", phase, status, figure, sustain, "s", samples, evidence)

        if (absent := _unobservable(obs, self.running_series, evidence)) is not None:
            return verdict("unobservable", None, 0, absent)
        usage_names, running_names, engine, hint = profile_series(obs)
        name = self.running_series or pick(obs, running_names)
        evidence["running_series"] = name
        samples = obs.series(name) if name else []
        if not samples:
            return verdict("inconclusive", None, 0,
                           _no_running_series(obs, evidence, name, running_names, engine, hint))
        departures = _departures(obs, phase)
        evidence["clients_left"] = dict(Counter(how for _, how in departures))
        faulted = _windows(obs, phase, departures)
        if not faulted:
            where = f" in phase {phase!r}" if phase else ""
            return verdict("inconclusive", None, 0,
                           f"no client fault was in force{where} and no client left a stream during a fault "
                           f"({', '.join(LEFT_HOW)}): nothing to judge")
        windows = [(a, b) for a, b, _ in faulted]
        interval = scrape_interval_ns(samples) or 0
        grace_ns = int(self.grace * NS) if self.grace is not None else interval
        evidence.update(scrape_interval_s=interval / NS, grace_s=grace_ns / NS,
                        fault_windows=[[rel_s(obs, a), rel_s(obs, b)] for a, b in windows],
                        faults=sorted({f for _, _, f in faulted}))
        series = excess_series(obs, totals(samples, 2 * interval), windows, grace_ns)
        summary = summarise(series, max_excess, windows)
        evidence.update(_summary_evidence(obs, summary))
        worst = max(series, key=lambda x: x[1], default=None)
        if worst is not None and worst[1] > 0:
            running_at = dict(totals(samples, 2 * interval))[worst[0]]
            evidence["worst_scrape"] = {"t_s": rel_s(obs, worst[0]), "running": running_at, "allowed": worst[2]}
        kv = _kv_evidence(obs, usage_names, series, max_excess, 2 * interval)
        if kv is not None:
            evidence["kv_usage"] = kv
        if summary.longest_run_s >= sustain:
            return verdict("fail", summary.longest_run_s, summary.scrapes)
        span_ns = series[-1][0] - series[0][0] if series else 0
        if summary.scrapes < MIN_SCRAPES or span_ns < sustain * NS:
            return verdict("inconclusive", summary.longest_run_s if series else None, summary.scrapes,
                           f"{summary.scrapes} scrape(s) spanning {span_ns / NS:g}s while clients left: "
                           f"too few to show an excess sustained for {sustain:g}s (need {MIN_SCRAPES} spanning it)")
        return verdict("pass", summary.longest_run_s, summary.scrapes)


def _unobservable(obs: Observations, running_series: str | None, evidence: dict[str, Any]) -> str | None:
    """Why this target cannot show a running-requests series at all (``sla.engine_series.unobservable``),
    with the failed scrapes in ``evidence``; None when it could."""
    absent = unobservable(obs, [("running-requests", "running_series", "running_series", running_series)])
    if absent is not None and (scrape_errors := scrape_failures(obs, suggest=False)):
        evidence["scrape_errors"] = scrape_errors
    return absent


def _no_running_series(obs: Observations, evidence: dict[str, Any], name: str | None, running_names: Sequence[str],
                       engine: str, hint: str) -> str:
    """Why there is no running-requests series to judge, the truth first (no metrics, a failing scrape)."""
    looked = (f"looked for {', '.join(running_names)}" if running_names
              else f"the {engine} profile names none; set `running_series`")
    what = (f"the running-requests series {name!r} has no samples" if name
            else f"no running-requests series was scraped ({looked})")
    missing = (what + "; a missing series is unknown, not zero, so orphaned requests cannot be told from open streams"
               + (f" ({hint})" if hint else ""))
    return unjudged_reason(obs, evidence,
                           "abort propagation (the engine's running requests against the open streams)", missing)


def _summary_evidence(obs: Observations, summary: ExcessSummary) -> dict[str, Any]:
    return {
        "scrapes": summary.scrapes,
        "max_excess_seen": summary.max_excess,
        "mean_excess": round(summary.mean_excess, 6),
        "share_with_excess": round(summary.share_with_excess, 6),
        "share_in_excess": round(summary.share_in_excess, 6),
        "longest_run_s": summary.longest_run_s,
        "longest_run_scrapes": summary.longest_run_scrapes,
        "longest_run_from_s": rel_s(obs, summary.longest_run_from),
    }
