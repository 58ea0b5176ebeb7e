"""The client rules the load generator understands: hang up, read slowly, time out.

Client faults (``faults.client``) build these and install them in the run's ``ClientPolicy``; the
generator (``chaos.load``) draws every new request's plan from the rules in force. They are plain
frozen data, so they live in the model, below both: a client fault imports them without importing
the load generator, and a load worker process unpickles them without importing ``faults``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from chaos.model.context import ClientPlan, ClientRule

__all__ = ["DisconnectRule", "SlowReaderRule", "TimeoutRule"]


def _picked(rng: random.Random, fraction: float) -> bool:
    # always one draw, so a rule's later draws do not depend on whether it picked this request
    return rng.random() < fraction


@dataclass(frozen=True)
class DisconnectRule(ClientRule):
    """Hang up after a drawn number of content events, after a time, or while still queued."""

    fault: str
    fraction: float
    after_tokens: tuple[int, int] | None = None
    after_s: float | None = None
    while_queued: bool = False

    def draw(self, rng: random.Random) -> ClientPlan | None:
        if not _picked(rng, self.fraction):
            return None
        if self.after_tokens is not None:
            lo, hi = self.after_tokens
            return ClientPlan(hangup_after_tokens=rng.randint(lo, hi), faults=(self.fault,))
        if self.after_s is not None:
            return ClientPlan(hangup_after_s=self.after_s, faults=(self.fault,))
        return ClientPlan(hangup_while_queued=True, faults=(self.fault,))


@dataclass(frozen=True)
class SlowReaderRule(ClientRule):
    """Pause before every read, or cap the read rate, so server-side buffers fill."""

    fault: str
    fraction: float
    read_delay_s: float = 0.0
    read_rate_bps: float | None = None

    def draw(self, rng: random.Random) -> ClientPlan | None:
        if not _picked(rng, self.fraction):
            return None
        return ClientPlan(read_delay_s=self.read_delay_s, read_rate_bps=self.read_rate_bps, faults=(self.fault,))


@dataclass(frozen=True)
class TimeoutRule(ClientRule):
    """Give up on a stream when one read waits longer than ``timeout_s``."""

    fault: str
    fraction: float
    timeout_s: float

    def draw(self, rng: random.Random) -> ClientPlan | None:
        if not _picked(rng, self.fraction):
            return None
        return ClientPlan(read_timeout_s=self.timeout_s, faults=(self.fault,))
