"""The survival bisection on synthetic paths whose boundary is known: it finds the boundary within the
resolution, says when the longest probe survives or even the shortest is cut, never starts a probe the
budget cannot hold, stops on a probe that cannot run, and reports a path that is not monotone."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable

import pytest

from chaos.survival.search import CUT, ERROR, GUIDED_PROBES, WHOLE, Budget, SearchResult, Trial, bisect, next_point

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def timeout_path(limit_s: float, clock: FakeClock, *, overhead_s: float = 0.5, hint_error_s: float = 0.0,
                 hints: bool = True) -> Callable[[float], object]:
    """A path that cuts any duration above ``limit_s`` at ``limit_s`` (a read timeout), and what it costs."""

    async def probe(d: float) -> Trial:
        if d <= limit_s:
            clock.now += d + overhead_s
            return Trial(d, WHOLE, d + overhead_s)
        clock.now += limit_s + overhead_s
        return Trial(d, CUT, limit_s + overhead_s, hint_s=limit_s + hint_error_s if hints else None,
                     detail={"hop": "nginx"})

    return probe


def search(probe: Callable[[float], object], *, max_s: float = 120.0, resolution_s: float = 1.0,
           budget_s: float = 10_000.0, clock: FakeClock | None = None) -> SearchResult:
    budget = Budget(budget_s, clock=clock or FakeClock())
    return asyncio.run(bisect(probe, max_s=max_s, resolution_s=resolution_s, budget=budget))  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [0.3, 1.5, 5.0, 14.9, 15.0, 59.0, 100.0, 119.2])
@pytest.mark.parametrize("hints", [True, False])
def test_the_boundary_is_found_within_the_resolution(limit: float, hints: bool) -> None:
    clock = FakeClock()
    found = search(timeout_path(limit, clock, hints=hints), clock=clock)
    b = found.boundary
    assert found.finished, found.why
    assert b.shortest_cut is not None and b.shortest_cut > limit
    assert (b.longest_whole or 0.0) <= limit
    assert b.gap_s is not None and b.gap_s <= 1.0
    assert len(found.trials) <= 1 + math.ceil(math.log2(120.0 / 1.0)) + GUIDED_PROBES
    if limit < 1.0:  # shorter than the resolution: cut at every probe, said so
        assert b.longest_whole is None and found.why.startswith("cut even at")
    else:
        assert found.why.startswith("resolved")
    assert not b.non_monotonic


def test_a_sharp_timeout_is_settled_in_three_probes_by_its_hint() -> None:
    clock = FakeClock()
    found = search(timeout_path(5.0, clock), max_s=8.0, clock=clock)
    assert [t.duration_s for t in found.trials] == [8.0, 4.5, 5.5]
    assert [t.outcome for t in found.trials] == [CUT, WHOLE, CUT]
    assert (found.boundary.longest_whole, found.boundary.shortest_cut) == (4.5, 5.5)


@pytest.mark.parametrize("seed", range(30))
def test_wrong_hints_cost_at_most_the_guided_probes(seed: int) -> None:
    rng = random.Random(seed)
    limit = rng.uniform(1.0, 119.0)
    clock = FakeClock()
    found = search(timeout_path(limit, clock, hint_error_s=rng.uniform(-40, 40)), clock=clock)
    assert found.finished and found.boundary.gap_s is not None and found.boundary.gap_s <= 1.0
    assert (found.boundary.longest_whole or 0.0) <= limit < found.boundary.shortest_cut  # type: ignore[operator]
    assert len(found.trials) <= 1 + math.ceil(math.log2(120.0)) + GUIDED_PROBES


def test_a_path_that_survives_the_longest_probe_says_so_after_one_probe() -> None:
    clock = FakeClock()
    found = search(timeout_path(1e9, clock), max_s=8.0, clock=clock)
    assert [t.duration_s for t in found.trials] == [8.0]
    assert found.survives_max and found.why.startswith("survives >= max")
    assert found.boundary.longest_whole == 8.0 and found.boundary.shortest_cut is None


def test_the_budget_is_never_overrun_and_the_search_says_it_did_not_finish() -> None:
    clock = FakeClock()
    budget_s = 30.0
    found = search(timeout_path(50.0, clock, hints=False), max_s=120.0, budget_s=budget_s, clock=clock)
    spent = clock.now - 100.0
    assert spent <= budget_s
    assert not found.finished and "budget ran out" in found.why
    assert found.trials == ()  # the first probe (120 s) never fitted 30 s


def test_a_budget_that_runs_out_midway_keeps_what_it_learnt() -> None:
    clock = FakeClock()
    found = search(timeout_path(50.0, clock, hints=False), max_s=120.0, budget_s=200.0, clock=clock)
    assert clock.now - 100.0 <= 200.0
    assert not found.finished and "budget ran out" in found.why
    assert found.trials and found.boundary.shortest_cut is not None
    b = found.boundary
    assert (b.longest_whole or 0.0) <= 50.0 < b.shortest_cut  # type: ignore[operator]


def test_the_budget_learns_a_probes_overhead_from_whole_probes() -> None:
    clock = FakeClock()
    budget = Budget(100.0, clock=clock)
    assert budget.expected_s(10.0) == pytest.approx(13.0)  # the guess before any probe was timed
    budget.took(Trial(10.0, WHOLE, wall_s=17.0))
    budget.took(Trial(10.0, CUT, wall_s=5.0))  # a cut one ended early: it says nothing about the overhead
    assert budget.expected_s(10.0) == pytest.approx(17.0)
    clock.now += 80.0  # 20 s left: a probe of 3 s is expected to take 10 s, one of 14 s 21 s
    assert budget.fits(3.0) and budget.fits(13.0) and not budget.fits(14.0)


def test_a_path_that_is_not_monotone_is_reported() -> None:
    clock = FakeClock()

    async def jittery(d: float) -> Trial:  # a 5 s timeout that once fires at 2 s (a hop that restarted)
        clock.now += d
        if d == 5.5:
            return Trial(d, CUT, 2.0, hint_s=2.0)
        return Trial(d, WHOLE, d) if d <= 5.0 else Trial(d, CUT, 5.0, hint_s=5.0)

    found = search(jittery, max_s=8.0, clock=clock)
    assert [t.duration_s for t in found.trials] == [8.0, 4.5, 5.5]
    assert found.boundary.non_monotonic == ("5.5s was cut 2s in, although 4.5s arrived whole",)
    assert "not monotone: 5.5s was cut 2s in" in found.why
    calm = search(timeout_path(5.0, FakeClock(), hint_error_s=-0.4), max_s=8.0)  # within half a resolution: noise
    assert calm.boundary.non_monotonic == ()


def test_a_whole_probe_above_a_cut_one_is_reported() -> None:
    from chaos.survival.search import boundary

    b = boundary([Trial(8.0, CUT), Trial(4.0, CUT), Trial(6.0, WHOLE), Trial(2.0, WHOLE)])
    assert (b.longest_whole, b.shortest_cut) == (2.0, 4.0)
    assert b.non_monotonic == ("6s arrived whole although 4s was cut",)


def test_a_probe_that_cannot_run_stops_the_dimension() -> None:
    calls: list[float] = []

    async def broken(d: float) -> Trial:
        calls.append(d)
        if len(calls) == 2:
            return Trial(d, ERROR, 0.1, detail={"error": "the stream hop refused the rule"})
        return Trial(d, CUT, 0.1)

    found = search(broken, max_s=8.0)
    assert calls == [8.0, 4.0]
    assert not found.finished and "could not run: the stream hop refused the rule" in found.why


def test_next_point_starts_at_max_and_bisects_without_hints() -> None:
    assert next_point([], max_s=8.0, resolution_s=1.0).point == 8.0
    step = next_point([Trial(8.0, CUT)], max_s=8.0, resolution_s=1.0)
    assert (step.point, step.guided) == (4.0, False)
    step = next_point([Trial(8.0, CUT, hint_s=5.0)], max_s=8.0, resolution_s=1.0)
    assert (step.point, step.guided) == (4.5, True)
    assert next_point([Trial(8.0, CUT, hint_s=5.0)], max_s=8.0, resolution_s=1.0, guided_left=0).point == 4.0
    with pytest.raises(ValueError):
        search(timeout_path(1.0, FakeClock()), max_s=0.0)
