"""The run's deadline in stages: the target's start-up allowance until it is ready, then
``safety.max_duration`` from that moment. Used by ``chaos.execution.runner.Runner._execute``.

One ``asyncio.Timeout`` bounds the whole run; ``RunDeadline`` moves it as the run goes and says,
when it fires, which bound it was. A target's start is its own business (vLLM takes up to five
minutes on a busy host, ``VllmTarget.startup_allowance_s``): it never eats the phases, so a phase
plan that fits ``max_duration`` fits however long the start took within its allowance. The path's
start and a restart a fault asks for are the same kind of time: while one runs the clock is paused
(the deadline moves out by the step's allowance and moves back once it is done), so neither is
counted against ``max_duration`` either, and a step that overruns its allowance still has what was
left of ``max_duration`` before the run is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

__all__ = ["START_GRACE_S", "RunDeadline"]

# Around the target's own wait for an answer (its allowance): launching its process, exporting a
# model, a guard's first line (vLLM: 30 s at most), the health read and the admin API's proof.
START_GRACE_S = 30.0


class RunDeadline:
    """The stages of one run's ``asyncio.Timeout``: ``start_up`` (until the target is ready), then
    ``ready`` (``max_duration`` from now), with ``paused`` steps (the path's start, a restart) not counted."""

    def __init__(self, timeout: asyncio.Timeout, max_duration_s: float, *, grace_s: float = START_GRACE_S) -> None:
        self.timeout = timeout
        self.max_duration_s = max_duration_s
        self.grace_s = grace_s
        self.stage = "start-up"  # start-up | run | path | restart
        self.allowance_s: float | None = None  # the target's start-up allowance (None: reached, not started)
        self.t0 = time.monotonic()
        self.ready_after_s: float | None = None  # how long the start took (seconds from t0)
        self.not_counted_s: dict[str, float] = {}  # paused steps: seconds each kind took, in all
        self._left_s = max_duration_s  # of max_duration, while a step is paused
        self._step_s = 0.0  # the allowance of the step paused now
        self._depth = 0

    # -- the stages ----------------------------------------------------------------------------
    def start_up(self, allowance_s: float | None) -> None:
        """The target starting: it may take its allowance (None: a server already running) and the grace."""
        self.stage, self.allowance_s = "start-up", allowance_s
        self._move((allowance_s or 0.0) + self.grace_s)

    def ready(self) -> None:
        """The target is ready: ``max_duration`` counts from now."""
        self.stage = "run"
        self.ready_after_s = time.monotonic() - self.t0
        self._move(self.max_duration_s)

    @contextlib.contextmanager
    def paused(self, what: str, allowance_s: float) -> Iterator[None]:
        """A step whose time is not the run's (``path``, ``restart``): the deadline moves out by
        ``allowance_s`` while it runs and back by the time it took once it is done. Nested or
        concurrent steps share the outermost one's pause."""
        if self._depth or self.stage != "run":
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._depth, self.stage = 1, what
        self._left_s, self._step_s = self.left_s(), allowance_s
        started = time.monotonic()
        self._move(allowance_s + self._left_s)
        try:
            yield
        finally:
            self._depth = 0
            took = time.monotonic() - started
            self.not_counted_s[what] = self.not_counted_s.get(what, 0.0) + took
            if not self.timeout.expired():  # once it fired, the stage stays: the message names the step
                self.stage = "run"
                self._move(self._left_s)

    # -- reading it ----------------------------------------------------------------------------
    def left_s(self) -> float:
        """Seconds until the deadline, as it stands (``max_duration`` when none is set)."""
        when = self.timeout.when()
        if when is None:
            return self.max_duration_s
        return max(0.0, when - asyncio.get_running_loop().time())

    def hard_stop_ns(self) -> int:
        """The deadline on the monotonic ns clock (the load's hard stop until its real end is known)."""
        return time.monotonic_ns() + int(self.left_s() * 1e9)

    def exceeded(self) -> str:
        """Which bound the run exceeded, in words (the timeout fired in ``self.stage``)."""
        if self.stage == "start-up":
            allowance = ("a server already running: no allowance of its own" if self.allowance_s is None
                         else f"its start-up allowance {self.allowance_s:g}s")
            return (f"the target was not ready within {(self.allowance_s or 0.0) + self.grace_s:g}s ({allowance}, "
                    f"plus {self.grace_s:g}s to launch and check it); safety.max_duration had not started")
        if self.stage in ("path", "restart"):
            step = "the path's start" if self.stage == "path" else "the target's restart"
            return (f"{step} took longer than its allowance ({self._step_s:g}s) plus the {self._left_s:.1f}s of "
                    f"safety.max_duration ({self.max_duration_s:g}s) that were left")
        skipped = ", ".join(f"{'the path' if what == 'path' else 'restarts'} {s:.1f}s"
                            for what, s in self.not_counted_s.items() if s >= 0.05)
        ready = "" if self.ready_after_s is None else f"; the target was ready {self.ready_after_s:.1f}s into the run"
        return (f"the run exceeded safety.max_duration ({self.max_duration_s:g}s), counted from when the target was "
                f"ready{ready}" + (f"; not counted: {skipped}" if skipped else ""))

    def _move(self, seconds: float) -> None:
        with contextlib.suppress(RuntimeError):  # the timeout already fired or was left: nothing to move
            self.timeout.reschedule(asyncio.get_running_loop().time() + seconds)
