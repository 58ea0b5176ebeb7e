"""Judging observations against an experiment's SLA entries; used live and by `streamchaos verify`
(``chaos.output.replay``)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chaos.host.contention import contention_shift
from chaos.model.observations import Observations
from chaos.model.verdict import Verdict

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment, SlaEntry

__all__ = ["CLIENT_SATURATED", "HOST_CHANGED", "TIMING_SLAS", "client_lateness", "judge_all", "judge_entry"]

# Verdicts a saturated load generator can falsify: its own lag inflates every measured time, and a
# client that reads late finds several events waiting in one read (``streaming``'s sign of a buffer).
TIMING_SLAS = frozenset({"ttft", "itl", "throughput", "recovery", "goodput", "fluidity", "streaming"})
CLIENT_SATURATED = "load generator saturated"  # the two causes of an inconclusive this module gives
HOST_CHANGED = "host contention changed"
WHOLE_RESPONSE_SHARE = 0.5  # a buffer that holds responses whole puts most of a stream in its first read


def client_lateness(client_lag: dict[str, Any], phase: str | None) -> tuple[bool, float, str]:
    """(saturated, how late the client ran in seconds, why) for a verdict of ``phase`` (None: all).

    Two signs of a client that cannot keep up, each judged at its p99 against the lag threshold:
    its event loop waking late (``p99_ms``), and, under open-loop arrivals, its own send delay
    (``send_delay``: per phase, sent minus when the request could have gone, the in-flight cap's
    queueing left out). Either inflates every time it stamps; the larger is what it can explain.
    """
    threshold_ms = float(client_lag.get("threshold_ms") or 0.0)
    loop_ms = float(client_lag.get("p99_ms") or 0.0)
    delays = client_lag.get("send_delay") or {}
    scoped = [d for p, d in delays.items() if phase is None or p == phase]
    send_ms = max((float(d.get("p99_ms") or 0.0) for d in scoped if d.get("samples")), default=0.0)
    why = []
    if client_lag.get("saturated"):
        why.append(f"event-loop lag p99 {loop_ms:.1f}ms > {threshold_ms:g}ms")
    if threshold_ms and send_ms > threshold_ms:
        why.append(f"send delay p99 {send_ms:.1f}ms > {threshold_ms:g}ms")
    return bool(why), max(loop_ms, send_ms) / 1000.0, "; ".join(why)


def _within_client_lag(verdict: Verdict, lag_s: float) -> bool:
    """Could the generator's own lateness explain this failure? Only for times over budget by less than it.

    A figure 500 ms over a TTFT budget is not explained by a client whose event loop runs 30 ms
    late; one 10 ms over is, and is reported inconclusive rather than blamed on the server.
    """
    if verdict.sla not in TIMING_SLAS:
        return False
    if verdict.sla == "streaming":
        # lateness bunches events (vLLM on a starved CPU: 2 per read at the median, 8+ in a burst);
        # it never makes the first read carry most of a stream, as nginx's buffering or gzip does
        return float(verdict.evidence.get("first_read_share_p50") or 0.0) < WHOLE_RESPONSE_SHARE
    if isinstance(verdict.evidence.get("excess_s"), (int, float)):
        return float(verdict.evidence["excess_s"]) <= lag_s  # a ratio verdict that says its excess in seconds
    if verdict.unit != "s" or verdict.figure is None or verdict.budget is None:
        return True  # rates and ratios cannot be compared with a lag: be cautious
    return verdict.figure - verdict.budget <= lag_s


def judge_all(experiment: Experiment, obs: Observations, *, client_lag: dict[str, Any] | None = None,
              phases: Collection[str] | None = None) -> list[Verdict]:
    """One verdict per SLA entry and scoped phase (``judge_entry``). ``phases``: only the entries
    scoped to these phases (a run a fault ended early: those that ran)."""
    return [judge_entry(entry, obs, phase, client_lag=client_lag)
            for entry in experiment.sla for phase in entry.phases or (None,)
            if phases is None or phase in phases]


def judge_entry(entry: SlaEntry, obs: Observations, phase: str | None, *,
                client_lag: dict[str, Any] | None = None) -> Verdict:
    """The verdict of one SLA entry on ``phase``, made in one place: the verifier's finding, the
    entry's name and ``expect``, and at most one cause the run itself gives for calling a failure
    inconclusive — the host first (a neighbour that took the CPU slows the load generator too),
    then the load generator's own lateness (a slow client is never mistaken for a slow server)."""
    found = entry.spec.judge(obs, phase)
    cause = _host_cause(found, obs) or _client_cause(found, client_lag or {}, phase)
    status, evidence = ((found.status, found.evidence) if cause is None
                        else ("inconclusive", {**found.evidence, **cause}))
    return replace(found, status=status, evidence=evidence, expect=entry.expect, name=entry.name)


def _client_cause(found: Verdict, client_lag: dict[str, Any], phase: str | None) -> dict[str, Any] | None:
    """Evidence for a failure the load generator's own lateness could explain, else None."""
    saturated, late_s, why = client_lateness(client_lag, phase)
    if not saturated or found.status != "fail" or not _within_client_lag(found, late_s):
        return None
    return {"inconclusive_cause": CLIENT_SATURATED, "saturated_because": why, "client_lag": client_lag}


def _host_cause(found: Verdict, obs: Observations) -> dict[str, Any] | None:
    """Evidence for a failed comparison of two phases (``recovery``) the host explains, else None:
    the host's other processes took materially more of a saturated host in the judged phase than in
    the reference one (``chaos.host.contention``): the stack's CPU changed, not necessarily the stack."""
    reference, judged = found.evidence.get("baseline_phase"), found.evidence.get("judged_phase")
    if found.status != "fail" or found.sla not in TIMING_SLAS or not reference or not judged:
        return None
    shift = contention_shift(obs, str(judged), str(reference))
    if shift is None:
        return None
    return {"inconclusive_cause": HOST_CHANGED, "host_contention": shift}
