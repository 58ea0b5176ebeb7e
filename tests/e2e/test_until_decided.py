"""A whole run on the builtin stack with two phases that run until decided: one whose verdict cannot
decide (a p99 from a few dozen TTFTs) stops at its max with ``stopped_by: max``; the last one, whose
p50 decides at its first look, stops there, and the load stops with it rather than at its max."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chaos.api import run
from chaos.execution.events import Stage
from chaos.execution.sequential import look_offsets
from chaos.experiment import experiment_from_dict
from chaos.model.observations import NS

pytestmark = pytest.mark.timeout(120)

EXPERIMENT = {
    "name": "until-decided", "seed": 4,
    "target": {"kind": "builtin", "model": "tiny"},
    "load": {"concurrency": 4, "max_tokens": 16},
    "phases": [{"name": "cannot", "duration": {"min": "1s", "max": "3s"}},
               {"name": "decides", "duration": {"min": "2s", "max": "30s"}}],
    "sla": [{"kind": "ttft", "name": "tail", "phases": ["cannot"], "quantile": "p99", "budget": "1s"},
            {"kind": "ttft", "phases": ["decides"], "quantile": "p50", "budget": "1s"}],
    "safety": {"max_duration": "60s", "cleanup_window": "500ms", "drain_timeout": "5s"},
}


class Lines:
    def __init__(self) -> None:
        self.looks: list[str] = []

    def on_event(self, event: Any) -> None:
        if isinstance(event, Stage) and event.what == "look":
            self.looks.append(event.detail)


def test_a_phase_stops_when_decided_and_one_that_cannot_decide_stops_at_max(tmp_path: Path) -> None:
    lines = Lines()
    result = run(experiment_from_dict(EXPERIMENT), out_dir=tmp_path / "run", handle_signals=False, listeners=[lines])
    obs = result.observations
    cannot, decides = obs.phase("cannot"), obs.phase("decides")
    assert cannot is not None and decides is not None
    assert cannot.t_end is not None and cannot.t_in_force is not None
    assert decides.t_end is not None and decides.t_in_force is not None
    # the p99 of a few dozen TTFTs never decides: the phase ran to its max, every look taken (on a starved box
    # a look still judging at max is the last: test_sequential.py)
    assert cannot.stopped_by == "max" and 1 <= cannot.looks <= len(look_offsets(1.0, 3.0)), cannot
    assert 2.9 <= (cannot.t_end - cannot.t_in_force) / NS < 6.0
    # the p50 decides at a look far before 30 s; the load stopped with the phase, not at its max
    assert decides.stopped_by == "decided" and 1 <= decides.looks <= 4
    assert (decides.t_end - decides.t_in_force) / NS < 10.0
    sent = [s.t_sent for s in obs.streams if s.t_sent is not None]
    assert max(sent) <= decides.t_end + NS // 2
    verdicts = {v.name: v for v in result.verdicts}
    assert verdicts["tail"].status == "inconclusive" and verdicts["ttft"].status == "pass"
    assert verdicts["tail"].evidence["sequential"]["stopped_by"] == "max"
    assert verdicts["ttft"].evidence["sequential"]["looks"] == decides.looks
    assert result.exit_code == 3
    # one line per look, with samples collected and needed per undecided verdict
    assert lines.looks[0].startswith("phase cannot: look 1 at ") and "tail " in lines.looks[0]
    assert "samples (needs ~" in lines.looks[0]
    assert lines.looks[-1].startswith(f"phase decides: look {decides.looks} at ")
    assert lines.looks[-1].endswith("ttft decided pass")
