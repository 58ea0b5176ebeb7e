"""`abort_propagation` on synthetic observations: a running gauge above the clients' open streams while a
hang-up fault is in force fails it when sustained, a lagging gauge of a correct engine passes, and a missing
running series (or no hang-up fault) is inconclusive with the reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import sla
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import FaultEvent, Observations

pytestmark = pytest.mark.timeout(30)

RUNNING, USAGE = "vllm:num_requests_running", "vllm:kv_cache_usage_perc"
EVERY = 0.2  # scrape interval, s
CLIENTS = 8
LIFE = 1.0  # each client's streams last 1 s, back to back, from 1 s to 11 s
FAULT = (3.0, 9.0)  # client.disconnect in force


def streams(synth: Any) -> list[Any]:
    out = []
    for c in range(CLIENTS):
        t = 1.0 + c * 0.1
        k = 0
        while t + LIFE <= 11.0:
            out.append(synth.stream(f"c{c}-{k}", phase="storm", sent=t, ttft=0.05, itl=LIFE / 20, tokens=20))
            t += LIFE + 0.01
            k += 1
    return out


def open_at(synth: Any, records: list[Any], t: float) -> int:
    at = synth.ns(t)
    return sum(1 for st in records if st.t_sent <= at < st.t_end)


def faults(synth: Any, phase: str = "storm") -> list[FaultEvent]:
    return [FaultEvent("hangups", "client.disconnect", "inject", synth.ns(FAULT[0]), phase),
            FaultEvent("hangups", "client.disconnect", "revert", synth.ns(FAULT[1]), phase)]


def observe(synth: Any, running: Callable[[float, int], float], *, with_faults: bool = True,
            name: str = RUNNING, phase: str = "storm") -> Any:
    """``running(t, open streams at t)`` is what the engine's gauge says at scrape time t."""
    records = streams(synth)
    metrics = synth.steps(name, 0.0, 12.0, EVERY, lambda t: running(t, open_at(synth, records, t)), model_name="tiny")
    metrics += synth.steps(USAGE, 0.0, 12.0, EVERY, lambda t: 0.01 * open_at(synth, records, t))
    obs = synth.obs(records, metrics, phases=[synth.phase("storm", 0.0, 12.0)])
    obs.faults = faults(synth, phase) if with_faults else []
    return obs


def test_running_equal_to_open_streams_passes(synth: Any) -> None:
    verdict = sla.judge(observe(synth, lambda t, n: n), "abort_propagation", {})
    assert verdict.status == "pass", verdict.evidence
    assert verdict.evidence["max_excess_seen"] == 0
    assert verdict.samples == 31  # scrapes from 3.0 s to 9.0 s
    assert verdict.unit == "s" and verdict.budget == 1.0


def test_a_gauge_lagging_one_scrape_passes(synth: Any) -> None:
    records = streams(synth)
    lagged = observe(synth, lambda t, n: open_at(synth, records, t - EVERY))
    verdict = sla.judge(lagged, "abort_propagation", {})
    assert verdict.status == "pass", verdict.evidence


def test_orphans_running_through_the_fault_fail_with_the_excess_as_evidence(synth: Any) -> None:
    orphans = observe(synth, lambda t, n: n + (4 if FAULT[0] <= t <= FAULT[1] else 0))
    verdict = sla.judge(orphans, "abort_propagation", {"sustain": "1s"})
    assert verdict.status == "fail"
    ev = verdict.evidence
    assert ev["max_excess_seen"] >= 2 and ev["share_in_excess"] > 0.5, ev
    assert verdict.figure == ev["longest_run_s"] and ev["longest_run_s"] >= 1.0
    assert ev["worst_scrape"]["running"] > ev["worst_scrape"]["allowed"]
    assert ev["kv_usage"]["series"] == USAGE


def test_an_excess_shorter_than_sustain_or_within_max_excess_passes(synth: Any) -> None:
    blip = observe(synth, lambda t, n: n + (6 if 5.0 <= t < 5.5 else 0))
    assert sla.judge(blip, "abort_propagation", {"sustain": "1s"}).status == "pass"
    one = observe(synth, lambda t, n: n + 1)
    verdict = sla.judge(one, "abort_propagation", {"max_excess": 1})
    assert verdict.status == "pass", verdict.evidence
    assert sla.judge(one, "abort_propagation", {"max_excess": 0}).status == "fail"


def test_an_excess_outside_the_fault_window_is_not_judged(synth: Any) -> None:
    after = observe(synth, lambda t, n: n + (5 if t > FAULT[1] + 0.1 else 0))
    assert sla.judge(after, "abort_propagation", {}).status == "pass"


def test_no_running_series_is_inconclusive_never_a_pass(synth: Any) -> None:
    obs = observe(synth, lambda t, n: n, name="some_other_gauge")
    verdict = sla.judge(obs, "abort_propagation", {})
    assert verdict.status == "inconclusive"
    assert "no running-requests series was scraped" in verdict.evidence["reason"]
    assert "vllm:num_requests_running" in verdict.evidence["reason"]


def test_no_hangup_fault_is_inconclusive(synth: Any) -> None:
    verdict = sla.judge(observe(synth, lambda t, n: n + 4, with_faults=False), "abort_propagation", {})
    assert verdict.status == "inconclusive"
    assert "no client fault was in force" in verdict.evidence["reason"]
    other_phase = observe(synth, lambda t, n: n + 4, phase="baseline")
    assert sla.judge(other_phase, "abort_propagation", {}, phase="storm").status == "inconclusive"


def test_a_window_shorter_than_sustain_is_inconclusive(synth: Any) -> None:
    verdict = sla.judge(observe(synth, lambda t, n: n), "abort_propagation", {"sustain": "10s"})
    assert verdict.status == "inconclusive"
    assert "too few to show an excess sustained for 10s" in verdict.evidence["reason"]


def test_bad_parameters_say_which_key_and_what_is_right() -> None:
    with pytest.raises(ExperimentInvalid, match=r"sla abort_propagation\.sustain: .*unit"):
        sla.judge(Observations(), "abort_propagation", {"sustain": 2})  # bare 2: seconds or milliseconds?
    with pytest.raises(ExperimentInvalid, match=r"sla abort_propagation\.max_excess"):
        sla.judge(Observations(), "abort_propagation", {"max_excess": -1})


def test_most_open_counts_one_instant_not_every_stream_that_touched_the_window() -> None:
    from sla.abort_propagation import most_open

    # back to back on one client: three streams touch [10, 30], but only one is open at any instant
    assert most_open([(0, 12), (12, 20), (20, 40)], 10, 30) == 1
    assert most_open([(0, 12), (11, 20), (25, None)], 10, 30) == 2  # 11..12 overlap; None: still open
    assert most_open([(0, 5), (31, 40)], 10, 30) == 0


def test_running_requests_of_several_engines_are_summed(synth: Any) -> None:
    records = streams(synth)
    half = [m for engine in ("0", "1") for m in synth.steps(
        RUNNING, 0.0, 12.0, EVERY, lambda t: (open_at(synth, records, t) + 4) / 2, engine=engine)]
    obs = synth.obs(records, half, phases=[synth.phase("storm", 0.0, 12.0)])
    obs.faults = faults(synth)
    verdict = sla.judge(obs, "abort_propagation", {})
    assert verdict.status == "fail" and verdict.evidence["max_excess_seen"] == 4, verdict.evidence
