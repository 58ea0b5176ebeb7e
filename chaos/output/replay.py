"""``streamchaos verify``: a finished run re-judged from its journal, through the same events, verdict
code and report code as a live run; the files are ``verify.json``/``verify.html``."""

from __future__ import annotations

import json
from pathlib import Path

from chaos.execution.events import EventBus, RunFinished, RunStarted, VerdictsReady, is_record
from chaos.execution.result import Result, exit_code_for
from chaos.execution.verify import judge_all
from chaos.model.experiment import Experiment
from chaos.model.observations import RECORD_TYPES, Observations, from_json, iter_journal
from chaos.output.report import ReportWriter

__all__ = ["replay"]


def replay(experiment: Experiment, run_dir: Path) -> Result:
    """Re-judge a finished run: its journal replayed through a run-event bus to the report writer.

    The same events a live run emits, the same verdict code, the same report code; the files are
    ``verify.json``/``verify.html`` so the run's own report stays as it was.
    """
    journal = run_dir / "journal.jsonl"
    header = next((b for b in iter_journal(journal) if b.get("type") == "run"), {})
    obs = Observations(experiment=str(header.get("experiment", experiment.name)), t0=int(header.get("t0", 0)),
                       wall_t0=float(header.get("wall_t0", 0.0)))
    bus = EventBus([_Collector(obs), ReportWriter(json_name="verify.json", html_name="verify.html", junit_name=None,
                                                  replace=True)])
    bus.emit(RunStarted(obs.experiment, str(run_dir), obs.t0, obs.wall_t0,
                        tuple((p.name, p.duration) for p in experiment.phases),
                        tuple((p.name, p.max_duration) for p in experiment.phases if p.max_duration is not None)))
    for body in iter_journal(journal):
        if body.get("type") in RECORD_TYPES:
            bus.emit(from_json(body))
    lag = next((n.data for n in reversed(obs.notes) if n.topic == "client_lag"), {})
    verdicts = judge_all(experiment, obs, client_lag=lag)
    bus.emit(VerdictsReady(tuple(verdicts)))
    previous = json.loads((run_dir / "report.json").read_text()) if (run_dir / "report.json").is_file() else {}
    result = Result(
        experiment=experiment, verdicts=verdicts, observations=obs, out_dir=run_dir,
        status=previous.get("status", "completed"),
        exit_code=exit_code_for(verdicts), started=previous.get("start", obs.wall_t0),
        ended=previous.get("end", obs.wall_t0),
        client_lag=lag,
    )
    bus.emit(RunFinished(result))
    return result


class _Collector:
    """Run listener that gathers the replayed records into ``Observations``."""

    def __init__(self, obs: Observations) -> None:
        self.obs = obs

    def on_event(self, event: object) -> None:
        if is_record(event):
            self.obs.add(event)
