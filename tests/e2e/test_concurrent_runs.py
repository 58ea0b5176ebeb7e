"""One Experiment object run twice at once: specs carry no run state, so neither run sees the other's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from chaos.api import runner as make_runner
from chaos.experiment import experiment_from_dict

pytestmark = pytest.mark.timeout(180)

EXPERIMENT = {
    "name": "twice", "seed": 5,
    "target": {"kind": "builtin", "kv_blocks": 64},
    "load": {"concurrency": 2, "max_tokens": 16},
    "phases": [
        {"name": "baseline", "duration": "1s"},
        {"name": "pressure", "duration": "2s", "faults": [{"kind": "kv.pressure", "blocks": 20}]},
    ],
    "sla": [{"kind": "errors", "budget": "0%"}, {"kind": "kv_cleanup", "within": "2s"}],
    "safety": {"max_duration": "1m", "cleanup_window": "2500ms", "drain_timeout": "5s"},
}


def test_the_same_experiment_runs_twice_concurrently(tmp_path: Path) -> None:
    experiment = experiment_from_dict(EXPERIMENT)
    before = repr(experiment)

    async def both() -> list:
        runners = [make_runner(experiment, out_dir=tmp_path / f"run{i}", handle_signals=False) for i in range(2)]
        return await asyncio.gather(*(r.run() for r in runners))

    results = asyncio.run(both())
    assert [r.status for r in results] == ["completed", "completed"], [r.error for r in results]
    assert all(r.ok for r in results), [[v.to_dict() for v in r.failing()] for r in results]
    for result in results:
        events = [(e.action, e.evidence) for e in result.observations.faults]
        assert [a for a, _ in events] == ["plan", "inject", "revert"]
        # each run reserved and released its own 20 blocks on its own stack
        assert events[1][1]["reserved"] == 20 and events[2][1]["released"] == 20
        # its own tally, not the other run's
        assert events[2][1]["reserved_at_revert"] == 20 and "note" not in events[2][1]
    assert results[0].target is not None and results[1].target is not None
    assert results[0].target.base_url != results[1].target.base_url
    assert repr(experiment) == before  # the experiment is exactly as it was
