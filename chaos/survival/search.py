"""Where a stream stops surviving: bisection of one duration within a resolution and a time budget. Pure.

Every dimension of the survival matrix is a duration D (a held first event, a silence, a stream's
total length) and a yes/no per probe: the stream arrived whole, or it was cut. For a path whose hops
enforce timeouts the answer is monotone: a longer hold is never easier to survive than a shorter
one. The first probe is at ``max_s``: when it arrives whole the path survives at least that long
(one probe, the common case for a path without a short timeout); when it is cut, the boundary lies
in (0, max_s] and bisection narrows it to ``resolution_s`` in log2(max_s / resolution_s) probes, the
fewest any method needs for a monotone yes/no in the worst case.

A cut probe also says *when* it was cut (``Trial.hint_s``, on the dimension's own scale: a hold of
8 s cut by a 5 s read timeout ends about 5 s into the hold). The next two points are placed half a
resolution either side of that hint (at most ``GUIDED_PROBES`` per dimension, then plain midpoints):
on a sharp timeout that settles the boundary in three probes instead of log2(range / resolution),
and a wrong hint costs at most two probes, since every point lies strictly inside the open interval.

The monotone assumption is checked, not trusted: a whole probe above a cut one, or a cut that came
(by its hint) well before a duration that arrived whole had ended (a timeout with jitter, a hop that
restarts), is reported with the result; the boundary is then taken below the shortest cut.

Each probe costs wall time (about D for a whole one, plus the request around it), and the search
stops before a probe that would not fit what is left of the budget (``Budget``), with what it knows.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GUIDED_PROBES", "Boundary", "Budget", "SearchResult", "Step", "Trial", "bisect", "boundary", "next_point",
           "result_of"]

GUIDED_PROBES = 2  # points placed around a cut's hint per dimension; then plain bisection
MAX_TRIALS = 40  # far above log2(any range / any resolution) this command accepts; a bound, not a target
OVERHEAD_GUESS_S = 3.0  # a probe's cost beyond its duration before any was timed (request, rule set and removed)
WHOLE, CUT, ERROR = "whole", "cut", "error"


@dataclass(frozen=True)
class Trial:
    """One probe as the search sees it: the duration tried, whole or cut (or ``error``: it could not
    run), its wall time, where a cut came on the dimension's scale, and what the probe found."""

    duration_s: float
    outcome: str  # whole | cut | error
    wall_s: float = 0.0
    hint_s: float | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)  # the probe's own findings (hop, how, ids)


@dataclass(frozen=True)
class Boundary:
    """What the trials so far show: the longest whole below the shortest cut, and any evidence that
    the path is not monotone in this duration."""

    longest_whole: float | None
    shortest_cut: float | None
    non_monotonic: tuple[str, ...] = ()  # one line per trial that contradicts the others

    @property
    def gap_s(self) -> float | None:
        """The boundary's width (0 stands for the unprobed zero below a first cut)."""
        if self.shortest_cut is None:
            return None
        return self.shortest_cut - (self.longest_whole or 0.0)


def boundary(trials: Sequence[Trial], tolerance_s: float = 0.0) -> Boundary:
    """The interval the decided trials give (an error decides nothing), and the contradictions: a
    duration that arrived whole at or above one that was cut, or a cut that came (``hint_s``) more
    than ``tolerance_s`` before a duration that arrived whole had ended (bisection never probes above
    a cut, so the second is how a jittery or restarting hop shows)."""
    cuts = [t for t in trials if t.outcome == CUT]
    wholes = [t.duration_s for t in trials if t.outcome == WHOLE]
    shortest = min((t.duration_s for t in cuts), default=None)
    below = [d for d in wholes if shortest is None or d < shortest]
    longest = max(below) if below else None
    odd = [f"{d:g}s arrived whole although {shortest:g}s was cut" for d in sorted(wholes)
           if shortest is not None and d >= shortest]
    odd += [f"{t.duration_s:g}s was cut {t.hint_s:.3g}s in, although {longest:g}s arrived whole"
            for t in cuts if t.hint_s is not None and longest is not None and t.hint_s < longest - tolerance_s]
    return Boundary(longest, shortest, tuple(odd))


def _point(value: float, step: float = 0.001) -> float:
    """``value`` on a grid of ``step`` seconds (at least a millisecond): a duration one can read and type."""
    step = max(step, 0.001)
    return round(round(value / step) * step, 3)


def _guided(trials: Sequence[Trial], lo: float, hi: float, resolution_s: float) -> float | None:
    """A point half a resolution either side of the shortest cut's hint, strictly inside (lo, hi)."""
    at_hi = next((t for t in trials if t.outcome == CUT and t.duration_s == hi and t.hint_s is not None), None)
    if at_hi is None or at_hi.hint_s is None:
        return None
    for candidate in (at_hi.hint_s - resolution_s / 2, at_hi.hint_s + resolution_s / 2):
        point = _point(candidate, resolution_s / 10)  # a hint of 4.998 s reads 4.5 s, not 4.498 s
        if lo + 1e-3 < point < hi - 1e-3:
            return point
    return None


@dataclass(frozen=True)
class Step:
    """The next duration to probe (None: the search is over, ``why`` says how), and whether it was
    placed by a cut's hint rather than at the midpoint."""

    point: float | None
    why: str = ""
    guided: bool = False


def next_point(trials: Sequence[Trial], *, max_s: float, resolution_s: float,
               guided_left: int = GUIDED_PROBES) -> Step:
    """The next duration to probe, or None and why this dimension's search is over."""
    if not trials:
        return Step(_point(max_s))
    b = boundary(trials)
    if b.shortest_cut is None:
        return Step(None, f"survives >= max: the longest probe ({max_s:g}s) arrived whole")
    lo, hi = b.longest_whole or 0.0, b.shortest_cut
    if hi - lo <= resolution_s + 1e-9:
        if b.longest_whole is None:
            return Step(None, f"cut even at {hi:g}s: the boundary is below the resolution ({resolution_s:g}s)")
        return Step(None, f"resolved: {lo:g}s arrived whole, {hi:g}s was cut")
    guided = _guided(trials, lo, hi, resolution_s) if guided_left > 0 else None
    if guided is not None:
        return Step(guided, guided=True)
    return Step(_point((lo + hi) / 2))


class Budget:
    """The search's wall time: a probe starts only when what it is expected to take still fits.

    A probe's expected cost is its duration plus the largest overhead a whole probe has shown so far
    (the request before and after the fault, setting and removing the rule); ``clock`` is injectable
    so the search can be tested without waiting."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s = budget_s
        self.clock = clock
        self.start = clock()
        self.overhead_s: list[float] = []

    def spent_s(self) -> float:
        return self.clock() - self.start

    def expected_s(self, duration_s: float) -> float:
        return duration_s + (max(self.overhead_s) if self.overhead_s else OVERHEAD_GUESS_S)

    def fits(self, duration_s: float) -> bool:
        return self.spent_s() + self.expected_s(duration_s) <= self.budget_s

    def took(self, trial: Trial) -> None:
        if trial.outcome == WHOLE:  # a cut probe ends early: its wall says nothing about the overhead
            self.overhead_s.append(max(0.0, trial.wall_s - trial.duration_s))


@dataclass(frozen=True)
class SearchResult:
    """One dimension's search: its trials in order, the boundary, whether it finished and why it ended."""

    trials: tuple[Trial, ...]
    boundary: Boundary
    finished: bool
    why: str

    @property
    def survives_max(self) -> bool:
        return self.finished and self.boundary.shortest_cut is None and bool(self.trials)


async def bisect(probe: Callable[[float], Awaitable[Trial]], *, max_s: float, resolution_s: float,
                 budget: Budget) -> SearchResult:
    """Probe durations until the boundary is within ``resolution_s``, ``max_s`` arrives whole, a probe
    cannot run, or the next probe would not fit ``budget``."""
    if max_s <= 0 or resolution_s <= 0:
        raise ValueError(f"max and resolution must be positive, found {max_s!r} and {resolution_s!r}")
    trials: list[Trial] = []
    guided = 0
    for _ in range(MAX_TRIALS):
        step = next_point(trials, max_s=max_s, resolution_s=resolution_s, guided_left=GUIDED_PROBES - guided)
        point = step.point
        if point is None:
            return result_of(trials, True, step.why, resolution_s)
        if not budget.fits(point):
            left = max(0.0, budget.budget_s - budget.spent_s())
            return result_of(trials, False, f"not finished: the budget ran out (the next probe, {point:g}s, would "
                                          f"take about {budget.expected_s(point):.0f}s; {left:.0f}s were left)",
                           resolution_s)
        guided += step.guided
        trial = await probe(point)
        budget.took(trial)
        trials.append(trial)
        if trial.outcome == ERROR:
            return result_of(trials, False, f"not finished: the probe at {point:g}s could not run: "
                                          f"{trial.detail.get('error', 'unknown error')}", resolution_s)
    return result_of(trials, False, f"not finished: no boundary after {MAX_TRIALS} probes", resolution_s)


def result_of(trials: Sequence[Trial], finished: bool, why: str, resolution_s: float) -> SearchResult:
    """What ``trials`` show, with how the search ended (and any sign the path is not monotone)."""
    b = boundary(trials, tolerance_s=resolution_s / 2)
    if b.non_monotonic:
        why += f"; not monotone: {'; '.join(b.non_monotonic)} (the boundary is taken below the shortest cut)"
    return SearchResult(tuple(trials), b, finished, why)
