"""How long each fault and each phase really lasted, against the plan. Pure: observations in, figures out.

A fault is in force from when its inject began to when its revert *completed* (a revert returns
only once what it restores is back: a killed target restarted and answering its health check), as
``chaos.model.observations.FaultSpan`` counts it; its phase's planned duration is what it should have
had. A phase's real length is its whole window, from its start to the end of its last revert (its
injects and reverts included: a restart of 200 s is 200 s of the phase); its clock, the planned part,
runs from when its last inject returned to when its first revert began. A fault in force for less
than ``safety.min_fault_coverage`` of its planned time on its phase's clock (from its inject's
return to its revert's start: the planned part, as the phase counts it; a slow inject or a slow
revert is not the time its verdicts assume) makes the run an error: the hard stop or a halt cut its
phase short, and its verdicts judged a fault that was not there for the time they assume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from chaos.model.observations import NS, Observations

__all__ = ["FaultTime", "PhaseTime", "fault_times", "phase_times", "shortfalls"]


@dataclass(frozen=True)
class FaultTime:
    """One fault's time in force: seconds from the run's start, and its planned and actual duration."""

    name: str
    kind: str
    phase: str
    planned_s: float  # its phase's duration
    in_force_at_s: float | None  # its inject began (None: never injected)
    revert_started_at_s: float | None  # its revert began (None: never reverted)
    reverted_at_s: float | None = None  # its revert completed, or failed (None: never reverted)
    returned_at_s: float | None = None  # its inject returned: its phase's clock (None: never injected)

    @property
    def in_force_s(self) -> float | None:
        """From its inject's start to its revert's end: a restart the revert waited for is in force."""
        end = self.reverted_at_s if self.reverted_at_s is not None else self.revert_started_at_s
        if self.in_force_at_s is None or end is None:
            return None
        return max(0.0, end - self.in_force_at_s)

    @property
    def revert_s(self) -> float | None:
        """How long its revert took (a restart it waited for included)."""
        if self.revert_started_at_s is None or self.reverted_at_s is None:
            return None
        return max(0.0, self.reverted_at_s - self.revert_started_at_s)

    @property
    def clock_s(self) -> float | None:
        """Its time in force on its phase's clock: from its inject's return to its revert's start."""
        start = self.returned_at_s if self.returned_at_s is not None else self.in_force_at_s
        if start is None or self.revert_started_at_s is None:
            return None
        return max(0.0, self.revert_started_at_s - start)

    @property
    def coverage(self) -> float | None:
        """Its time on its phase's clock over planned (None when unknown or nothing was planned). Not
        ``in_force_s``: a halt 5 s into an 8 s phase after a 3 s inject is 62%, not 100%."""
        actual = self.clock_s
        return None if actual is None or self.planned_s <= 0 else actual / self.planned_s


@dataclass(frozen=True)
class PhaseTime:
    """One phase: planned duration, and when it began, had its faults in force, and ended (seconds from the
    run's start)."""

    name: str
    planned_s: float
    start_s: float
    in_force_at_s: float | None  # its last inject returned (None: never got there)
    reverts_at_s: float | None  # its first revert began, or it ended when it had no faults (None: never ended)
    end_s: float | None = None  # its window closed: its last revert done (None: never ended)

    @property
    def actual_s(self) -> float | None:
        """Its real length: its whole window, injects and reverts included (a restart's wait too)."""
        end = self.end_s if self.end_s is not None else self.reverts_at_s
        return None if end is None else max(0.0, end - self.start_s)

    @property
    def in_force_s(self) -> float | None:
        """Its clock, the planned part: from its last inject's return to its first revert's start."""
        if self.reverts_at_s is None:
            return None
        return max(0.0, self.reverts_at_s - (self.start_s if self.in_force_at_s is None else self.in_force_at_s))

    @property
    def reverts_s(self) -> float | None:
        """How long its reverts took, from the first one's start to the window's end."""
        if self.reverts_at_s is None or self.end_s is None:
            return None
        return max(0.0, self.end_s - self.reverts_at_s)


def _at(obs: Observations, t: int | None) -> float | None:
    return None if t is None else round((t - obs.t0) / NS, 4)


@dataclass
class _Span:
    """One fault's time as its events tell it: its inject began, its revert began and ended (monotonic ns)."""

    kind: str
    phase: str
    t_in: int | None = None
    t_returned: int | None = None
    t_out: int | None = None
    t_done: int | None = None


def fault_times(obs: Observations, planned_s: Mapping[str, float]) -> list[FaultTime]:
    """Each fault that was planned in the run, in order; ``planned_s``: phase name → its duration."""
    found: dict[str, _Span] = {}
    for event in obs.faults:
        span = found.setdefault(event.fault, _Span(event.kind, event.phase))
        if event.action == "inject":
            span.t_in = event.t_started if event.t_started is not None else event.t
            span.t_returned = event.t
        elif event.action in ("revert", "error") and span.t_in is not None and span.t_done is None:
            # a revert that failed still ended the fault's time as the run counts it
            span.t_out = event.t_started if event.t_started is not None else event.t
            span.t_done = event.t
    return [
        FaultTime(name=name, kind=span.kind, phase=span.phase, planned_s=float(planned_s.get(span.phase, 0.0)),
                  in_force_at_s=_at(obs, span.t_in), revert_started_at_s=_at(obs, span.t_out),
                  reverted_at_s=_at(obs, span.t_done), returned_at_s=_at(obs, span.t_returned))
        for name, span in found.items()
    ]


def phase_times(obs: Observations, planned_s: Mapping[str, float]) -> list[PhaseTime]:
    """Each phase the run began, in order; ``planned_s``: phase name → its duration."""
    first_revert: dict[str, int] = {}
    for event in obs.faults:
        if event.action in ("revert", "error") and event.t_started is not None:
            first_revert[event.phase] = min(first_revert.get(event.phase, event.t_started), event.t_started)
    return [
        PhaseTime(name=p.name, planned_s=float(planned_s.get(p.name, 0.0)), start_s=_at(obs, p.t_start) or 0.0,
                  in_force_at_s=_at(obs, p.t_in_force),
                  reverts_at_s=_at(obs, first_revert.get(p.name, p.t_end)), end_s=_at(obs, p.t_end))
        for p in obs.phases
    ]


def shortfalls(times: list[FaultTime], min_coverage: float) -> list[str]:
    """One line per injected fault in force for less than ``min_coverage`` of its planned time."""
    out = []
    for ft in times:
        coverage = ft.coverage
        if ft.in_force_at_s is None or coverage is None or coverage >= min_coverage:
            continue
        out.append(f"fault {ft.name} ({ft.kind}) was in force {ft.clock_s:.2f}s of the {ft.planned_s:g}s planned "
                   f"for phase {ft.phase} on its clock, inject returned to revert began ({coverage:.0%}, below "
                   f"safety.min_fault_coverage {min_coverage:.0%})")
    return out
