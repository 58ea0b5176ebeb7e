"""The stop_when watch's bookkeeping, in process: a halt the run did not take (it was already stopping,
or in teardown) leaves no halt note; an alert firing before the run is not noted as starting again; an
``error`` alert's verdict is decided only by reads made while the run ran."""

from __future__ import annotations

from typing import Any

from chaos.fleet.stop_when import Firing, Reading, _Watch, stop_when_verdicts
from chaos.model.context import PromAlert, StopSource
from chaos.model.observations import Note, Observations

ALERT = PromAlert(expr="up == 0", severity="critical", where="safety.stop_when[0].alerts[0]")
ERROR = PromAlert(expr="rate(x[1m]) > 1", severity="error", where="safety.stop_when[0].alerts[1]")
SOURCE = StopSource(source="prometheus", url="http://127.0.0.1:9", alerts=(ALERT, ERROR), name="prometheus[0]",
                    where="safety.stop_when[0]")


def _firing(alert: PromAlert) -> Firing:
    return Firing(source=SOURCE.name, what=alert.expr, severity=alert.severity, description="", value=1.0,
                  labels={"job": "vllm"}, key=alert.where)


def test_a_halt_the_run_did_not_take_leaves_no_halt_note() -> None:
    notes: list[Any] = []
    watch = _Watch(SOURCE, None, lambda why: False, notes.append)
    watch._seen(Reading(SOURCE, (_firing(ALERT),), t_wall=1.0))
    assert [n.topic for n in notes] == ["stop_when"] and watch.halted
    taken: list[Any] = []
    _Watch(SOURCE, None, lambda why: True, taken.append)._seen(Reading(SOURCE, (_firing(ALERT),), t_wall=1.0))
    assert [n.topic for n in taken] == ["stop_when", "halt"]


def test_an_alert_firing_before_the_run_is_not_noted_again() -> None:
    notes: list[Any] = []
    before = Reading(SOURCE, (_firing(ERROR),), t_wall=1.0)
    watch = _Watch(SOURCE, None, lambda why: True, notes.append, before)
    watch._seen(Reading(SOURCE, (_firing(ERROR),), t_wall=2.0))
    assert notes == []
    watch._seen(Reading(SOURCE, (), t_wall=3.0))
    assert [n.data["state"] for n in notes] == ["resolved"]


def _observations(reads: int, fired: bool) -> Observations:
    obs = Observations()
    if fired:
        obs.notes.append(Note("stop_when", 1, {**_firing(ERROR).to_dict(), "state": "firing", "before_start": True}))
    obs.notes.append(Note("stop_when_watch", 2, {"source": SOURCE.name, "reads": reads}))
    return obs


def test_an_error_alerts_verdict_needs_a_read_while_the_run_ran() -> None:
    (silent,) = stop_when_verdicts([SOURCE], _observations(reads=0, fired=False))
    assert silent.status == "inconclusive" and silent.samples == 0
    (quiet,) = stop_when_verdicts([SOURCE], _observations(reads=3, fired=False))
    assert quiet.status == "pass"
    (before,) = stop_when_verdicts([SOURCE], _observations(reads=0, fired=True))
    assert before.status == "fail" and before.evidence["fired_before_start"] is True
