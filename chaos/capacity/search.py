"""Where to probe next, from the probes so far: bracket, then bisect. Pure.

Pass/fail against load is monotone for a healthy stack (more load never makes an SLA easier to
meet), and each probe is a real run of seconds, so the search spends as few as it can: bisection
needs log2(range / resolution) probes for a fixed resolution, the fewest any method needs for a
monotone yes/no in the worst case. Bracketing starts at ``start`` and doubles up while probes pass
(or halves down while they fail), as MLPerf's server-scenario search and vLLM's SLA sweep do;
bisection is geometric (the midpoint of the logs), since the resolution is relative. A noisy probe
does not make the search probabilistic: an inconclusive probe is run again longer
(``chaos.capacity.run``), and one that stays inconclusive counts as not meeting the SLAs, the
conservative side. A pass above a failure (noise the interval would hide) is reported, not used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from chaos.model.capacity import CapacitySpec, Probe

__all__ = ["Bracket", "bracket", "next_level"]


@dataclass(frozen=True)
class Bracket:
    """What the probes so far show: the highest passing level below the lowest failing one."""

    passing: float | None
    failing: float | None
    non_monotone: tuple[float, ...]  # passes above the lowest failure


def bracket(probes: Sequence[Probe]) -> Bracket:
    """The interval the decided probes give (an error or an inconclusive still being lengthened is not one)."""
    failed = [p.level for p in probes if p.outcome in ("fail", "inconclusive")]
    passed = [p.level for p in probes if p.outcome == "pass"]
    failing = min(failed) if failed else None
    below = [level for level in passed if failing is None or level < failing]
    above = tuple(sorted(level for level in passed if failing is not None and level >= failing))
    return Bracket(max(below) if below else None, failing, above)


def resolved(spec: CapacitySpec, passing: float, failing: float) -> bool:
    """The interval is as narrow as asked: within the resolution, or (whole streams) one apart."""
    if spec.integer and failing - passing <= 1:
        return True
    return failing <= passing * (1 + spec.resolution)


def _level(spec: CapacitySpec, value: float) -> float:
    """Within the bounds; whole streams, or a rate to 3 significant digits (a level one can read and type)."""
    value = min(spec.high, max(spec.low, value))
    return float(round(value)) if spec.integer else float(f"{value:.3g}")


def next_level(spec: CapacitySpec, probes: Sequence[Probe], start: float | None = None) -> tuple[float | None, str]:
    """The next level to probe, or None and why the search of this case is over."""
    if not probes:
        return _level(spec, start if start is not None else (spec.start or spec.low)), ""
    b = bracket(probes)
    if b.passing is None and b.failing is not None:
        if b.failing <= spec.low:
            return None, f"even the lowest level ({_fmt(spec, spec.low)}) did not meet the SLAs"
        down = _level(spec, b.failing / 2)
        return (down if down < b.failing else _level(spec, spec.low)), ""
    if b.failing is None and b.passing is not None:
        if b.passing >= spec.high:
            return None, f"the highest level ({_fmt(spec, spec.high)}) met every SLA: the capacity is at least that"
        return _level(spec, b.passing * 2), ""
    assert b.passing is not None and b.failing is not None
    if resolved(spec, b.passing, b.failing):
        return None, f"resolved: {_fmt(spec, b.passing)} met every SLA, {_fmt(spec, b.failing)} did not"
    middle = math.sqrt(b.passing * b.failing)
    if spec.integer:
        middle = float(min(b.failing - 1, max(b.passing + 1, round(middle))))
    elif b.passing < (rounded := _level(spec, middle)) < b.failing:
        middle = rounded
    return middle, ""


def _fmt(spec: CapacitySpec, level: float) -> str:
    unit = "stream" if spec.integer and level == 1 else spec.unit
    return f"{level:g} {unit}"
