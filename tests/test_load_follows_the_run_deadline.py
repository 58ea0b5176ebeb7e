"""The load follows the run's hard stop when a restart moves it (issue 40, point 1): the load got a
fixed deadline (the hard stop) when the first phase began; ``RunDeadline.paused("restart")`` moves
the run's deadline out by the restart's length, and a long restart left the phases after it with no
load. The runner's own steps (``_phase_load``, the restarter) on a fake load that records its moves.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.execution.deadline import START_GRACE_S, RunDeadline
from chaos.execution.runner import Runner
from chaos.experiment import experiment_from_dict
from chaos.model.context import TargetInfo
from chaos.model.experiment import PhaseSpec, TargetSpec

pytestmark = pytest.mark.timeout(30)

S = 1_000_000_000
RESTART_S = 0.3
ALLOWANCE_S = 5.0


class _Load:
    """The driver's deadline calls, recorded."""

    def __init__(self) -> None:
        self.runs: list[int] = []
        self.moves: list[int] = []

    async def run(self, deadline_ns: int) -> None:
        self.runs.append(deadline_ns)

    async def move_deadline(self, deadline_ns: int) -> None:
        self.moves.append(deadline_ns)


class _SlowRestart:
    """A target whose restart takes ``RESTART_S``."""

    info = TargetInfo(kind="builtin", base_url="http://127.0.0.1:1/v1", model="m")

    @classmethod
    def startup_allowance_s(cls, spec: TargetSpec) -> float | None:
        return ALLOWANCE_S

    async def restart(self) -> None:
        await asyncio.sleep(RESTART_S)


class _Ctx:
    target: Any = None


async def _moves(tmp_path: Path) -> tuple[_Load, dict[str, list[int]]]:
    exp = experiment_from_dict({"name": "follow", "target": {"kind": "builtin"},
                                "phases": [{"name": "a", "duration": "1s"}],
                                "safety": {"max_duration": "30s"}})
    runner = Runner(exp, out_dir=tmp_path / "run", handle_signals=False)
    load, seen = _Load(), {}
    driver: Any = load  # a fake of what the runner drives: only the deadline calls
    async with asyncio.timeout(None) as timeout:
        runner._deadline = timeout
        runner._clock = RunDeadline(timeout, 10.0)
        runner._clock.ready()
        target: Any = _SlowRestart()  # a fake: only what the restarter reads
        ctx: Any = _Ctx()
        restart = runner._restarter(target, ctx)
        task = await runner._phase_load(driver, None, PhaseSpec("kill", 1.0), time.monotonic_ns(), False)
        await task
        await restart()  # a kill's restart in the first phase: the run's stop moved out by its length
        seen["after restart"] = list(load.moves)
        await runner._phase_load(driver, task, PhaseSpec("recovery", 1.0), time.monotonic_ns(), False)
        seen["next phase"] = list(load.moves)
        await runner._phase_load(driver, task, PhaseSpec("last", 1.0), time.monotonic_ns(), True)
        await restart()  # the last phase set the load's real end: a restart leaves it there
        seen["last phase"] = list(load.moves)
    return load, seen


def test_a_restart_moves_the_loads_deadline_with_the_runs(tmp_path: Path) -> None:
    load, seen = asyncio.run(_moves(tmp_path))
    first = load.runs[0]  # the hard stop when the first phase began: about 10 s out
    during, after = seen["after restart"]  # today: none, the load stopped at `first` whatever the restart took
    assert during - first >= int((ALLOWANCE_S + START_GRACE_S - 0.5) * S)  # not cut mid-restart
    assert after - first >= int((RESTART_S - 0.05) * S) and after - first < int((RESTART_S + 0.5) * S)
    # each phase before the last passes the moved stop on. Within 1 ms, not to the nanosecond: each pass turns
    # the loop's float deadline into monotonic ns afresh (CI read it 1.07 us short)
    assert len(seen["next phase"]) == 3 and seen["next phase"][-1] >= after - 1_000_000, (seen, after)
    assert len(seen["last phase"]) == 4  # the last phase's end, and nothing after it
    assert seen["last phase"][-1] < seen["next phase"][-1] - 5 * S
