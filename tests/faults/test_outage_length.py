"""An outage at its real length (issue 40, point 3): a fault is in force until its revert *completes*
(a killed target serving again), a phase lasts its whole window, reverts included, and the console
and report say so. In `vllm-engine-kill` the restart took 198 s while report.json said
``actual_duration_s 8.08`` and ``actual_in_force_s 8.12``, the console "8.08s of 8s planned".

Pure tests on synthetic journals, and ``process.kill``'s revert against real child processes whose
restart is still under way when the revert begins.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import faults.kill_schedule
from chaos.execution.coverage import fault_times, phase_times, shortfalls
from chaos.model.context import RunContext, TargetInfo
from chaos.model.observations import FaultEvent, Observations, PhaseWindow
from chaos.output.report import phase_report, timing_lines
from faults.process import ProcessKill

pytestmark = pytest.mark.timeout(60)

S = 1_000_000_000
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _journal() -> Observations:
    """The shape of the vLLM run: a kill at +2 s of an 8 s phase, its restart done 190 s after the revert began."""
    obs = Observations(t0=0)
    obs.add(PhaseWindow("baseline", 0, 10 * S, 0))
    obs.add(FaultEvent("kill", "process.kill", "plan", 10 * S, "engine-kill", undo={"restart": True}))
    obs.add(FaultEvent("kill", "process.kill", "inject", 10 * S + S // 10, "engine-kill", t_started=10 * S))
    obs.add(FaultEvent("kill", "process.kill", "revert", 208 * S, "engine-kill", t_started=18 * S + S // 10,
                       evidence={"restarted": True, "outage_s": 196.0, "restart_s": 190.0}))
    obs.add(PhaseWindow("engine-kill", 10 * S, 208 * S + S // 10, 10 * S + S // 10))
    obs.add(PhaseWindow("recovery", 208 * S + S // 10, 216 * S + S // 10, 208 * S + S // 10))
    return obs


PLANNED = {"baseline": 10.0, "engine-kill": 8.0, "recovery": 8.0}


def test_a_fault_is_in_force_until_its_revert_completes() -> None:
    kill = fault_times(_journal(), PLANNED)[0]
    assert kill.in_force_at_s == pytest.approx(10.0)  # the inject began
    assert kill.revert_started_at_s == pytest.approx(18.1)
    assert kill.reverted_at_s == pytest.approx(208.0)
    assert kill.in_force_s == pytest.approx(198.0)  # today: 8.0, inject returned to revert began
    assert kill.revert_s == pytest.approx(189.9)
    assert not shortfalls([kill], 0.9)


def test_coverage_counts_the_phases_clock_not_the_slow_inject() -> None:
    """An 8 s phase whose inject took 3 s, cut by a halt 5 s after its fault was in force: 62% of its
    plan, an error; counted from the inject's start to the revert's end it passed as 101%."""
    obs = Observations(t0=0)
    obs.add(FaultEvent("slow", "test.slow", "plan", 10 * S, "chaos"))
    obs.add(FaultEvent("slow", "test.slow", "inject", 13 * S, "chaos", t_started=10 * S))
    obs.add(FaultEvent("slow", "test.slow", "revert", 18 * S + S // 10, "chaos", t_started=18 * S))
    slow = fault_times(obs, {"chaos": 8.0})[0]
    assert slow.in_force_s == pytest.approx(8.1)  # the report's wide span: inject began to revert done
    assert slow.clock_s == pytest.approx(5.0) and slow.coverage == pytest.approx(0.625)
    short = shortfalls([slow], 0.9)
    assert len(short) == 1 and "in force 5.00s of the 8s planned for phase chaos" in short[0], short
    assert "(62%, below safety.min_fault_coverage 90%)" in short[0], short


def test_a_phase_lasts_its_whole_window_its_reverts_included() -> None:
    times = {p.name: p for p in phase_times(_journal(), PLANNED)}
    kill = times["engine-kill"]
    assert kill.actual_s == pytest.approx(198.1)  # today: 8.0
    assert kill.in_force_s == pytest.approx(8.0)  # the planned part: last inject returned to first revert began
    assert kill.reverts_s == pytest.approx(190.0)
    assert times["baseline"].actual_s == pytest.approx(10.0) and times["baseline"].reverts_s == pytest.approx(0.0)


def test_the_console_and_the_report_give_the_real_span_beside_the_plan() -> None:
    obs = _journal()
    phases = phase_report(obs, PLANNED)
    kill = next(p for p in phases if p["name"] == "engine-kill")
    assert kill["actual_duration_s"] == pytest.approx(198.1) and kill["planned_duration_s"] == 8.0
    assert kill["in_force_duration_s"] == pytest.approx(8.0) and kill["reverts_took_s"] == pytest.approx(190.0)
    assert kill["end_s"] == pytest.approx(208.1)
    faults = [{"name": "kill", "phase": "engine-kill", "actual_in_force_s": 198.0, "planned_in_force_s": 8.0,
               "revert_evidence": {"outage_s": 196.0}}]
    line = next(t for t in timing_lines({"phases": phases, "faults": faults}) if "engine-kill" in t)
    assert line.startswith("phase engine-kill: 198.10s of 8s planned"), line
    assert "its reverts 190.00s" in line and "faults in force 8.00s of it" in line, line
    assert "kill in force 198.00s of 8s" in line and "outage 196.00s (kill sent to serving again)" in line, line


# -- process.kill: the revert waits for a restart already under way --------------------------------------

@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def test_the_revert_waits_for_the_restart_under_way_to_its_end(
        tmp_path: Path, children: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart longer than the schedule's own wait (15 s; 0.3 s here): the revert waits for it to end.
    Today the revert gave up on it, cancelled it midway and started the target a second time."""
    monkeypatch.setattr(faults.kill_schedule, "REVERT_WAIT_S", 0.3)
    proc = subprocess.Popen(SLEEPER)
    children.append(proc)
    ctx = RunContext(seed=1, target=TargetInfo(kind="builtin", base_url="http://127.0.0.1:1/v1", pid=proc.pid),
                     run_dir=tmp_path)
    begun: list[float] = []

    async def restart_target() -> None:
        begun.append(time.monotonic())
        await asyncio.to_thread(proc.wait, 10)
        await asyncio.sleep(1.2)  # a slow engine's start
        new = subprocess.Popen(SLEEPER)
        children.append(new)
        ctx.target = replace(ctx.target, pid=new.pid)

    ctx.restart_target = restart_target
    params: dict[str, Any] = {"target": "server", "signal": "SIGKILL", "at": 0.05, "restart": True}
    injection = ProcessKill.from_params("crash", params).activate(ctx)
    await injection.inject()
    while not begun:  # the scheduled task killed it and is restarting it
        await asyncio.sleep(0.01)
    started = time.monotonic()
    outcome = await injection.revert()
    assert len(begun) == 1, "the restart under way was given up on and started again"
    assert time.monotonic() - started >= 1.0  # the revert returned once the target served again
    assert outcome["restarted"] and outcome["new_pid"] == children[-1].pid and children[-1].poll() is None
    assert "kill_task_error" not in outcome
    assert outcome["outage_s"] >= 1.2 and outcome["outage_s"] >= outcome["restart_s"]
