"""The fleet lever as a run obeys it: engaged before the run, the run is refused and nothing is started;
engaged while a fault is in force, the run halts within ``every`` plus one read, reverts the fault and
ends ``halted`` (exit 4), and its report says who engaged the lever and why."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.api import runner as make_runner
from chaos.experiment import experiment_from_dict
from chaos.fleet.lever import engage_file
from chaos.model.observations import FaultEvent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

EVERY_S = 0.2


def _experiment(lever: Path) -> Any:
    return experiment_from_dict({
        "name": "lever", "seed": 1, "load": {"concurrency": 4, "max_tokens": 16},
        "phases": [{"name": "baseline", "duration": "1s"},
                   {"name": "slowed", "duration": "8s",
                    "faults": [{"kind": "client.slow_reader", "read_delay": "5ms", "fraction": 0.5}]}],
        "safety": {"max_duration": "60s", "drain_timeout": "2s", "cleanup_window": "100ms",
                   "lever": {"file": str(lever), "every": f"{EVERY_S * 1000:g}ms"}},
        "sla": [{"kind": "errors", "budget": "5%"}],
    })


class _EngageOnInject:
    """Engages the lever 0.3 s after the fault is injected, and keeps when."""

    def __init__(self, lever: Path) -> None:
        self.lever = lever
        self.engaged_ns: int | None = None

    def on_event(self, event: Any) -> None:
        if isinstance(event, FaultEvent) and event.action == "inject" and self.engaged_ns is None:
            threading.Timer(0.3, self._engage).start()

    def _engage(self) -> None:
        self.engaged_ns = time.monotonic_ns()
        engage_file(self.lever, reason="incident 4711", by="oncall@test")


def test_an_engaged_lever_halts_a_running_run_and_reverts_its_fault(tmp_path: Path) -> None:
    lever = tmp_path / "lever"
    engager = _EngageOnInject(lever)
    result = asyncio.run(make_runner(_experiment(lever), out_dir=tmp_path / "run", handle_signals=False,
                                     listeners=[engager]).run())
    assert result.status == "halted" and result.exit_code == 4, result.error
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    halt = report["halt"]
    assert "incident 4711" in halt["reason"] and "oncall@test" in halt["reason"], halt
    (halt_note,) = result.observations.notes_on("halt")
    assert engager.engaged_ns is not None
    lag_s = (halt_note.t - engager.engaged_ns) / 1e9
    print(f"halt {lag_s * 1000:.0f} ms after the lever was engaged (every {EVERY_S * 1000:g} ms)")
    assert 0 <= lag_s <= EVERY_S + 0.5, lag_s
    (fault,) = report["faults"]
    assert fault["injected_at"] is not None and fault["reverted_at"] is not None, fault
    assert report["fleet"]["lever"]["watch"]["reads"] >= 1


def test_an_engaged_lever_refuses_the_run_before_anything_starts(tmp_path: Path) -> None:
    lever = tmp_path / "lever"
    engage_file(lever, reason="freeze for the launch", by="sre@test")
    result = asyncio.run(make_runner(_experiment(lever), out_dir=tmp_path / "run", handle_signals=False).run())
    assert result.exit_code == 4 and result.target is None, result.error
    assert "freeze for the launch" in result.error and "streamchaos lever off" in result.error, result.error
    assert result.observations.streams == []
