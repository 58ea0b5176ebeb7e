"""Capacity under fault, as data: what to search (``capacity:`` of an experiment), each probe's
outcome, and each case's answer. Pure; the search is ``chaos.capacity.search``, the runs
``chaos.capacity.run``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BASELINE_CASE", "CapacitySpec", "CaseAnswer", "Probe", "ProbeOutcome", "lost_capacity"]

BASELINE_CASE = "baseline"  # the case with no fault in force

ProbeOutcome = Literal["pass", "fail", "inconclusive", "error"]


@dataclass(frozen=True)
class CapacitySpec:
    """``capacity:``: the load dimension searched, its bounds, and what the search may spend."""

    dimension: Literal["concurrency", "rate"] = "concurrency"  # closed-loop streams, or open-loop requests/s
    low: float = 1.0  # the lowest level probed
    high: float = 64.0  # the highest level probed
    start: float | None = None  # the first level; default low
    resolution: float = 0.05  # stop when the interval's upper end is within this of its lower (hi <= lo x (1 + r))
    probe: float = 6.0  # seconds of one probe's judged window
    warmup: float = 2.0  # seconds at the probe's load before the window, no fault: the queues reach steady state
    max_probe: float = 24.0  # an inconclusive probe is run again twice as long, up to this
    budget: float = 900.0  # seconds the whole search may take
    settle: float = 30.0  # seconds a remote target may take to go idle between probes
    cases: tuple[str, ...] = ()  # baseline and phase names; () = baseline and every phase with faults
    slas: tuple[str, ...] = ()  # SLA entry names that must all pass; () = every entry that judges one window
    min_capacity: float | None = None  # every case at or above it: exit 0; one below: exit 1
    halt_factor: float = 3.0  # a probe whose TTFT quantile so far is this many times its budget stops, failed

    @property
    def integer(self) -> bool:
        return self.dimension == "concurrency"

    @property
    def unit(self) -> str:
        return "streams" if self.dimension == "concurrency" else "requests/s"


@dataclass(frozen=True)
class Probe:
    """One probe: a level of load, the case's faults in force, and what the SLAs said."""

    case: str
    level: float
    window_s: float
    outcome: ProbeOutcome
    failed: tuple[str, ...] = ()  # the SLA entries that failed (or were inconclusive, for an inconclusive probe)
    figures: dict[str, Any] = field(default_factory=dict)  # entry name -> {status, figure, budget, unit}
    run_dir: str = ""
    took_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class CaseAnswer:
    """A case's capacity as an interval: the highest level that met every SLA and the lowest that did not."""

    case: str
    faults: tuple[str, ...]
    passing: float | None  # None: even the lowest level failed
    failing: float | None  # None: even the highest level passed
    bound_by: tuple[str, ...]  # the SLAs that failed at ``failing``
    resolved: bool  # the interval is as narrow as asked (or pinned at a bound)
    probes: tuple[Probe, ...]
    why: str  # one line: how the search ended
    non_monotone: tuple[float, ...] = ()  # levels that passed above one that failed (noise the interval hides)


def lost_capacity(base: CaseAnswer, case: CaseAnswer) -> dict[str, float | None]:
    """The share of the baseline's capacity a fault costs: a point (lower ends) and its interval. Pure.

    The capacities are intervals [passing, failing), so the loss is too: at least 1 - case.failing /
    base.passing, at most 1 - case.passing / base.failing (each end None where an interval is open).
    A negative share is a gain: the case met its SLAs at more load than the baseline did."""
    def share(num: float | None, den: float | None) -> float | None:
        if num is None or den is None or den <= 0:
            return None
        return 1.0 - num / den

    point = share(case.passing if case.passing is not None else 0.0, base.passing)
    return {"point": point, "at_least": share(case.failing, base.passing) if case.failing is not None else 0.0,
            "at_most": share(case.passing if case.passing is not None else 0.0, base.failing)}
