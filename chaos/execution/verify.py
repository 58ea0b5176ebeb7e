"""Judging observations against an experiment's SLA entries; used live and by `streamchaos verify`
(``chaos.output.replay``)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from chaos.execution.sequential import sequential_evidence, sequential_spec, sequential_view
from chaos.host.contention import HOST_SATURATED, contention_shift
from chaos.model.observations import Observations
from chaos.model.turns import turn_view
from chaos.model.verdict import Verdict

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment, SlaCheck, SlaEntry

__all__ = ["CLIENT_SATURATED", "HOST_CHANGED", "HOST_SATURATED", "client_lateness", "judge_all", "judge_entry"]

# Which verdicts a saturated load generator or a busier host can falsify is the kind's own fact
# (``SlaSpec.timing``, and ``SlaSpec.lateness_explains`` for how): its own lag inflates every
# measured time, and a client that reads late finds several events waiting in one read.
CLIENT_SATURATED = "load generator saturated"  # the two causes of an inconclusive this module gives
HOST_CHANGED = "host contention changed"
# HOST_SATURATED (chaos.host.contention), re-exported: the cause a verifier gives itself (``streaming``,
# ``relay``) when a saturated host, not the path, may have bunched the events


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


def judge_all(experiment: Experiment, obs: Observations, *, client_lag: dict[str, Any] | None = None,
              phases: Collection[str] | None = None) -> list[Verdict]:
    """One verdict per SLA entry and scoped phase (``judge_entry``), and one per ``error``-severity alert
    of ``safety.stop_when`` (``chaos.fleet.stop_when``). ``phases``: only the entries scoped to these
    phases (a run a fault ended early: those that ran)."""
    verdicts = [judge_entry(entry, obs, phase, client_lag=client_lag)
                for entry in experiment.sla for phase in entry.phases or (None,)
                if phases is None or phase in phases]
    if phases is None and experiment.safety.stop_when:  # `error` alerts of the fleet's own: one verdict each
        from chaos.fleet.stop_when import stop_when_verdicts

        verdicts += stop_when_verdicts(experiment.safety.stop_when, obs)
    return verdicts


def judge_entry(entry: SlaEntry, obs: Observations, phase: str | None, *,
                client_lag: dict[str, Any] | None = None) -> Verdict:
    """The verdict of one SLA entry on ``phase``, made in one place: the verifier's finding, the
    entry's name and ``expect``, and at most one cause the run itself gives for calling a failure
    inconclusive — the host first (a neighbour that took the CPU slows the load generator too),
    then the load generator's own lateness (a slow client is never mistaken for a slow server)."""
    spec = sequential_spec(entry.spec, obs, phase)  # a phase that ran until decided: each look's spending
    obs = turn_view(obs, entry.turns)  # `turns:` (chaos.model.turns): the streams of those turns only
    found = sequential_evidence(spec.judge(sequential_view(spec, obs, phase), phase), obs, phase)
    if entry.turns is not None:
        found = replace(found, evidence={**found.evidence, "turns": entry.turns.text()})
    cause = _host_cause(spec, found, obs) or _client_cause(spec, found, client_lag or {}, phase)
    status, evidence = ((found.status, found.evidence) if cause is None
                        else ("inconclusive", {**found.evidence, **cause}))
    evidence = _with_moves(evidence, obs, phase)
    return replace(found, status=status, evidence=evidence, expect=entry.expect, name=entry.name,
                   when_unobservable=entry.when_unobservable)


def _with_moves(evidence: dict[str, Any], obs: Observations, phase: str | None) -> dict[str, Any]:
    """``evidence`` plus, when faults moved streams into or out of ``phase`` (``Observations.population``:
    a stream is judged in the phase of the fault it lived through), how many, by fault."""
    moved = obs.moves().get(phase) if phase is not None else None
    return evidence if not moved else {**evidence, "touched_by_faults": moved}


def _client_cause(spec: SlaCheck, found: Verdict, client_lag: dict[str, Any],
                  phase: str | None) -> dict[str, Any] | None:
    """Evidence for a failure the load generator's own lateness could explain, else None: only a
    ``timing`` kind's, and only as far as its ``lateness_explains`` allows (a figure 500 ms over a
    TTFT budget is not explained by a client whose event loop runs 30 ms late; one 10 ms over is)."""
    saturated, late_s, why = client_lateness(client_lag, phase)
    if not saturated or found.status != "fail" or not spec.timing or not spec.lateness_explains(found, late_s):
        return None
    return {"inconclusive_cause": CLIENT_SATURATED, "saturated_because": why, "client_lag": client_lag}


def _host_cause(spec: SlaCheck, found: Verdict, obs: Observations) -> dict[str, Any] | None:
    """Evidence for a failed comparison of two phases (``recovery``) the host explains, else None:
    the host's other processes took materially more of a saturated host in the judged phase than in
    the reference one (``chaos.host.contention``): the stack's CPU changed, not necessarily the stack."""
    reference, judged = found.evidence.get("baseline_phase"), found.evidence.get("judged_phase")
    if found.status != "fail" or not spec.timing or not reference or not judged:
        return None
    shift = contention_shift(obs, str(judged), str(reference))
    if shift is None:
        return None
    return {"inconclusive_cause": HOST_CHANGED, "host_contention": shift}
