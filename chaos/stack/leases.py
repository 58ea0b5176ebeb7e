"""Leases on what the admin API changes: each expires by itself unless its holder renews it.

A KV reservation, a hook fault or a stall is set by a runner through the admin API and undone by
that runner's revert. When the runner dies (SIGKILL, OOM, a lost node) nobody reverts, so each
change is held under a lease: ``ttl`` seconds from its grant or last renewal, after which
``on_expire`` undoes it, the expiry is logged, and it is listed in ``/admin/state`` under
``expired_leases``. Timers run on the event loop; everything here is called from it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TTL_S", "MAX_TTL_S", "MIN_TTL_S", "Leases", "parse_ttl"]

log = logging.getLogger("chaos.stack.leases")

DEFAULT_TTL_S = 600.0  # a caller that sends no ttl (an operator with curl) still gets an end
MIN_TTL_S = 0.05
MAX_TTL_S = 3600.0
EXPIRED_KEPT = 32  # recent expiries listed in /admin/state


def parse_ttl(raw: object, default: float = DEFAULT_TTL_S) -> float:
    """A lease length in seconds from a JSON value; ``ValueError`` saying what is allowed."""
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not MIN_TTL_S <= raw <= MAX_TTL_S:
        raise ValueError(f"'ttl' must be a number of seconds in [{MIN_TTL_S:g}, {MAX_TTL_S:g}], found {raw!r}")
    return float(raw)


@dataclass
class _Lease:
    ttl: float
    expires_at: float  # loop time
    on_expire: Callable[[], Any]
    timer: asyncio.TimerHandle


class Leases:
    """Named leases with expiry timers on the running loop."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._leases: dict[str, _Lease] = {}
        self._wall = wall
        self.expired: deque[dict[str, Any]] = deque(maxlen=EXPIRED_KEPT)

    def grant(self, name: str, ttl: float, on_expire: Callable[[], Any]) -> dict[str, Any]:
        """Start (or restart) lease ``name``; ``on_expire`` runs on the loop if it is not renewed in time."""
        self.drop(name)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(ttl, self._expire, name)
        self._leases[name] = _Lease(ttl, loop.time() + ttl, on_expire, timer)
        return self.describe_one(name)

    def renew(self, name: str, ttl: float | None = None) -> dict[str, Any] | None:
        """Push the expiry ``ttl`` (default: the lease's own) seconds from now; None if there is no such lease."""
        lease = self._leases.get(name)
        if lease is None:
            return None
        lease.timer.cancel()
        lease.ttl = ttl if ttl is not None else lease.ttl
        loop = asyncio.get_running_loop()
        lease.expires_at = loop.time() + lease.ttl
        lease.timer = loop.call_later(lease.ttl, self._expire, name)
        return self.describe_one(name)

    def drop(self, name: str) -> bool:
        """End a lease without running its ``on_expire`` (the change was undone by its holder)."""
        lease = self._leases.pop(name, None)
        if lease is None:
            return False
        lease.timer.cancel()
        return True

    def close(self) -> None:
        for name in list(self._leases):
            self.drop(name)

    def describe_one(self, name: str) -> dict[str, Any]:
        lease = self._leases[name]
        left = lease.expires_at - asyncio.get_running_loop().time()
        return {"ttl_s": lease.ttl, "expires_in_s": round(max(0.0, left), 3)}

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: self.describe_one(name) for name in sorted(self._leases)}

    def _expire(self, name: str) -> None:
        lease = self._leases.pop(name, None)
        if lease is None:
            return
        record = {"name": name, "ttl_s": lease.ttl, "expired_at": round(self._wall(), 3)}
        try:
            undone = lease.on_expire()
        except Exception as exc:  # noqa: BLE001 - an expiry must never take the server down
            log.exception("lease %s expired; undoing it failed", name)
            record["error"] = f"{type(exc).__name__}: {exc}"
        else:
            record["undone"] = undone
            log.warning("lease %s expired after %gs without renewal: undone (%s)", name, lease.ttl, undone)
        self.expired.append(record)
