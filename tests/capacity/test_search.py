"""The capacity search on a synthetic stack whose capacity is known: bracket then bisect finds it
within the interval it states, spends about log2(range / resolution) probes, says when the SLAs
never fail (a planted SLA that cannot fail) or always fail, and reports a noisy pass above a failure."""

from __future__ import annotations

import math
import random

import pytest

from chaos.capacity.probes import Case
from chaos.capacity.run import answer
from chaos.capacity.search import bracket, next_level
from chaos.model.capacity import CapacitySpec, Probe, lost_capacity

pytestmark = pytest.mark.timeout(30)


def walk(spec: CapacitySpec, meets, start: float | None = None, limit: int = 60) -> tuple[list[Probe], str]:
    """Run the search against ``meets(level) -> outcome`` until it stops."""
    probes: list[Probe] = []
    for _ in range(limit):
        level, why = next_level(spec, probes, start)
        if level is None:
            return probes, why
        probes.append(Probe("c", level, spec.probe, meets(level)))
    raise AssertionError(f"no end after {limit} probes: {[p.level for p in probes]}")


def threshold(capacity: float):
    return lambda level: "pass" if level <= capacity else "fail"


@pytest.mark.parametrize("capacity", [1, 3, 4, 7, 12, 33, 63, 64])
def test_whole_streams_are_found_within_the_resolution(capacity: int) -> None:
    spec = CapacitySpec(dimension="concurrency", low=1, high=64, resolution=0.05)
    probes, why = walk(spec, threshold(capacity))
    b = bracket(probes)
    assert b.passing is not None and b.passing <= capacity
    if capacity == 64:
        assert b.failing is None
    else:
        assert b.failing is not None and capacity < b.failing
        assert b.failing - b.passing <= 1 or b.failing <= b.passing * 1.05
    if capacity <= 20:  # one stream is within 5% only above 20: below it the answer is exact
        assert (b.passing, b.failing) == (capacity, capacity + 1)
    assert len(probes) <= 2 * math.ceil(math.log2(64)) + 1, [p.level for p in probes]
    assert why.startswith("resolved") or "highest level" in why


@pytest.mark.parametrize("seed", range(40))
def test_a_rate_is_bracketed_within_the_resolution(seed: int) -> None:
    rng = random.Random(seed)
    truth = rng.uniform(0.6, 95.0)
    spec = CapacitySpec(dimension="rate", low=0.5, high=100.0, resolution=0.05)
    probes, why = walk(spec, threshold(truth))
    b = bracket(probes)
    assert why.startswith("resolved")
    assert b.passing is not None and b.failing is not None
    assert b.passing <= truth < b.failing and b.failing <= b.passing * 1.05
    assert len(probes) <= 18, len(probes)  # log2(200) doubling + log2(log(2)/log(1.05)) halvings


def test_an_sla_that_cannot_fail_ends_at_the_highest_level_and_says_so() -> None:
    spec = CapacitySpec(dimension="concurrency", low=2, high=32)
    probes, why = walk(spec, lambda level: "pass")
    assert [p.level for p in probes] == [2, 4, 8, 16, 32]
    assert "the highest level (32 streams) met every SLA" in why
    got = answer(spec, Case("baseline", ()), probes, why)
    assert got.passing == 32 and got.failing is None and got.resolved


def test_a_stack_failing_even_the_lowest_level_says_so() -> None:
    spec = CapacitySpec(dimension="concurrency", low=1, high=16, start=8)
    probes, why = walk(spec, lambda level: "fail")
    assert [p.level for p in probes] == [8, 4, 2, 1]
    assert "even the lowest level (1 stream)" in why
    assert bracket(probes).passing is None


def test_a_fault_case_starts_from_the_baseline_capacity_and_searches_down() -> None:
    spec = CapacitySpec(dimension="rate", low=1, high=64, resolution=0.1)
    probes, _ = walk(spec, threshold(10.0), start=24.0)
    assert probes[0].level == 24.0 and probes[1].level == 12.0 and probes[2].level == 6.0
    b = bracket(probes)
    assert b.passing is not None and b.failing is not None and b.passing <= 10.0 < b.failing


def test_an_inconclusive_probe_counts_as_not_meeting_the_slas() -> None:
    spec = CapacitySpec(dimension="concurrency", low=1, high=16)
    probes = [Probe("c", 4, 6, "pass"), Probe("c", 8, 24, "inconclusive")]
    assert bracket(probes).failing == 8
    level, _ = next_level(spec, probes)
    assert level == 6  # between, not above


def test_a_noisy_pass_above_a_failure_is_reported_not_used() -> None:
    probes = [Probe("c", 4, 6, "pass"), Probe("c", 8, 6, "fail"), Probe("c", 12, 6, "pass")]
    b = bracket(probes)
    assert (b.passing, b.failing, b.non_monotone) == (4, 8, (12,))


def test_capacity_lost_is_an_interval_from_both_intervals() -> None:
    spec = CapacitySpec(dimension="rate", low=1, high=64)
    base = answer(spec, Case("baseline", ()), [Probe("baseline", 20, 6, "pass"), Probe("baseline", 21, 6, "fail")],
                  "resolved")
    half = answer(spec, Case("throttle", ()), [Probe("throttle", 10, 6, "pass"), Probe("throttle", 10.5, 6, "fail")],
                  "resolved")
    lost = lost_capacity(base, half)
    assert lost["point"] == pytest.approx(0.5)
    assert lost["at_least"] == pytest.approx(1 - 10.5 / 20) and lost["at_most"] == pytest.approx(1 - 10 / 21)


def test_two_searches_compare_by_whether_their_intervals_overlap() -> None:
    from chaos.capacity.compare import compare_capacity

    def body(**cases: tuple[float | None, float | None]) -> dict:
        return {"cases": [{"case": k, "capacity": {"passing": v[0], "failing": v[1]}} for k, v in cases.items()]}

    a = body(baseline=(8, 9), throttle=(4, 5), jitter=(6, 7), kill=(None, 1))
    b = body(baseline=(8, 9), throttle=(2, 3), jitter=(7, 8), gone=(1, 2))
    rows = {r.case: r for r in compare_capacity(a, b)}
    assert rows["baseline"].change == "same" and not rows["baseline"].flagged
    assert rows["throttle"].change == "lower" and rows["throttle"].flagged  # [2, 3) lies wholly below [4, 5)
    assert rows["jitter"].change == "higher"
    assert rows["kill"].change == "only in A" and rows["gone"].change == "only in B"


def test_an_open_loop_probe_is_long_enough_for_its_arrivals() -> None:
    from chaos.capacity.run import MIN_ARRIVALS, first_window

    rate = CapacitySpec(dimension="rate", low=0.5, high=32, probe=5, max_probe=20)
    assert first_window(rate, 10.0) == 5  # 50 arrivals already
    assert first_window(rate, 2.0) == MIN_ARRIVALS / 2.0
    assert first_window(rate, 0.5) == 20  # capped
    assert first_window(CapacitySpec(probe=5, max_probe=20), 1.0) == 5  # closed loop: its rate is the stack's


@pytest.mark.parametrize(("fault_capacity", "lost_truth"), [(10.0, 0.5), (20.0, 0.0)])
def test_a_fault_that_does_not_cost_capacity_shows_as_no_loss(fault_capacity: float, lost_truth: float) -> None:
    """A throttle to half speed halves what a stack serves: the search's loss interval holds 50%. A
    planted throttle that does nothing (the fault case as fast as the baseline) must show as a loss
    interval holding 0% and not 50%, so a game-day sees the fault did not bite."""
    spec = CapacitySpec(dimension="rate", low=0.5, high=64, start=2, resolution=0.05)
    base_probes, why = walk(spec, threshold(20.0))
    base = answer(spec, Case("baseline", ()), base_probes, why)
    assert base.passing is not None
    case_probes, why = walk(spec, threshold(fault_capacity), start=base.passing)
    case = answer(spec, Case("throttle", ()), case_probes, why)
    lost = lost_capacity(base, case)
    assert lost["at_least"] is not None and lost["at_most"] is not None
    assert lost["at_least"] - 1e-9 <= lost_truth <= lost["at_most"] + 1e-9, lost
    other = 0.5 if lost_truth == 0.0 else 0.0
    assert not lost["at_least"] <= other <= lost["at_most"], lost  # the two stacks cannot be mistaken for each other
