"""Halt conditions: stop injecting, revert and end the run ``halted`` when the target melts.

``safety.halt_on`` lists live conditions (``chaos.model.context.HaltSpec``); one default condition is on
unless ``safety.halt_on_dead_target: false``: the target is dead when **all of the first 20 streams
failed**, or when **at least 95% of the streams that ended in the last 2 s failed** (at least 20 of
them), or when **none of the streams that ended in the last 10 s got an answer** (at least 3 of
them: closed-loop clients back off while nothing answers, on a refused connection, a 502/503/504 or
a connection closed with no response, ``load.connect_backoff``, so a dead target ends only a few
streams a window), so a run against a server that refuses every request stops in seconds instead
of firing thousands of failing requests (Litmus, Chaos Mesh, AWS FIS and Gremlin all stop a run
this way). That default holds off while a kill the experiment asked to restart is in force (its
plan says ``restart``) and for one 2 s window after its revert, and its no-answer rule counts only
streams that ended after that revert: that outage is the fault itself (a vLLM restart takes tens of
seconds, and clients asleep in their backoff or streams the kill cut still end for seconds after
it), and the verdicts judge it; ``halt_on`` conditions still apply then.

The conditions are pure functions of the finished streams (``Ended``, one per stream, in the
order they ended) and the current time; ``HaltWatcher`` is the run listener that feeds them from
``StreamRecord`` events, checks them on every stream and on a timer, and calls ``Runner.halt``
with the reason once. A halted run's report lists the top error messages with counts
(``top_errors``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaos.host.cadence import seconds_to_next_tick
from chaos.model.context import HaltSpec, SafetySpec
from chaos.model.observations import NS, FaultEvent, Note, StreamRecord

__all__ = [
    "DEAD_FIRST",
    "DEAD_SHARE",
    "DEAD_WINDOW_S",
    "Ended",
    "HaltWatcher",
    "check",
    "dead_target",
    "ended",
    "error_share",
    "target_down",
    "top_errors",
    "ttft_quantile",
]

DEAD_FIRST = 20  # all of the first this many streams failed: dead from the start
DEAD_SHARE = 0.95  # ... or this share of the streams that ended in the last DEAD_WINDOW_S
DEAD_WINDOW_S = 2.0
DEAD_MIN_STREAMS = 20  # a window with fewer ended streams decides nothing (as many as the first-20 rule)
# ... or no stream got an answer (a status line) for this long, at least DEAD_QUIET_MIN of them: closed-loop
# clients back off while nothing answers (load.connect_backoff), so a dead target ends a few streams a
# window, never 20 in 2 s
DEAD_QUIET_S = 10.0
DEAD_QUIET_MIN = 3
CHECK_EVERY_S = 0.5  # the timer's period: conditions over time windows trip without new streams too
TOP = 5  # error messages a halt reason and the report list


@dataclass(frozen=True)
class Ended:
    """One finished stream as the conditions see it."""

    t: int  # when it ended (monotonic ns)
    failed: bool  # HTTP >= 400, a transport, protocol or in-band error (hang-ups by client faults are not)
    answered: bool  # the target answered at all (a status line arrived)
    ttft_ns: int | None
    message: str | None  # the error message, for the report


def ended(stream: StreamRecord) -> Ended | None:
    """How a finished stream counts, or None when it does not (background load, a client fault's hang-up)."""
    if stream.background or stream.hangup is not None or stream.t_end is None:
        return None
    message = None
    if stream.error is not None:
        message = f"{stream.error.kind}: {stream.error.message}"
    elif stream.in_band_error is not None:
        message = f"in_band: {stream.in_band_error}"
    elif (stream.status or 0) >= 400:
        message = f"http: HTTP {stream.status}"
    if stream.error is not None and stream.error.kind == "cancelled":
        return None  # cut by the run's own stop, not by the target
    return Ended(stream.t_end, message is not None, stream.status is not None, stream.ttft_ns, message)


def _in_a_loop() -> bool:
    """Whether a timer can run the checks (a live run), not a replay outside any loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _window(streams: Sequence[Ended], now: int, seconds: float) -> list[Ended]:
    start = now - int(seconds * NS)
    return [e for e in streams if e.t >= start]


def dead_target(streams: Sequence[Ended], now: int, *, quiet: Sequence[Ended] | None = None,
                since: int = 0) -> str | None:
    """The default condition: all of the first ``DEAD_FIRST`` streams failed, or >= 95% over 2 s, or
    no answer over 10 s. Pure.

    ``quiet``: the streams the no-answer rule reads (default ``streams``); any list holding every
    stream of the last ``DEAD_QUIET_S`` since the newest answered one decides it the same (the
    watcher keeps only those). ``since``: streams that ended before it do not count for that rule
    (a planned outage's refusals, ended before its restart was over)."""
    if len(streams) >= DEAD_FIRST and all(e.failed for e in streams[:DEAD_FIRST]):
        return f"the target looks dead: all of the first {DEAD_FIRST} streams failed"
    recent = _window(streams, now, DEAD_WINDOW_S)
    failed = sum(e.failed for e in recent)
    if len(recent) >= DEAD_MIN_STREAMS and failed >= DEAD_SHARE * len(recent):
        return (f"the target looks dead: {failed} of the {len(recent)} streams that ended in the last "
                f"{DEAD_WINDOW_S:g}s failed (>= {DEAD_SHARE:.0%})")
    start = max(now - int(DEAD_QUIET_S * NS), since)
    silent = [e for e in (streams if quiet is None else quiet) if e.t >= start]
    if (len(silent) >= DEAD_QUIET_MIN and not any(e.answered for e in silent) and streams
            and streams[0].t <= now - int(DEAD_QUIET_S * NS)):
        return (f"the target looks dead: none of the {len(silent)} streams that ended in the last {DEAD_QUIET_S:g}s "
                "got an answer (the clients back off while nothing answers: load.connect_backoff)")
    return None


def error_share(streams: Sequence[Ended], now: int, spec: HaltSpec) -> str | None:
    """The failed share of the window's streams above ``spec.above``. Pure."""
    recent = _window(streams, now, spec.window)
    if len(recent) < spec.min_streams:
        return None
    share = sum(e.failed for e in recent) / len(recent)
    if share > spec.above:
        return (f"{spec.name}: {share:.0%} of the {len(recent)} streams of the last {spec.window:g}s failed (> "
                f"{spec.above:.0%})")
    return None


def ttft_quantile(streams: Sequence[Ended], now: int, spec: HaltSpec) -> str | None:
    """The window's TTFT quantile above ``spec.above`` seconds. Pure."""
    values = [e.ttft_ns for e in _window(streams, now, spec.window) if e.ttft_ns is not None]
    if len(values) < spec.min_streams:
        return None
    q = float(np.quantile(np.asarray(values, dtype=float), spec.quantile)) / NS
    if q > spec.above:
        return (f"{spec.name}: TTFT p{spec.quantile * 100:g} {q * 1000:.0f}ms over the {len(values)} streams of the "
                f"last {spec.window:g}s (> {spec.above * 1000:.0f}ms)")
    return None


def target_down(streams: Sequence[Ended], now: int, spec: HaltSpec, in_flight: Sequence[int] = ()) -> str | None:
    """For ``spec.window`` seconds no stream that ended got an answer (refused, reset, timed out), or
    every stream in flight got no byte (``in_flight``: when each last did; a frozen target still
    accepts connections, so nothing ends until the request timeout). Pure."""
    recent = _window(streams, now, spec.window)
    if any(e.answered for e in recent):
        return None
    window_ns = int(spec.window * NS)
    if in_flight and all(now - t >= window_ns for t in in_flight):
        return (f"{spec.name}: none of the {len(in_flight)} streams in flight got a byte from the target for "
                f"{spec.window:g}s")
    if len(recent) < spec.min_streams:
        return None
    # the window must be covered: streams have been ending for at least that long
    if now - streams[0].t < int(spec.window * NS):
        return None
    return f"{spec.name}: the target did not answer any of the {len(recent)} streams of the last {spec.window:g}s"


_CONDITIONS: dict[str, Callable[[Sequence[Ended], int, HaltSpec], str | None]] = {
    "error_share": error_share, "ttft": ttft_quantile, "target_down": target_down,
}


def check(streams: Sequence[Ended], now: int, safety: SafetySpec, in_flight: Sequence[int] = (), *,
          dead_rule: bool = True, quiet: Sequence[Ended] | None = None, since: int = 0) -> str | None:
    """The first condition that trips (the dead-target default first, unless ``dead_rule`` is off
    during a planned outage), or None. Pure.

    ``in_flight``: when each stream still in flight last got a byte (``target_down`` reads it);
    ``quiet`` and ``since``: as ``dead_target`` reads them."""
    if safety.halt_on_dead_target and dead_rule:
        why = dead_target(streams, now, quiet=quiet, since=since)
        if why:
            return why
    for spec in safety.halt_on:
        if spec.kind == "target_down":
            why = target_down(streams, now, spec, in_flight)
        else:
            why = _CONDITIONS[spec.kind](streams, now, spec)
        if why:
            return why
    return None


def top_errors(messages: Iterable[str | None], n: int = TOP) -> list[dict[str, Any]]:
    """The most frequent error messages with their counts, most frequent first. Pure."""
    counts = Counter(m[:300] for m in messages if m)
    return [{"message": m, "count": c} for m, c in counts.most_common(n)]


class HaltWatcher:
    """Run listener: keeps the finished streams, checks the conditions, halts the run once.

    ``halt`` is ``Runner.halt``; ``emit`` records the ``halt`` note (reason, top errors) when the run took
    it (not one already stopping: a signal's, or in teardown).
    A timer (every ``CHECK_EVERY_S`` on the run's loop, started by a stream) lets window conditions
    trip while nothing ends; it runs while one can (``_could_trip``) and stops when the run is
    halted or finished.
    """

    def __init__(self, safety: SafetySpec, halt: Callable[[str], object], emit: Callable[[Note], None],
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.safety = safety
        self.halt = halt
        self.emit = emit
        self.clock = clock
        self.streams: list[Ended] = []
        self.tripped: str | None = None
        self._keep_s = max([DEAD_WINDOW_S, *(s.window for s in safety.halt_on)]) + 1.0
        self._recent: deque[Ended] = deque()
        # the no-answer rule's window (DEAD_QUIET_S, longer than ``_keep_s``): only the newest answered
        # stream and the unanswered ones after it, which decide it as the whole window would; a healthy
        # run keeps one or two here, not ten seconds of streams read on every failure
        self._quiet: deque[Ended] = deque()
        self._quiet_since = 0  # the last planned outage's end: its refusals are not a dead target
        self._timer: asyncio.TimerHandle | None = None
        self._first: list[Ended] = []
        self._failed_kept = 0  # failed streams in ``_recent``
        self._first_failed = 0  # ... and in ``_first``
        self._restarting: set[str] = set()  # kills with restart in force: a planned outage
        self._outage_over_ns = 0
        # the load's in-flight streams' last-byte stamps (``LoadGenerator.last_activity``), once it exists
        self.in_flight: Callable[[], Sequence[int]] | None = None

    @property
    def active(self) -> bool:
        return self.safety.halt_on_dead_target or bool(self.safety.halt_on)

    def on_event(self, event: Any) -> None:
        if not self.active or self.tripped is not None:
            return
        if isinstance(event, FaultEvent):
            self._planned_outage(event)
        elif isinstance(event, StreamRecord):
            e = ended(event)
            if e is None:
                return
            filling = len(self._first) < DEAD_FIRST
            if filling:
                self._first.append(e)
            self._recent.append(e)
            self._failed_kept += e.failed
            self._keep_quiet(e)
            self._first_failed += filling and e.failed
            # A failure (or one of the first streams) is checked at once; the rest on the timer: each
            # check reads the whole window, and per stream at 1,000 streams/s that was the runner's
            # largest cost after the journal (cProfile, 1,024 streams turning over)
            if e.failed or filling or not _in_a_loop():
                self._check()
            if self._timer is None and self.tripped is None and self._could_trip():
                self._arm()
        elif type(event).__name__ in ("VerdictsReady", "RunFinished"):
            self._disarm()

    def _planned_outage(self, event: FaultEvent) -> None:
        """A kill with ``restart`` takes the target down on purpose until the restart (vLLM: tens of
        seconds): the dead-target default holds off from its plan to one window after its revert, and
        its no-answer rule forgets the outage's streams then."""
        if event.action == "plan" and (event.undo or {}).get("restart"):
            self._restarting.add(event.fault)
        elif event.action in ("revert", "error") and event.fault in self._restarting:
            self._restarting.discard(event.fault)
            now = self.clock()
            self._outage_over_ns = now + int(DEAD_WINDOW_S * NS)
            # the no-answer rule reads 10 s, longer than this hold-off: clients asleep in their backoff
            # (up to 8 s) and streams cut by the kill still end in it; it counts only what ends from now
            self._quiet.clear()
            self._quiet_since = now

    def _keep_quiet(self, e: Ended) -> None:
        """Keep ``e`` for the no-answer rule: an answered stream replaces those that ended before it."""
        if e.answered:
            later = [x for x in self._quiet if x.t > e.t]
            self._quiet.clear()
            self._quiet.append(e)
            self._quiet.extend(later)
        else:
            self._quiet.append(e)

    def _quiet_unanswered(self) -> bool:
        """Whether an unanswered stream is kept for the no-answer rule (the timer must then run on)."""
        return len(self._quiet) > (1 if self._quiet and self._quiet[0].answered else 0)

    @property
    def reads_in_flight(self) -> bool:
        """Whether a condition reads the streams still in flight (``target_down``): only then need
        the load report them."""
        return any(spec.kind == "target_down" for spec in self.safety.halt_on)

    def watch_in_flight(self, last_activity: Callable[[], Sequence[int]] | None) -> None:
        """Read the load's in-flight streams from now on, and check on the timer before any stream ends."""
        self.in_flight = last_activity
        if last_activity is not None and self.active and self._timer is None and self.tripped is None \
                and self._could_trip():
            self._arm()

    def _could_trip(self) -> bool:
        """Whether any condition could trip now, and so whether the timer runs. With only the
        dead-target rule, only while a failed stream is kept (or an unanswered one for its no-answer
        rule): a failure is checked when it arrives, and without one none of its tests can pass. The
        runner's tick, cold on a busy box, then neither wakes it nor reads the window for nothing."""
        return (bool(self.safety.halt_on) or self._failed_kept > 0 or self._first_failed == DEAD_FIRST
                or self._quiet_unanswered())

    def _arm(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # replayed outside a loop (verify): nothing to time
        # on the run's shared ticks (chaos.host.cadence): woken with the host sampler, not on its own
        self._timer = loop.call_later(seconds_to_next_tick(CHECK_EVERY_S), self._tick)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        self._check()
        if self.tripped is None and self._could_trip():
            self._arm()

    def _check(self) -> None:
        now = self.clock()
        while self._recent and self._recent[0].t < now - int(self._keep_s * NS):
            self._failed_kept -= self._recent.popleft().failed
        while self._quiet and self._quiet[0].t < now - int(DEAD_QUIET_S * NS):
            self._quiet.popleft()
        if not self._could_trip():
            return  # only the dead-target rule, and no failed stream to count toward it
        # the dead-target rule reads the first streams; the windows read the recent ones
        first = {id(e) for e in self._first}
        streams = self._first + [e for e in self._recent if id(e) not in first]
        planned_outage = bool(self._restarting) or now < self._outage_over_ns
        why = check(streams, now, self.safety, self.in_flight() if self.in_flight is not None else (),
                    dead_rule=not planned_outage, quiet=self._quiet, since=self._quiet_since)
        if why is None:
            return
        self.tripped = why
        self._disarm()
        kept = {id(e) for e in streams}  # the no-answer rule's streams too: older than the short windows
        errors = top_errors(e.message for e in [*streams, *(e for e in self._quiet if id(e) not in kept)] if e.failed)
        shown = "; ".join(f"{x['count']}x {x['message']}" for x in errors[:3])
        if self.halt(why + (f" (top errors: {shown})" if shown else "")) is not False:  # the run took it
            self.emit(Note(topic="halt", t=now, data={"reason": why, "top_errors": errors}))
