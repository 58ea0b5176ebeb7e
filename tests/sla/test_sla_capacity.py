"""`capacity`: ready pods back to their count before a k8s fault, within a budget; failures meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

from chaos.model.observations import FaultEvent, Observations, PhaseWindow
from sla import judge
from sla.capacity import READY_SERIES, disruptions

pytestmark = pytest.mark.timeout(10)


def kill(synth: Any, at: float, *, name: str = "k8s.pod_kill", phase: str = "kill",
         scheduled: bool = False) -> list[FaultEvent]:
    """A pod_kill whose delete was requested at ``at`` (in the inject evidence, or in the revert's when scheduled)."""
    pods = [{"name": "web-1", "uid": "u1", "requested_at_ns": synth.ns(at)}]
    inject = FaultEvent(name, "k8s.pod_kill", "inject", synth.ns(at - (1 if scheduled else 0.01)), phase,
                        evidence={"scheduled": True} if scheduled else {"pods": pods})
    revert = FaultEvent(name, "k8s.pod_kill", "revert", synth.ns(at + 9), phase,
                        evidence={"pods": pods} if scheduled else {})
    return [inject, revert]


def with_faults(obs: Observations, events: list[FaultEvent]) -> Observations:
    obs.faults.extend(events)
    return obs


def ready(synth: Any, *points: tuple[float, float]) -> list[Any]:
    return synth.series(READY_SERIES, points, namespace="demo")


def test_back_within_the_budget_passes_with_the_recovery_time(synth: Any) -> None:
    obs = with_faults(synth.obs(metrics=ready(synth, (0, 3), (10.05, 2), (13.5, 3))), kill(synth, 10))
    verdict = judge(obs, "capacity", {"within": "5s"})
    assert verdict.status == "pass" and verdict.figure == pytest.approx(3.5) and verdict.unit == "s"
    (row,) = verdict.evidence["disruptions"]
    assert row["baseline_ready"] == 3 and row["lowest_ready"] == 2 and row["outcome"] == "recovered"


def test_back_too_late_fails(synth: Any) -> None:
    obs = with_faults(synth.obs(metrics=ready(synth, (0, 3), (10.05, 2), (18, 3))), kill(synth, 10))
    verdict = judge(obs, "capacity", {"within": "5s"})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(8.0)
    assert verdict.evidence["disruptions"][0]["outcome"] == "late"


def test_never_back_fails_once_the_budget_has_passed_and_is_undecided_before(synth: Any) -> None:
    # ready stays at 2; the observations go on 20s past the kill
    long = with_faults(synth.obs(metrics=ready(synth, (0, 3), (10.05, 2), (30, 2))), kill(synth, 10))
    verdict = judge(long, "capacity", {"within": "5s"})
    assert verdict.status == "fail" and verdict.evidence["disruptions"][0]["outcome"] == "not_back"
    short = with_faults(synth.obs(metrics=ready(synth, (0, 3), (10.05, 2), (12, 2))), kill(synth, 10))
    undecided = judge(short, "capacity", {"within": "5s"})
    assert undecided.status == "inconclusive" and "before the 5s budget ran out" in undecided.evidence["reason"]


def test_a_sample_at_the_old_count_before_the_drop_is_not_a_recovery(synth: Any) -> None:
    """The watch reports the drop a little after the request; a sample still at the old count stamped
    after the request (another count changed first) is not a recovery: only a return after the dip is."""
    obs = with_faults(synth.obs(metrics=ready(synth, (0, 3), (10.01, 3), (10.2, 2), (16, 3))), kill(synth, 10))
    verdict = judge(obs, "capacity", {"within": "5s"})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(6.0)


def test_a_scheduled_kill_is_measured_from_its_request_in_the_revert_evidence(synth: Any) -> None:
    obs = with_faults(synth.obs(metrics=ready(synth, (0, 3), (12.05, 2), (14, 3))), kill(synth, 12, scheduled=True))
    (d,) = disruptions(obs)
    assert d.start == synth.ns(12)
    assert judge(obs, "capacity", {"within": "5s"}).figure == pytest.approx(2.0)


def test_requests_failed_meanwhile_are_counted_and_can_be_budgeted(synth: Any, err: dict[str, Any]) -> None:
    streams = [
        synth.stream("ok-before", sent=8, tokens=3),
        synth.stream("cut", sent=9.5, tokens=20, itl=0.05, finish=None, done=False),  # ends ~10.5, no [DONE]
        synth.stream("error", sent=11, ttft=None, error=err["read"], status=None),
        synth.stream("ok", sent=11, tokens=3),
        synth.stream("hung-up", sent=10.2, hangup_after=0.5),  # a client fault: not counted
        synth.stream("after", sent=20, tokens=3),
    ]
    obs = with_faults(synth.obs(streams=streams, metrics=ready(synth, (0, 3), (10.05, 2), (13, 3))), kill(synth, 10))
    counted = judge(obs, "capacity", {"within": "5s"})
    (row,) = counted.evidence["disruptions"]
    assert (row["failed_streams"], row["streams_ended"]) == (2, 3) and counted.status == "pass"
    budgeted = judge(obs, "capacity", {"within": "5s", "max_failed": "50%"})
    assert budgeted.status == "fail" and row["failed_share"] == pytest.approx(2 / 3, abs=1e-3)


def test_scale_down_is_measured_from_its_revert(synth: Any) -> None:
    events = [FaultEvent("k8s.scale", "k8s.scale", "inject", synth.ns(5), "down",
                         evidence={"replicas_before": 3, "replicas_set": 1}),
              FaultEvent("k8s.scale", "k8s.scale", "revert", synth.ns(15), "down", evidence={"restored": True})]
    obs = with_faults(synth.obs(metrics=ready(synth, (0, 3), (5.2, 1), (16, 2), (17.5, 3))), events)
    verdict = judge(obs, "capacity", {"within": "5s"})
    assert verdict.status == "pass" and verdict.figure == pytest.approx(2.5)
    events[1] = FaultEvent("k8s.scale", "k8s.scale", "revert", synth.ns(15), "down",
                           evidence={"restored": False, "why": "x"})
    not_restored = judge(with_faults(synth.obs(metrics=ready(synth, (0, 3), (5.2, 1), (30, 1))), events),
                         "capacity", {"within": "5s"})
    assert not_restored.status == "fail" and not_restored.evidence["disruptions"][0]["outcome"] == "not_restored"
    up = [FaultEvent("k8s.scale", "k8s.scale", "inject", synth.ns(5), "up",
                     evidence={"replicas_before": 3, "replicas_set": 5}),
          FaultEvent("k8s.scale", "k8s.scale", "revert", synth.ns(15), "up", evidence={"restored": True})]
    assert disruptions(with_faults(synth.obs(), up)) == []  # scaling up takes nothing away


def test_phase_scope_and_missing_inputs_are_inconclusive(synth: Any) -> None:
    obs = with_faults(synth.obs(metrics=ready(synth, (0, 3), (10.05, 2), (12, 3))), kill(synth, 10, phase="kill"))
    assert judge(obs, "capacity", {"within": "5s"}, phase="kill").status == "pass"
    other = judge(obs, "capacity", {"within": "5s"}, phase="baseline")
    assert other.status == "inconclusive" and "in phase baseline" in other.evidence["reason"]
    no_series = judge(with_faults(synth.obs(), kill(synth, 10)), "capacity", {"within": "5s"})
    assert no_series.status == "inconclusive" and "kind: kubernetes target" in no_series.evidence["reason"]


def test_a_replacement_that_relapses_is_not_capacity_back(synth: Any) -> None:
    """As seen on a real node: the replacement Ready 0.84 s after the kill, NotReady 0.7 s later for 13 s
    (a crash loop). Capacity is back only when the count returned and held; the relapse is evidence."""
    crash_loop = ready(synth, (0, 3), (10.05, 2), (10.84, 3), (11.54, 2), (24.5, 3), (30, 3))
    phases = [PhaseWindow("kill", synth.ns(9.9), synth.ns(15))]
    obs = with_faults(synth.obs(metrics=crash_loop, phases=phases), kill(synth, 10))
    verdict = judge(obs, "capacity", {"within": "5s"})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(14.5)
    (row,) = verdict.evidence["disruptions"]
    assert (row["outcome"] == "late"
            and row["relapses"] == [{"back_s": 10.84, "relapsed_s": 11.54, "held_s": 0.7, "down_s": 12.96}])


def test_a_short_relapse_within_the_budget_passes_and_is_reported(synth: Any) -> None:
    flap = ready(synth, (0, 3), (10.05, 2), (10.5, 3), (11, 2), (12, 3), (30, 3))
    verdict = judge(with_faults(synth.obs(metrics=flap), kill(synth, 10)), "capacity", {"within": "5s"})
    assert verdict.status == "pass" and verdict.figure == pytest.approx(2.0)
    assert [r["back_s"] for r in verdict.evidence["disruptions"][0]["relapses"]] == [10.5]


def test_the_hold_is_a_field_and_ends_with_the_phase(synth: Any) -> None:
    back_then_down = ready(synth, (0, 3), (10.05, 2), (11, 3), (14, 2), (30, 2))
    obs = with_faults(synth.obs(metrics=back_then_down), kill(synth, 10))
    assert judge(obs, "capacity", {"within": "5s"}).status == "fail"  # held 3 s of the default 5 s: not back
    short_hold = judge(obs, "capacity", {"within": "5s", "hold": "2s"})
    assert short_hold.status == "pass" and short_hold.figure == pytest.approx(1.0)
    # the phase ended 2 s after the return: held until then is held (what came after is another phase's)
    phased = with_faults(synth.obs(metrics=back_then_down, phases=[PhaseWindow("kill", synth.ns(9.9), synth.ns(13))]),
                         kill(synth, 10))
    assert judge(phased, "capacity", {"within": "5s"}).status == "pass"
