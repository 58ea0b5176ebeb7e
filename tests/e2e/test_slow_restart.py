"""An outage at its real length, in a whole run (issue 40, point 3): a builtin stack killed by
``process.kill {restart: true}`` whose restart is slow (a test kind: its restart waits before it
starts the real stack process again, as vLLM's three processes take minutes). The phase, the fault's
time in force and the outage in the report are as long as the restart really took, and the
closed-loop clients backed off on the refused connections instead of flooding the phase.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.api import run
from chaos.experiment import experiment_from_dict
from chaos.model.experiment import TargetSpec
from chaos.output.report import render_summary
from chaos.targets.base import TARGET_KINDS, BuiltinStack, Target, TargetStart, target_kind
from chaos.targets.registry import kinds

pytestmark = pytest.mark.timeout(90)

RESTART_WAIT_S = 2.5


class SlowRestart(BuiltinStack):
    """The builtin stack, whose restart leaves it down ``RESTART_WAIT_S`` longer before its real start."""

    kind = "test.slow-restart"
    summary = "a test's kind: the builtin stack with a slow restart"
    order = 61

    @classmethod
    def create(cls, spec: TargetSpec, start: TargetStart) -> Target:
        return cls(spec, start.run_dir / "stack.log", start.seed)

    async def restart(self) -> None:
        await self.stop()
        await asyncio.sleep(RESTART_WAIT_S)  # an engine importing its libraries, loading weights
        self.info = await self.start()


@pytest.fixture
def slow_restart() -> Iterator[None]:
    kinds()
    target_kind(SlowRestart)
    try:
        yield
    finally:
        TARGET_KINDS.pop(SlowRestart.kind, None)


def test_a_slow_restart_is_reported_at_its_real_length(slow_restart: None, tmp_path: Path) -> None:
    exp = experiment_from_dict({
        "name": "slow-restart", "target": {"kind": "test.slow-restart"},
        "load": {"concurrency": 4, "max_tokens": 8, "connect_backoff": {"initial": "200ms", "max": "1s"}},
        "phases": [
            {"name": "baseline", "duration": "1500ms"},
            {"name": "kill", "duration": "2s",
             "faults": [{"kind": "process.kill", "at": "300ms", "restart": True}]},
            {"name": "recovery", "duration": "2s"},
        ],
        "sla": [{"kind": "errors", "budget": "0%", "phases": ["baseline"]}],
        "safety": {"max_duration": "40s", "drain_timeout": "5s", "cleanup_window": "200ms"},
    })
    result = run(exp, out_dir=tmp_path / "run", handle_signals=False)
    assert result.exit_code == 0, result.error
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    kill = next(p for p in report["phases"] if p["name"] == "kill")
    fault = next(f for f in report["faults"] if f["name"] == "process.kill")
    outage = fault["revert_evidence"]["outage_s"]
    # the kill at +0.3 s, then the restart's wait and the stack's own start: the outage, then the phase
    assert outage >= RESTART_WAIT_S and fault["revert_evidence"]["restart_s"] >= RESTART_WAIT_S, fault
    assert fault["actual_in_force_s"] >= outage + 0.3, fault  # today: 2 s, the planned phase alone
    assert kill["actual_duration_s"] >= fault["actual_in_force_s"] and kill["planned_duration_s"] == 2.0, kill
    # the restart began at the kill (+0.3 s), so at the phase's planned end (2 s) the revert still waits for the
    # rest of the restart's wait and the stack's own start: at least RESTART_WAIT_S - 1.7 s (the stack's start
    # comes on top, ~1 s, less on a quiet box: 1.75-1.97 s measured, which a bound of 2 s once failed)
    assert kill["reverts_took_s"] >= RESTART_WAIT_S - 1.7 and kill["in_force_duration_s"] < 2.5, kill
    summary = render_summary(result)
    assert f"phase kill: {kill['actual_duration_s']:.2f}s of 2s planned" in summary, summary
    assert f"outage {outage:.2f}s (kill sent to serving again)" in summary, summary
    # the clients backed off on the refused connections: 200 ms, 400 ms, 800 ms, then at most 1 s (less 25%
    # jitter) each, not one every 50 ms as before (80 a second of four clients)
    refused = [s for s in result.observations.streams if s.error is not None and s.error.kind == "connect"]
    assert refused and len(refused) <= 4 * (outage / 0.75 + 3), (len(refused), outage)
    stats = next(n.data for n in result.observations.notes if n.topic == "load_process")
    assert stats["connect_backoffs"] == len(refused) and stats["connect_backoff_s"] > 0, stats
