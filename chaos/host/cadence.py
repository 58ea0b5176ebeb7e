"""Periodic work on one grid of the monotonic clock, so a run's processes wake together.

The runner is mostly idle: a few times a second it samples the host, checks its halt conditions,
hears a load process's activity report and its batch of records. Each of those woke it on its own
timer, and each wake-up of an idle process on a busy box starts cold (its caches went to the load
process meanwhile): a halt check that takes 0.04 ms warm took 0.37 ms after a 50 ms pause, and the
runner woke 21 times a second at 256 streams, 7% of the load process's CPU. Timers that fire at
multiples of their period on CLOCK_MONOTONIC (one clock for every process of the host) land on the
same instants: periods that divide each other (0.1 s, 0.5 s, 1 s) share their ticks, and the work
of one tick runs in one wake-up, warm after its first piece.
"""

from __future__ import annotations

import asyncio
import math
import time

__all__ = ["EARLY_S", "next_tick", "seconds_to_next_tick", "sleep_to_next_tick"]

# A timer may fire a little before its tick (uvloop rounds a delay to whole milliseconds of a loop
# time cached at the start of its turn): a wake-up this close before a tick counts as at it, or the
# next sleep would be a few microseconds long and the same tick's work would run twice.
EARLY_S = 0.002


def next_tick(period_s: float, now: float) -> float:
    """The first multiple of ``period_s`` strictly after ``now`` (monotonic seconds). Pure."""
    if period_s <= 0:
        raise ValueError(f"a period must be positive, not {period_s!r}")
    return (math.floor(now / period_s) + 1) * period_s


def seconds_to_next_tick(period_s: float) -> float:
    """How long from now until the next multiple of ``period_s`` on the monotonic clock."""
    now = time.monotonic()
    return max(0.0, next_tick(period_s, now + EARLY_S) - now)


async def sleep_to_next_tick(period_s: float) -> None:
    """Sleep until the next multiple of ``period_s`` on the monotonic clock (a period at most)."""
    await asyncio.sleep(seconds_to_next_tick(period_s))
