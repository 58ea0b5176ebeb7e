"""Clock alignment between a load shard and its coordinator: NTP-style offsets with a stated bound.

Every host has its own monotonic clock (it counts from that host's boot), so a shard's stamps mean
nothing to the coordinator until the offset between the two clocks is known. The coordinator
measures it with round trips over the shard connection, as NTP does:

    coordinator sends at t0 ──▶ shard receives at t1, answers at t2 ──▶ coordinator receives at t3

The shard's stamps cannot lie outside the round trip, so the true offset θ = shard − coordinator
lies in ``[t2 − t3, t1 − t0]``, an interval as wide as the round trip's network delay
``(t3 − t0) − (t2 − t1)``; its midpoint is the estimate and half the delay bounds its error. The
exchange with the smallest delay gives the tightest bound. Pure functions; the transport lives in
``chaos.load.shard_pool`` and ``chaos.load.shard_process``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from chaos.model.observations import StreamRecord

__all__ = ["ClockOffset", "Exchange", "estimate", "shift_record"]


@dataclass(frozen=True)
class Exchange:
    """One round trip: ``t0``/``t3`` on the coordinator's clock, ``t1``/``t2`` on the shard's (ns)."""

    t0: int
    t1: int
    t2: int
    t3: int

    @property
    def delay(self) -> int:
        """Time on the wire (the round trip less the shard's own turnaround), never negative."""
        return max(0, (self.t3 - self.t0) - (self.t2 - self.t1))

    @property
    def offset(self) -> int:
        """The midpoint estimate of shard − coordinator."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) // 2


@dataclass(frozen=True)
class ClockOffset:
    """A shard's clock relative to the coordinator's: ``shard = coordinator + offset_ns`` within ± ``bound_ns``."""

    offset_ns: int
    bound_ns: int
    rtt_ns: int  # the round trip of the exchange chosen
    samples: int


def estimate(exchanges: Iterable[Exchange]) -> ClockOffset:
    """The offset from the exchange with the least delay; its half-delay (rounded up) bounds the error."""
    done = list(exchanges)
    if not done:
        raise ValueError("no clock exchanges to estimate an offset from")
    best = min(done, key=lambda e: e.delay)
    return ClockOffset(best.offset, (best.delay + 1) // 2, best.t3 - best.t0, len(done))


# one stamp per event of a kind (content, reasoning, tool-call fragments): lists, moved item by item
_STAMP_LISTS = tuple(f.name for f in fields(StreamRecord) if f.name.startswith("t_") and f.default_factory is list)
_STAMPS = tuple(f.name for f in fields(StreamRecord) if f.name.startswith("t_") and f.name not in _STAMP_LISTS)


def shift_record(record: StreamRecord, delta_ns: int) -> StreamRecord:
    """A copy of ``record`` with every time stamp moved by ``delta_ns`` (durations are unchanged)."""
    if delta_ns == 0:
        return record
    moved: dict[str, Any] = {name: getattr(record, name) + delta_ns for name in _STAMPS
                                if getattr(record, name) is not None}
    for name in _STAMP_LISTS:
        moved[name] = [t + delta_ns for t in getattr(record, name)]
    if record.hangup is not None:
        moved["hangup"] = replace(record.hangup, t=record.hangup.t + delta_ns)
    return replace(record, **moved)
