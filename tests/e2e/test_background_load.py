"""kv.pressure with method hog, through the runner: background streams hold KV, stay outside the
SLA population, and stop at revert."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.api import run
from chaos.experiment import experiment_from_dict


@pytest.mark.timeout(120)
def test_hog_streams_hold_kv_and_stay_out_of_the_slas(tmp_path: Path) -> None:
    exp = experiment_from_dict({
        "name": "hog",
        "target": {"kind": "builtin", "model": "tiny", "kv_blocks": 64},
        "load": {"concurrency": 2, "max_tokens": 16},
        "phases": [
            {"name": "hogged", "duration": "3s", "faults": [
                {"kind": "kv.pressure", "method": "hog", "hog_streams": 3, "hog_prompt_chars": 400,
                 "hog_max_tokens": 600},
            ]},
            {"name": "after", "duration": "1500ms"},
        ],
        "sla": [{"kind": "errors", "budget": "0%"}, {"kind": "kv_cleanup", "within": "2s"}],
        "safety": {"cleanup_window": "3s"},
    })
    result = run(exp, out_dir=tmp_path / "run", handle_signals=False)
    assert result.status == "completed", result.error
    background = [s for s in result.observations.streams if s.background]
    assert len(background) >= 3  # a hog that finishes is replaced, so there can be more
    stopped = [s for s in background if s.hangup is not None]
    assert stopped and all(s.hangup.reason == "stopped" for s in stopped)  # the revert ended the rest
    assert all(s.complete for s in background if s.hangup is None)
    hogged = result.observations.phase("hogged")
    assert hogged is not None and hogged.t_end is not None
    used = [m.value for m in result.observations.series("streamchaos_kv_blocks_used")
            if hogged.t_start < m.t < hogged.t_end]
    assert max(used) >= 3 * 400 / 4 / 16  # the hogs' prompts alone hold this many blocks
    assert {v.sla: v.status for v in result.verdicts} == {"errors": "pass", "kv_cleanup": "pass"}
    assert all(not s.background for s in result.observations.population())
