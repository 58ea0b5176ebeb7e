"""Runner.halt: a listener stops a run mid-phase; every fault is reverted and the run ends 'halted'."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from chaos.experiment import experiment_from_dict
from chaos.observations import StreamRecord
from chaos.runner import Runner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_a_halted_run_reverts_and_says_why(tmp_path: Path) -> None:
    experiment = experiment_from_dict({
        "name": "halt", "target": {"kind": "builtin"}, "load": {"concurrency": 2, "max_tokens": 8},
        "phases": [{"name": "chaos", "duration": "30s", "faults": [{"kind": "client.disconnect", "after_tokens": 2}]}],
        "sla": [{"kind": "errors", "budget": "0%"}],
        "safety": {"max_duration": "2m", "cleanup_window": "200ms"},
    })

    class HaltAfter:
        def __init__(self, runner: Runner, streams: int) -> None:
            self.runner, self.left = runner, streams

        def on_event(self, event: Any) -> None:
            if isinstance(event, StreamRecord):
                self.left -= 1
                if self.left == 0:
                    self.runner.halt("test condition: 5 streams seen")

    runner = Runner(experiment, out_dir=tmp_path / "run", handle_signals=False)
    runner.listeners.append(HaltAfter(runner, 5))
    result = asyncio.run(runner.run())
    assert result.status == "halted" and result.exit_code == 4 and "5 streams seen" in (result.error or "")
    actions = [e.action for e in result.observations.faults]
    assert actions == ["plan", "inject", "revert"]
    assert result.ended - result.started < 25  # it did not wait for the 30s phase
