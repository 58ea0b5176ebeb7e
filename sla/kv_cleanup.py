"""`kv_cleanup`: after aborts and at the end of load, KV usage and running requests return to baseline.

Series (the first present wins; ``series`` / ``running_series`` override): the run's engine
profile names them (``chaos.model.engines``, recorded in the journal's ``engine_profile`` note); without
one, every known name in turn. KV usage from ``streamchaos_kv_blocks_used`` (the builtin engine's
exact block count: must return to exactly its baseline), ``vllm:kv_cache_usage_perc``,
``vllm:gpu_cache_usage_perc``, ``sglang:token_usage`` (fractions: baseline + ``tolerance``), TGI's
``tgi_batch_current_max_tokens`` (tokens: tolerance scaled by ``tgi_batch_max_total_tokens`` when
scraped, else exact); running requests from ``vllm:num_requests_running``,
``sglang:num_running_reqs``, ``tgi_batch_current_size``, ``llamacpp:requests_processing`` (exact).
A prefix cache leaves freed blocks cached: none of these series counts them (the builtin stack's
gauge counts blocks held by requests plus reserved ones; vLLM V1's ``kv_cache_usage_perc`` counts a
cached block with no holder as free), so a warm cache is no leak, while a block an aborted request
still holds is one, cached or not (tests/e2e/test_planted_prefix_cache.py plants that).
An inconclusive verdict for a missing series says why the scrapes failed (``scrape_error`` notes:
HTTP 401 wants ``target.metrics_auth``, 404 has no metrics there, a refused connection).
Every label set is judged on its own (one engine of several may leak). A missing series is
unknown, never zero: the verdict is then inconclusive.

Baseline: the lowest value scraped before the first stream of the run was sent.
Check points: the end of the busy period (some stream in flight) that holds the judged streams'
last end — the end of load — and the end of every busy period in which a judged stream was hung
up on by a client fault (an abort burst followed by quiet). From a check point T the series must
be back at baseline by T + ``within``. It is a fail when samples taken after that deadline, while
still quiet, show it had not (a late return is a fail too, with the time it took), and when the last
sample, past the deadline, is still above baseline (a dip to baseline and back up is no return). A
check point whose quiet ended, or whose samples stop, before the deadline is unobserved (the reason
says so in words: the value at the last sample and how long after T it came), and so is one whose
first sample past the deadline is already back (scrapes too sparse to tell).
Hang-ups under load that never goes quiet (a closed-loop storm) are judged from the last hang-up H of
each busy period whose load goes on for longer than ``within`` after it: by H + ``within`` each series
(summed over label sets) must be back to the level the same load held before any client hung up (its
highest scrape from the first stream sent to the first hang-up, plus the usage slack; at least 5
scrapes, else unobserved). A server that frees a departed request's blocks late holds them through
the load that follows: a fail, with the time from H until the level came back.
The verdict passes when the end-of-load check point returned and none failed.
Scraping stops when ``safety.cleanup_window`` ends after the drain: the window must exceed ``within``
by at least two scrape intervals (``cleanup_window_needed``); the loader refuses a shorter window
written in the file and raises the default one to fit.
A ``Note(topic="kv_leak")`` from the builtin stack naming leaked request ids after a deadline is
a fail by itself. A target whose series cannot exist (no metrics endpoint, an engine without metrics,
/metrics answering 404, a profile without a KV usage or running series and no ``series`` /
``running_series`` naming one: ``sla.engine_series.unobservable``) gives ``unobservable``, whose entry's
``when_unobservable`` says how it counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from chaos.model.context import HaltSpec
from chaos.model.engines import RUNNING_SERIES, USAGE_SERIES
from chaos.model.observations import NS, MetricSample, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS, rel_s, stream_end
from sla.engine_series import Need, pick, profile_series, scrape_failures, totals, unjudged_reason, unobservable

__all__ = ["RUNNING_SERIES", "USAGE_SERIES", "KvCleanup", "cleanup_window_needed"]

SCRAPES_PAST_DEADLINE = 2  # scrape intervals the cleanup window must reach past ``within``: one sample lands there


def cleanup_window_needed(within: float, scrape_interval: float) -> float:
    """The shortest ``safety.cleanup_window`` (s) that can decide the end-of-load check point: scraping
    goes on after the last stream ends for ``within`` and then long enough that a sample lands past the
    deadline. A shorter window stops scraping first, and a series still leaking is judged unobserved."""
    return within + SCRAPES_PAST_DEADLINE * scrape_interval

SCHEMA = Schema(
    (
        Param("within", "duration", default=2.0,
              doc="how soon after a check point (the end of load, an abort burst, the last hang-up) the series must "
                  "be back; safety.cleanup_window must exceed it by two scrape intervals"),
        Param("tolerance", "fraction", default=0.0, doc="KV usage allowed above baseline, as a share of the cache"),
        Param("series", "str", doc="the KV usage series to read instead of the built-in fallbacks"),
        Param("running_series", "str", doc="the running-requests series to read instead of the built-in fallbacks"),
    )
)

Outcome = Literal["returned", "late", "leaked", "unobserved"]
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class _Check:
    """One series at one check point."""

    outcome: Outcome
    took_s: float | None  # how long the return took, when it happened
    value_at_deadline: float | None  # the first sample at or after the deadline, while quiet
    baseline: float
    labels: dict[str, str]
    last: tuple[float, float] | None = None  # (seconds after the check point, value) of the last quiet sample
    limit: float = 0.0

    @property
    def up_before_deadline(self) -> bool:
        """Unobserved because the samples stop before the deadline while the series is still up."""
        return self.outcome == "unobserved" and self.last is not None and self.last[1] > self.limit

    def as_evidence(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "took_s": self.took_s,
            "value_at_deadline": self.value_at_deadline,
            "baseline": self.baseline,
            **({"last_sample": {"after_s": round(self.last[0], 6), "value": self.last[1]}} if self.last else {}),
            **({"labels": self.labels} if self.labels else {}),
        }


def _by_labels(samples: Sequence[MetricSample]) -> dict[Labels, list[MetricSample]]:
    out: dict[Labels, list[MetricSample]] = {}
    for m in samples:
        out.setdefault(tuple(sorted(m.labels.items())), []).append(m)
    return out


def _check_one(
    samples: list[MetricSample],
    limit: float,
    t: int,
    deadline: int,
    quiet_until: int | None,
    baseline: float,
    labels: Labels,
) -> _Check:
    """Did one label set's series get back to ``limit`` after ``t``, by ``deadline``, and stay there?"""
    quiet = [m for m in samples if m.t >= t and (quiet_until is None or m.t < quiet_until)]
    back = next((m for m in quiet if m.value <= limit), None)
    after = next((m for m in quiet if m.t >= deadline), None)
    last = quiet[-1] if quiet else None
    took = (back.t - t) / NS if back is not None else None
    at_deadline = after.value if after is not None else None
    outcome: Outcome
    if last is not None and last.t >= deadline and last.value > limit:
        # Still up at its last sample, past the deadline, with nothing running: a leak, whatever
        # the series did before (a dip to baseline and back up is no return).
        outcome = "leaked"
    elif back is not None and back.t <= deadline:
        outcome = "returned"
    elif after is None or after.value <= limit:
        # No sample past the deadline, or the first one is already back: the scrapes cannot say
        # whether it was back in time (sparse scrapes), only ``took`` as an upper bound.
        outcome = "unobserved"
    elif back is not None:
        outcome = "late"  # still up at the deadline, back later
    else:
        outcome = "leaked"  # still up at the deadline and never back while nothing else ran
    seen = ((last.t - t) / NS, last.value) if last is not None else None
    took = None if outcome == "leaked" else took
    return _Check(outcome, took, at_deadline, baseline, dict(labels), seen, limit)


def _worst(checks: list[_Check]) -> _Check:
    order = {"leaked": 0, "late": 1, "unobserved": 2, "returned": 3}
    return min(checks, key=lambda c: (order[c.outcome], -(c.took_s or 0.0)))


def _busy_periods(streams: Sequence[StreamRecord]) -> list[tuple[int, int]]:
    """Merged [start, end] intervals during which some stream (any phase, background too) was in flight."""
    spans = sorted((st.t_sent, end) for st in streams if st.t_sent is not None and (end := stream_end(st)) is not None)
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _check_points(obs: Observations, population: list[StreamRecord]) -> list[tuple[str, int, int | None]]:
    """(kind, T, next load start or None) for the end of load and every abort burst's quiet."""
    periods = _busy_periods(obs.streams)
    ends = [e for st in population if (e := stream_end(st)) is not None]
    if not periods or not ends:
        return []
    hangups = [st.hangup.t for st in population if st.hangup is not None]
    last_end = max(ends)
    points: list[tuple[str, int, int | None]] = []
    for i, (start, end) in enumerate(periods):
        following = periods[i + 1][0] if i + 1 < len(periods) else None
        if start <= last_end <= end:
            points.append(("end_of_load", end, following))
        elif any(start <= h <= end for h in hangups):
            points.append(("abort_burst", end, following))
    return points


MIN_REFERENCE = 5  # scrapes of load before the first hang-up: fewer cannot tell the load's own level


def _after_hangups(obs: Observations, population: list[StreamRecord],
                   per_series: Mapping[str, tuple[list[MetricSample], float]], within: float) -> list[dict[str, Any]]:
    """A check point at the last hang-up of every busy period whose load goes on for longer than ``within``
    after it (a closed-loop storm never goes quiet): by then the series must be back to the level the same
    load held before any client hung up (its highest scrape then, plus the usage slack). A server that frees
    a departed request's blocks late holds them through the load that follows, above that level."""
    hangups = sorted(st.hangup.t for st in population if st.hangup is not None and st.hangup.reason != "stopped")
    sent = [st.t_sent for st in obs.streams if st.t_sent is not None]
    if not hangups or not sent:
        return []
    out = []
    for start, end in _busy_periods(obs.streams):
        inside = [h for h in hangups if start <= h <= end]
        if inside and end - inside[-1] > within * NS:
            out.append(_level_point(obs, inside[-1], end, within, per_series, (min(sent), hangups[0])))
    return out


def _level_point(obs: Observations, h: int, until: int, within: float,
                 per_series: Mapping[str, tuple[list[MetricSample], float]],
                 reference: tuple[int, int]) -> dict[str, Any]:
    """One after-hang-ups check point: each series (summed over label sets) against the level of the load
    scraped in ``reference`` (from the first stream sent to the first hang-up), from ``h`` to ``until``."""
    from sla.abort_propagation import scrape_interval_ns

    deadline = h + int(within * NS)
    entry: dict[str, Any] = {"kind": "after_hangups", "t_s": rel_s(obs, h), "load_until_s": rel_s(obs, until)}
    outcomes: list[tuple[str, float | None]] = []
    for name, (samples, slack) in per_series.items():
        series = totals(samples, 2 * (scrape_interval_ns(samples) or 0))
        before = [v for t, v in series if reference[0] <= t < reference[1]]
        if len(before) < MIN_REFERENCE:
            entry[name] = {"outcome": "unobserved", "reference_scrapes": len(before)}
            outcomes.append(("unobserved", None))
            continue
        level = max(before) + slack
        watched = [(t, v) for t, v in series if h <= t < until]
        back = next(((t, v) for t, v in watched if v <= level), None)
        after = next(((t, v) for t, v in watched if t >= deadline), None)
        outcome, took = _level_outcome(back, after, level, h, deadline, watched)
        entry[name] = {"outcome": outcome, "took_s": took, "load_level": level,
                       "value_at_deadline": after[1] if after else None}
        outcomes.append((outcome, took))
    order = {"late": 0, "unobserved": 1, "returned": 2}
    entry["outcome"] = min((o for o, _ in outcomes), key=lambda o: order[o], default="unobserved")
    figures = [took for _, took in outcomes if took is not None]
    entry["figure_s"] = max(figures) if figures else None
    return entry


def _level_outcome(back: tuple[int, float] | None, after: tuple[int, float] | None, level: float, h: int,
                   deadline: int, watched: Sequence[tuple[int, float]]) -> tuple[str, float | None]:
    """(outcome, seconds from the hang-up to the return, or watched without one) of one series."""
    if back is not None and back[0] <= deadline:
        return "returned", (back[0] - h) / NS
    if after is None or after[1] <= level:
        return "unobserved", None  # no scrape past the deadline, or too sparse to say when it came back
    if back is not None:
        return "late", (back[0] - h) / NS
    return "late", (watched[-1][0] - h) / NS  # above the load's level as long as the load went on


def _leak_notes(obs: Observations) -> list[tuple[int, list[str]]]:
    out = []
    for note in obs.notes_on("kv_leak"):
        ids = note.data.get("request_ids", note.data.get("ids", note.data.get("leaked", [])))
        out.append((note.t, [str(i) for i in ids] if isinstance(ids, list) else [str(ids)]))
    return out


@verifier
@dataclass(frozen=True, kw_only=True)
class KvCleanup(SlaSpec):
    kind = "kv_cleanup"
    summary = "KV usage and running requests return to baseline after aborts, the last hang-up and end of load"
    schema = SCHEMA
    timing = False
    better = "lower"
    capacity_fit = True
    needs = ("kv_usage", "running")
    sample_label = None
    decides_in_phase = False  # KV and running requests come back down after the phase's streams end

    within: float
    tolerance: float
    series: str | None
    running_series: str | None

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a time read off metric series, not a sample of streams

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("the cleanup time is bounded by the engine's step, not by load: keep the stated bound")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        population = obs.population(phase)
        evidence: dict[str, Any] = {"within_s": self.within, "tolerance": self.tolerance}
        read = self._series(obs, population, evidence)
        if isinstance(read, _Undecided):
            evidence["reason"] = read.reason
            return Verdict("kv_cleanup", phase, read.status, None, self.within, "s", read.samples, evidence)
        status, figure, samples, reason = self._check(obs, population, read, evidence)
        if reason:
            evidence["reason"] = reason
        return Verdict("kv_cleanup", phase, status, figure, self.within, "s", samples, evidence)

    def _series(self, obs: Observations, population: list[StreamRecord],
                evidence: dict[str, Any]) -> _Series | _Undecided:
        """The KV usage and running series with their baselines before the first stream was sent
        (evidence: which series, the usage slack, the baselines), or why they cannot be had."""
        needs: list[Need] = [("KV usage", "usage_series", "series", self.series),
                             ("running-requests", "running_series", "running_series", self.running_series)]
        if (absent := unobservable(obs, needs)) is not None:
            scrape_errors = scrape_failures(obs, suggest=False)
            if scrape_errors:
                evidence["scrape_errors"] = scrape_errors
            return _Undecided(absent, status="unobservable")
        usage_names, running_names, engine, hint = profile_series(obs)
        usage_name = self.series or pick(obs, usage_names)
        running_name = self.running_series or pick(obs, running_names)
        evidence.update(usage_series=usage_name, running_series=running_name)
        wanted = (("KV usage", usage_name, usage_names), ("running requests", running_name, running_names))
        missing = _missing_series(obs, evidence, wanted, engine, hint)
        if missing is not None:
            return _Undecided(missing)
        assert usage_name is not None and running_name is not None
        sent = [st.t_sent for st in obs.streams if st.t_sent is not None]
        if not population or not sent:
            return _Undecided("no streams were sent")
        slack = _slack(obs, dict(USAGE_SERIES).get(usage_name, "fraction"), self.tolerance)
        evidence["usage_slack"] = slack
        per_series = {usage_name: (obs.series(usage_name), slack), running_name: (obs.series(running_name), 0.0)}
        baselines = {name: _baseline(samples, min(sent)) for name, (samples, _) in per_series.items()}
        for name, baseline in baselines.items():
            if not baseline:
                reason = f"no {name} sample was scraped before the first stream was sent, so there is no baseline"
                return _Undecided(reason, len(per_series[name][0]))
        evidence["baseline"] = {name: _show(b) for name, b in baselines.items()}
        return _Series(per_series, baselines)

    def _check(self, obs: Observations, population: list[StreamRecord], read: _Series,
               evidence: dict[str, Any]) -> tuple[Status, float | None, int, str]:
        """(status, the longest return in seconds, samples used, why undecided) over the check points:
        each abort and the end of load, judged on both series against their baselines."""
        points = _check_points(obs, population)
        leak_notes = _leak_notes(obs)
        results = [_judge_point(obs, kind, t, next_start, self.within, read.per_series, read.baselines, leak_notes)
                   for kind, t, next_start in points]
        results += _after_hangups(obs, population, read.per_series, self.within)
        used = _samples_used(points, read.per_series)
        figures = [r["figure_s"] for r in results if r["figure_s"] is not None]
        worst_took = max(figures) if figures else None
        evidence["check_points"] = results
        evidence["leaked_request_ids"] = sorted({i for _, ids in leak_notes for i in ids})[:MAX_IDS]
        if any(r["outcome"] in ("leaked", "late") for r in results):
            return "fail", worst_took, used, ""
        if any(r["kind"] == "end_of_load" and r["outcome"] == "returned" for r in results):
            return "pass", worst_took, used, ""
        if not points:
            return "inconclusive", None, used, "no check point: the judged streams have no end stamps"
        early = next((r["stopped_early"] for r in results if r["kind"] == "end_of_load" and "stopped_early" in r), None)
        return "inconclusive", worst_took, used, early or UNDECIDED_END


@dataclass(frozen=True)
class _Series:
    """The series read, each with its slack above baseline, and their baselines."""

    per_series: dict[str, tuple[list[MetricSample], float]]
    baselines: dict[str, dict[Labels, float]]


@dataclass(frozen=True)
class _Undecided:
    reason: str
    samples: int = 0
    status: Status = "inconclusive"  # or unobservable: the series cannot exist on this target


UNDECIDED_END = ("the end-of-load check point could not be decided: no sample at baseline within the deadline and none "
                 "past it still above baseline (the scrapes stopped, were too sparse, or new load began)")


def _samples_used(points: Sequence[tuple[str, int, int | None]],
                  per_series: Mapping[str, tuple[list[MetricSample], float]]) -> int:
    """How many samples fell inside the check points' windows: the verdict's sample count."""
    return sum(
        1
        for _, t, next_start in points
        for samples, _ in per_series.values()
        for m in samples
        if m.t >= t and (next_start is None or m.t < next_start)
    )


def _missing_series(obs: Observations, evidence: dict[str, Any],
                    wanted: Sequence[tuple[str, str | None, Sequence[str]]], engine: str, hint: str) -> str | None:
    """Why the KV usage or running-requests series cannot be judged (absent, or without samples),
    the truth first (an engine without metrics, a failing scrape); None when both are there."""
    problems = []
    for what, name, fallbacks in wanted:
        if name is None:
            looked = (f"looked for {', '.join(fallbacks)}" if fallbacks
                      else f"the {engine} profile names none; set `series`")
            problems.append(f"no {what} series was scraped ({looked})")
        elif not obs.series(name):
            problems.append(f"the {what} series {name!r} has no samples")
    if not problems:
        return None
    missing = "; ".join(problems) + "; a missing series is unknown, not zero" + (f" ({hint})" if hint else "")
    return unjudged_reason(obs, evidence, "KV cleanup", missing)


def _baseline(samples: Sequence[MetricSample], first_sent: int) -> dict[Labels, float]:
    """Per label set, the lowest value scraped before the first stream was sent."""
    return {
        labels: min(m.value for m in before)
        for labels, group in _by_labels(samples).items()
        if (before := [m for m in group if m.t < first_sent])
    }


def _judge_point(
    obs: Observations,
    kind: str,
    t: int,
    next_start: int | None,
    within: float,
    per_series: dict[str, tuple[list[MetricSample], float]],
    baselines: dict[str, dict[Labels, float]],
    leak_notes: list[tuple[int, list[str]]],
) -> dict[str, Any]:
    """One check point: each series' worst label set, leak notes past the deadline, the outcome."""
    deadline = t + int(within * NS)
    entry: dict[str, Any] = {"kind": kind, "t_s": rel_s(obs, t), "next_load_s": rel_s(obs, next_start)}
    checks: list[_Check] = []
    gone: list[dict[str, str]] = []
    for name, (samples, allowed) in per_series.items():
        groups = _by_labels(samples)
        judged = dict(baselines[name])
        # A label set with no sample from the check point on, while others still have some, belongs to a
        # source that is gone (a deleted pod, whose blocks went with its process): it cannot leak, and
        # nothing can be observed of it. Without any sample left at all, the point stays unobserved.
        observed = {labels for labels in judged
                    if any(m.t >= t and (next_start is None or m.t < next_start) for m in groups[labels])}
        if observed:
            gone += [dict(labels) for labels in judged if labels not in observed and dict(labels) not in gone]
            judged = {labels: base for labels, base in judged.items() if labels in observed}
        worst = _worst(
            [
                _check_one(groups[labels], base + allowed, t, deadline, next_start, base, labels)
                for labels, base in judged.items()
            ]
        )
        entry[name] = worst.as_evidence()
        checks.append(worst)
    if gone:
        entry["series_gone"] = gone[:MAX_IDS]
    quiet_after_deadline = [
        i for nt, ids in leak_notes if nt >= deadline and (next_start is None or nt < next_start) for i in ids
    ]
    outcome = _worst(checks).outcome
    if quiet_after_deadline:
        entry["leaked_request_ids"] = sorted(set(quiet_after_deadline))[:MAX_IDS]
        if outcome in ("returned", "unobserved"):
            outcome = "leaked"  # the stack itself says requests still hold blocks
    entry["outcome"] = outcome
    entry["figure_s"] = _figure(outcome, checks, per_series, t, next_start)
    stopped = [(name, c) for name, c in zip(per_series, checks, strict=True) if c.up_before_deadline]
    if outcome == "unobserved" and stopped:
        entry["stopped_early"] = _stopped_early(kind, within, *stopped[0])
    return entry


def _figure(outcome: str, checks: Sequence[_Check], per_series: Mapping[str, tuple[list[MetricSample], float]],
            t: int, next_start: int | None) -> float | None:
    """The check point's figure in seconds: the slowest return, or for a leak how long it was watched."""
    if outcome == "leaked":
        # never back to stay: the figure is how long it was watched without returning (a lower bound)
        watched = [
            m.t
            for samples, _ in per_series.values()
            for m in samples
            if m.t >= t and (next_start is None or m.t < next_start)
        ]
        return (max(watched, default=t) - t) / NS
    if all(c.took_s is not None for c in checks):
        return max(c.took_s or 0.0 for c in checks)
    return None


def _stopped_early(kind: str, within: float, name: str, check: _Check) -> str:
    """In words: the series was still up at its last sample, which came before the deadline."""
    assert check.last is not None
    after, value = check.last
    since = "the end of load" if kind == "end_of_load" else "the abort burst's end"
    why = ("the scrapes stopped" if kind == "end_of_load" else "new load began")
    fix = (f"; safety.cleanup_window must exceed within ({within:g}s) by at least two scrape intervals"
           if kind == "end_of_load" else "")
    return (f"{name} was still above baseline ({value:g} against {check.baseline:g}) at its last sample, "
            f"{after:.2f}s after {since}, before the deadline of {within:g}s: {why} too soon to judge it{fix}")


def _slack(obs: Observations, rule: str, tolerance: float) -> float:
    """How far above baseline KV usage may stay, in the series' own unit."""
    if rule == "exact":
        return 0.0
    if rule == "fraction":
        return tolerance
    totals = obs.series(rule)  # a token count: tolerance is a share of the scraped total
    return tolerance * max(m.value for m in totals) if totals else 0.0


def _show(baseline: dict[Labels, float]) -> float | dict[str, float]:
    if len(baseline) == 1:
        return next(iter(baseline.values()))
    return {",".join(f"{k}={v}" for k, v in labels): value for labels, value in baseline.items()}
