"""A kill at a set time into its phase, as one task, and how its revert settles it.

Shared by ``process.kill`` (a pid) and ``docker.kill`` (a container): each supplies the act (signal,
wait for the exit, restart if asked) and its own evidence; the schedule, the wait at inject and the
revert's cancel-or-wait are the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["INJECT_WAIT_S", "REVERT_WAIT_S", "KillSchedule"]

INJECT_WAIT_S = 5.0  # inject with at: 0 waits this long for the exit
REVERT_WAIT_S = 15.0  # a pending restart at revert, by default (the runner allows a revert 20s)


class KillSchedule:
    """One phase's kill task. The act calls ``acted.set()`` once its outcome is known (the exit seen,
    or the kill found moot); a restart may follow in the same task."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.task: asyncio.Task[None] | None = None
        self.acted = asyncio.Event()
        self.reverted = False

    async def start(self, at_s: float, act: Callable[[], Awaitable[None]]) -> bool:
        """Run ``act`` ``at_s`` seconds from now; True when it is only scheduled.

        At 0 the phase starts with the kill itself as evidence: wait until the act has its outcome
        (at most ``INJECT_WAIT_S``: a graceful SIGTERM exit may take longer than the timeline should
        wait; revert then reports it) and raise its failure.
        """
        self.acted, self.reverted = asyncio.Event(), False

        async def later() -> None:
            await asyncio.sleep(at_s)
            await act()

        task = self.task = asyncio.create_task(later(), name=f"{self.name}-kill")
        if at_s > 0:
            return True
        waiter = asyncio.create_task(self.acted.wait())
        await asyncio.wait({waiter, task}, timeout=INJECT_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task.done() and (failure := task.exception()) is not None:
            raise failure
        return False

    def skip_revert(self) -> dict[str, Any] | None:
        """Why revert has nothing to do (never started, already reverted), else None and it is marked reverted."""
        if self.task is None or self.reverted:
            return {"skipped": "not injected" if self.task is None else "already reverted"}
        self.reverted = True
        return None

    async def settle(self, sent: bool, wait_s: float = REVERT_WAIT_S) -> dict[str, Any]:
        """At revert: a kill not sent yet is cancelled (``{"killed": False, "cancelled": True}``); one sent
        is waited for, its restart included (a restart already under way is the revert's to wait for,
        however long the target takes to start: the fault is in force until it serves again), at most
        ``wait_s`` (``{"kill_task_error": ...}`` if it failed or still runs: ``running`` says which)."""
        task = self.task
        assert task is not None
        if not task.done() and not sent:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return {"killed": False, "cancelled": True}
        try:
            await asyncio.wait_for(asyncio.shield(task), wait_s)
        except TimeoutError:
            return {"kill_task_error": f"still running {wait_s:g}s into the revert", "running": True}
        except Exception as exc:  # noqa: BLE001 - reported in the evidence; the caller retries the restart
            return {"kill_task_error": repr(exc)}
        return {}

    def stop(self) -> None:
        """Cancel the task if it still runs (before the revert restarts the target itself)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
