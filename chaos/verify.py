"""Judging observations against an experiment's SLA entries; used live and by `streamchaos verify`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos.observations import RECORD_TYPES, Observations, from_json, iter_journal
from sla.base import Verdict

if TYPE_CHECKING:
    from chaos.experiment.model import Experiment
    from chaos.runner import Result

__all__ = ["TIMING_SLAS", "client_lateness", "judge_all", "replay"]

# Verdicts a saturated load generator can falsify: its own lag inflates every measured time.
TIMING_SLAS = frozenset({"ttft", "itl", "throughput", "recovery", "goodput", "fluidity"})


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
    if isinstance(verdict.evidence.get("excess_s"), (int, float)):
        return float(verdict.evidence["excess_s"]) <= lag_s  # a ratio verdict that says its excess in seconds
    if verdict.unit != "s" or verdict.figure is None or verdict.budget is None:
        return True  # rates and ratios cannot be compared with a lag: be cautious
    return verdict.figure - verdict.budget <= lag_s


def judge_all(experiment: Experiment, obs: Observations, *, client_lag: dict[str, Any] | None = None) -> list[Verdict]:
    """One verdict per SLA entry and scoped phase, with ``expect`` and the entry's name applied."""
    from sla import judge

    verdicts: list[Verdict] = []
    for entry in experiment.sla:
        for phase in entry.phases or (None,):
            verdict = judge(obs, entry.kind, entry.params, phase, parsed=True)
            verdict = replace(verdict, expect=entry.expect, name=entry.name)
            saturated, late_s, why = client_lateness(client_lag or {}, phase)
            if saturated and verdict.status == "fail" and _within_client_lag(verdict, late_s):
                # a slow client is never mistaken for a slow server
                evidence = dict(verdict.evidence, inconclusive_cause="load generator saturated", saturated_because=why,
                                client_lag=client_lag)
                verdict = replace(verdict, status="inconclusive", evidence=evidence)
            verdicts.append(verdict)
    return verdicts


def replay(experiment: Experiment, run_dir: Path) -> Result:
    """Re-judge a finished run: its journal replayed through a run-event bus to the report writer.

    The same events a live run emits, the same verdict code, the same report code; the files are
    ``verify.json``/``verify.html`` so the run's own report stays as it was.
    """
    from chaos.events import EventBus, RunFinished, RunStarted, VerdictsReady
    from chaos.report import ReportWriter
    from chaos.runner import Result, exit_code_for

    journal = run_dir / "journal.jsonl"
    header = next((b for b in iter_journal(journal) if b.get("type") == "run"), {})
    obs = Observations(experiment=str(header.get("experiment", experiment.name)), t0=int(header.get("t0", 0)),
                       wall_t0=float(header.get("wall_t0", 0.0)))
    bus = EventBus([_Collector(obs), ReportWriter(json_name="verify.json", html_name="verify.html", junit_name=None)])
    bus.emit(RunStarted(obs.experiment, str(run_dir), obs.t0, obs.wall_t0, tuple((p.name, p.duration) for p in experiment.phases)))
    for body in iter_journal(journal):
        if body.get("type") in RECORD_TYPES:
            bus.emit(from_json(body))
    lag = next((n.data for n in reversed(obs.notes) if n.topic == "client_lag"), {})
    verdicts = judge_all(experiment, obs, client_lag=lag)
    bus.emit(VerdictsReady(tuple(verdicts)))
    previous = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").is_file() else {}
    result = Result(
        experiment=experiment, verdicts=verdicts, observations=obs, out_dir=run_dir, status=previous.get("status", "completed"),
        exit_code=exit_code_for(verdicts), started=previous.get("start", obs.wall_t0), ended=previous.get("end", obs.wall_t0),
        client_lag=lag,
    )
    bus.emit(RunFinished(result))
    return result


class _Collector:
    """Run listener that gathers the replayed records into ``Observations``."""

    def __init__(self, obs: Observations) -> None:
        self.obs = obs

    def on_event(self, event: object) -> None:
        from chaos.events import is_record

        if is_record(event):
            self.obs.add(event)  # type: ignore[arg-type]
