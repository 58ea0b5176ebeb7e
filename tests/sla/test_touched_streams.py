"""Streams are judged by the fault that touched them, not only by the phase they were sent in.

The case that asked for it (issue 40, point 2): in ``vllm-engine-kill`` on a slow engine, a baseline
stream sent 0.6 s before the kill phase was still streaming when EngineCore died and ended with
vLLM's in-band error; judged in the baseline it failed ``errors[baseline]`` at 6.7%.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from chaos.execution.runner import Runner
from chaos.execution.verify import judge_all
from chaos.experiment.loader import parse_experiment
from chaos.model.observations import IN_FLIGHT, PHASE_SCOPE, FaultEvent, Observations, from_json, to_json
from chaos.output.report import fault_report
from chaos.output.reports.faults import render_faults
from faults.base import REGISTRY, Injection
from faults.client import ClientTimeout

pytestmark = pytest.mark.timeout(30)

EXPERIMENT = """
name: engine-kill
phases:
  - {name: baseline, duration: 10s}
  - {name: engine-kill, duration: 10s}
  - {name: recovery, duration: 10s}
sla:
  - {kind: errors, budget: 0%, phases: [baseline, recovery]}
  - {kind: errors, budget: 100%, phases: [engine-kill]}
"""

BAND_ERROR = "EngineCore encountered an issue. See stack trace (above) for the root cause."


def fault_events(synth: Any, name: str = "kill", kind: str = "process.kill", scope: str = IN_FLIGHT,
                 phase: str = "engine-kill", start: float = 10.2, end: float = 18.0) -> list[FaultEvent]:
    """A fault's plan, inject (began at ``start``) and revert (returned at ``end``), seconds from t0."""
    ns = synth.ns
    return [FaultEvent(name, kind, "plan", ns(start - 0.01), phase, scope=scope),
            FaultEvent(name, kind, "inject", ns(start + 0.05), phase, t_started=ns(start)),
            FaultEvent(name, kind, "revert", ns(end), phase, t_started=ns(end - 5))]


def slow_engine(synth: Any, events: list[FaultEvent]) -> Observations:
    """Baseline streams of 2-3 s (vLLM on CPU): two sent just before the kill phase end in the kill's
    in-band error; the kill phase's own streams fail at once; recovery is clean."""
    streams = [synth.stream(f"b{i}", phase="baseline", sent=i * 0.5, ttft=0.5, itl=0.1, tokens=20)
               for i in range(16)]  # the last ends at 7.5 + 2.4 s, before the inject
    streams += [synth.stream(f"late{i}", phase="baseline", sent=9.4 + i * 0.1, ttft=0.5, itl=0.1, tokens=12,
                             in_band=BAND_ERROR, finish=None, done=False) for i in range(2)]  # end ~11 s
    streams += [synth.stream(f"k{i}", phase="engine-kill", sent=10.5 + i, ttft=None, status=None, finish=None,
                             done=False, error=synth.err_connect) for i in range(6)]
    streams += [synth.stream(f"r{i}", phase="recovery", sent=20 + i * 0.5, ttft=0.5, itl=0.1, tokens=20)
                for i in range(12)]
    obs: Observations = synth.obs(streams, phases=[synth.phase("baseline", 0, 10), synth.phase("engine-kill", 10, 20),
                                                   synth.phase("recovery", 20, 32)])
    obs.faults = events
    return obs


@pytest.fixture
def synth(synth: Any) -> Any:
    from chaos.model.observations import ErrorInfo

    synth.err_connect = ErrorInfo(kind="connect", message="connection refused")
    return synth


def verdicts(obs: Observations) -> dict[str, Any]:
    return {str(v.phase): v for v in judge_all(parse_experiment(EXPERIMENT), obs)}


def test_a_baseline_stream_the_kill_touched_is_the_kill_phases(synth: Any) -> None:
    obs = slow_engine(synth, fault_events(synth))
    found = verdicts(obs)
    baseline, kill = found["baseline"], found["engine-kill"]
    assert baseline.status == "pass", baseline  # today: fail at 2/18, the kill's errors in the baseline
    assert baseline.samples == 16
    assert baseline.evidence["touched_by_faults"] == {"moved_in": {}, "moved_out": {"kill": 2}}
    assert kill.samples == 8 and kill.figure == pytest.approx(1.0)  # its six, and the two it killed
    assert kill.evidence["touched_by_faults"] == {"moved_in": {"kill": 2}, "moved_out": {}}
    assert kill.evidence["by_kind"] == {"connect": 6, "in_band": 2}
    assert "touched_by_faults" not in found["recovery"].evidence  # nothing moved in or out: no key


def test_the_population_rule(synth: Any) -> None:
    obs = slow_engine(synth, fault_events(synth))
    ids = {p: {s.id for s in obs.population(p)} for p in ("baseline", "engine-kill", "recovery")}
    assert ids["engine-kill"] == {f"k{i}" for i in range(6)} | {"late0", "late1"}
    assert ids["baseline"] == {f"b{i}" for i in range(16)}
    assert len(obs.population()) == len(obs.streams)  # the whole run: unchanged
    assert obs.touched() == {"kill": ["late0", "late1"] + [f"k{i}" for i in range(6)]}
    assert obs.moves() == {"engine-kill": {"moved_in": {"kill": 2}, "moved_out": {}},
                           "baseline": {"moved_in": {}, "moved_out": {"kill": 2}}}


def test_a_stream_that_ended_before_the_inject_is_not_moved(synth: Any) -> None:
    # b15 ends at 9.9 s, 0.3 s before the inject began (10.2 s), although sent 2.5 s before the kill phase
    obs = slow_engine(synth, fault_events(synth))
    b15 = next(s for s in obs.streams if s.id == "b15")
    assert b15.t_end is not None and b15.t_end < synth.ns(10.2)
    assert b15 in obs.population("baseline") and b15 not in obs.population("engine-kill")
    # a stream sent after the revert returned is not the fault's either, though its phase ran on
    obs.streams.append(synth.stream("after", phase="engine-kill", sent=18.5))
    assert "after" not in obs.touched()["kill"]


def test_a_still_open_stream_lasts_until_the_run_ends_and_an_unreverted_fault_too(synth: Any) -> None:
    events = [e for e in fault_events(synth) if e.action != "revert"]  # a killed runner: no revert
    obs = slow_engine(synth, events)
    open_ = synth.stream("open", phase="recovery", sent=25, ttft=None, finish=None, done=False)
    open_.t_end = None  # a record cut short by the killed run
    obs.streams.append(open_)
    assert open_ in obs.population("engine-kill") and open_ not in obs.population("recovery")
    assert obs.population("recovery") == []  # r0..r11 were sent while it was still in force too: all moved
    assert obs.moves()["recovery"]["moved_out"] == {"kill": 13}


def test_a_client_fault_moves_nothing(synth: Any) -> None:
    events = fault_events(synth, name="timeouts", kind="client.timeout", scope=PHASE_SCOPE)
    obs = slow_engine(synth, events)
    assert {s.id for s in obs.population("engine-kill")} == {f"k{i}" for i in range(6)}
    assert obs.moves() == {}
    assert verdicts(obs)["baseline"].status == "fail"  # the baseline's own errors stay the baseline's
    assert obs.touched() == {"timeouts": [f"k{i}" for i in range(6)]}  # what it acted on: its phase's, sent then


def test_client_and_stream_fault_kinds_are_phase_scoped_and_every_other_in_flight() -> None:
    """A client rule is drawn when a request is sent, a stream hop takes a request's rules when it
    arrives: neither acts on a stream already running. Every other fault acts on what is in flight."""
    scopes = {kind: cls.scope for kind, cls in REGISTRY.items()}
    phase_scoped = {k for k, s in scopes.items() if s == PHASE_SCOPE}
    assert {"client.disconnect", "client.slow_reader", "client.timeout"} <= phase_scoped
    assert {k for k in phase_scoped if not k.startswith("client.")} == {k for k in scopes if k.startswith("stream.")}
    assert all(s == IN_FLIGHT for k, s in scopes.items() if not k.startswith(("client.", "stream.")))
    from chaos.model.observations import _old_scope  # what a journal from before scope reads each kind as

    assert {k: _old_scope(k) for k in scopes} == scopes


def test_the_scope_round_trips_and_an_old_journal_reads_as_in_flight(tmp_path: Any, synth: Any) -> None:
    event = FaultEvent("t", "client.timeout", "plan", 5, "p", scope=PHASE_SCOPE)
    assert from_json(to_json(event)) == event
    obs = slow_engine(synth, fault_events(synth, name="timeouts", kind="client.timeout", scope=PHASE_SCOPE))
    obs.dump(tmp_path / "journal.jsonl")
    loaded = Observations.load(tmp_path / "journal.jsonl")
    assert [e.scope for e in loaded.faults] == [PHASE_SCOPE, IN_FLIGHT, IN_FLIGHT]
    assert loaded.moves() == {}
    old = from_json('{"type":"fault","fault":"k","kind":"process.kill","action":"plan","t":1,"phase":"p"}')
    assert isinstance(old, FaultEvent) and old.scope == IN_FLIGHT


@pytest.mark.parametrize(("kind", "scope"), [("client.timeout", PHASE_SCOPE), ("stream.hold", PHASE_SCOPE),
                                             ("process.kill", IN_FLIGHT), ("network.latency", IN_FLIGHT)])
def test_a_line_from_before_scope_reads_by_its_kind(kind: str, scope: str) -> None:
    old = from_json(f'{{"type":"fault","fault":"f","kind":"{kind}","action":"plan","t":1,"phase":"p"}}')
    assert isinstance(old, FaultEvent) and old.scope == scope


def test_re_verifying_an_old_journal_with_a_client_fault_moves_nothing(tmp_path: Any, synth: Any) -> None:
    """A journal written before ``scope`` read its client fault as in_flight: re-verified, the baseline
    streams it never acted on moved into its phase."""
    import json

    obs = slow_engine(synth, fault_events(synth, name="timeouts", kind="client.timeout", scope=PHASE_SCOPE))
    obs.dump(tmp_path / "journal.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "journal.jsonl").read_text(encoding="utf-8").splitlines()]
    for body in lines:
        body.pop("scope", None)
    (tmp_path / "old.jsonl").write_text("".join(json.dumps(b) + "\n" for b in lines), encoding="utf-8")
    loaded = Observations.load(tmp_path / "old.jsonl")
    assert {e.scope for e in loaded.faults} == {PHASE_SCOPE}
    assert loaded.moves() == {} and loaded.touched() == obs.touched()
    as_in_flight = slow_engine(synth, fault_events(synth, name="timeouts", kind="client.timeout", scope=IN_FLIGHT))
    assert as_in_flight.moves() != {}  # what the old reading did


def test_the_runner_writes_the_faults_scope_on_its_plan(synth: Any) -> None:
    """``Runner._injected``'s plan event carries ``Fault.scope`` (a client fault's: ``phase``)."""
    emitted: list[FaultEvent] = []

    class _Done(Injection):
        async def inject(self) -> dict[str, Any]:
            return {}

        async def revert(self) -> dict[str, Any]:
            return {}

    async def no_revert(injection: Injection, phase: str) -> None:
        return None

    runner = SimpleNamespace(events=SimpleNamespace(emit=emitted.append), _revert=no_revert, fault_failure=None)
    fault = ClientTimeout(name="timeouts", fraction=1.0, timeout=0.2)

    async def inject_and_leave() -> None:
        async with Runner._injected(runner, _Done(fault, SimpleNamespace()), "p"):  # type: ignore[arg-type]
            pass

    asyncio.run(inject_and_leave())
    assert [(e.action, e.scope) for e in emitted][:2] == [("plan", PHASE_SCOPE), ("inject", IN_FLIGHT)]


def test_the_report_says_which_streams_each_fault_touched(synth: Any) -> None:
    obs = slow_engine(synth, fault_events(synth))
    row = fault_report(obs, {"baseline": 10, "engine-kill": 10, "recovery": 10})[0]
    assert (row["touched_streams"], row["moved_from_other_phases"]) == (8, 2)
    html = render_faults([row])
    assert "touched 8 streams (2 sent in another phase, judged in engine-kill)" in html


def test_the_console_names_a_fault_that_took_streams_from_another_phase(synth: Any) -> None:
    from chaos.output.report import moved_lines

    obs = slow_engine(synth, fault_events(synth))
    faults = fault_report(obs, {"baseline": 10, "engine-kill": 10, "recovery": 10})
    assert moved_lines({"faults": faults}) == [
        "kill touched 8 streams, 2 of them sent in another phase: judged in engine-kill, where the fault was"]
    obs.faults = fault_events(synth, name="timeouts", kind="client.timeout", scope=PHASE_SCOPE)
    assert moved_lines({"faults": fault_report(obs, {})}) == []
