"""Client faults: a fraction of the load generator's clients hang up, read slowly, or time out.

Each fault installs a picklable ``ClientRule`` into ``env.clients`` on inject and removes it on
revert; the generator draws every new request's plan from the rules in force with a generator
seeded by the request id, so a run replays. Nothing outlives the run, so rollback has nothing to do.
Deliberate hang-ups are stamped on the record (``StreamRecord.hangup``) with their fault and cause.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

from chaos.params import Param, Schema
from faults.base import ClientPlan, ClientRule, Fault, FaultEnv, register

__all__ = ["ClientDisconnect", "ClientSlowReader", "ClientTimeout", "DisconnectRule", "SlowReaderRule", "TimeoutRule"]

_FRACTION = Param("fraction", "fraction", default=1.0, doc="share of requests that behave this way")


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


class _ClientFault(Fault):
    """Install the rule on inject, remove it on revert; the evidence is the rule itself."""

    def rule(self) -> ClientRule:
        raise NotImplementedError

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        rule = self.rule()
        env.clients.install(rule)
        return {"rule": type(rule).__name__, **asdict(rule)}  # type: ignore[call-overload]

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        return {"removed": env.clients.remove(self.name)}


@register
class ClientDisconnect(_ClientFault):
    kind = "client.disconnect"
    summary = "a fraction of clients hang up after N tokens, after a time, or while queued"
    schema = Schema(
        params=(
            _FRACTION,
            Param("after_tokens", "int_or_range", min=0, doc="hang up after this many content events (or a seeded draw from [lo, hi])"),
            Param("after", "duration", doc="hang up this long after the request was sent"),
            Param("while_queued", "bool", doc="hang up before the first byte of the response body"),
        ),
        one_of=(("after_tokens", "after", "while_queued"),),
    )

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        p = self.params
        if p.get("after_tokens") is None and p.get("after") is None and not p.get("while_queued"):
            return [("while_queued", "while_queued: false alone disconnects nobody; use true, or after_tokens / after")]
        if p.get("after") == 0:
            return [("after", "must be longer than 0s; use while_queued: true to hang up before the first byte")]
        return []

    def rule(self) -> ClientRule:
        tokens = self.params.get("after_tokens")
        return DisconnectRule(
            fault=self.name,
            fraction=float(self.params.get("fraction", 1.0)),
            after_tokens=tuple(tokens) if tokens is not None else None,  # type: ignore[arg-type]
            after_s=self.params.get("after"),
            while_queued=bool(self.params.get("while_queued")),
        )


@register
class ClientSlowReader(_ClientFault):
    kind = "client.slow_reader"
    summary = "a fraction of clients read slowly (a pause per read or a byte-rate cap): back-pressure"
    schema = Schema(
        params=(
            _FRACTION,
            Param("read_delay", "duration", doc="pause before every network read"),
            Param("rate", "data_rate", min=1, doc="cap on the client's read rate"),
        ),
        one_of=(("read_delay", "rate"),),
    )

    def rule(self) -> ClientRule:
        return SlowReaderRule(
            fault=self.name,
            fraction=float(self.params.get("fraction", 1.0)),
            read_delay_s=float(self.params.get("read_delay") or 0.0),
            read_rate_bps=self.params.get("rate"),
        )


@register
class ClientTimeout(_ClientFault):
    kind = "client.timeout"
    summary = "a fraction of clients give up when one read waits longer than a timeout"
    schema = Schema(
        params=(
            _FRACTION,
            Param("timeout", "duration", required=True, doc="read timeout per network read; shorter than the stream needs"),
        ),
    )

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        if not self.params.get("timeout"):
            return [("timeout", "must be longer than 0s, e.g. 200ms")]
        return []

    def rule(self) -> ClientRule:
        return TimeoutRule(fault=self.name, fraction=float(self.params.get("fraction", 1.0)), timeout_s=float(self.params["timeout"]))
