"""Client faults: a fraction of the load generator's clients hang up, read slowly, or time out.

Each fault installs a picklable ``ClientRule`` (``chaos.model.client_rules``) into the run's client policy
on inject and removes it on revert; the generator draws every new request's plan from the rules in
force with a generator seeded by the request id, so a run replays. Nothing outlives the run, so
rollback has nothing to do. Deliberate hang-ups are stamped on the record (``StreamRecord.hangup``)
with their fault and cause.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from chaos.model.client_rules import DisconnectRule, SlowReaderRule, TimeoutRule
from chaos.model.context import ClientRule, FaultAccount, RunContext, Scene
from chaos.model.observations import PHASE_SCOPE
from chaos.model.params import Param, Schema
from faults.base import Fault, Injection, register

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["ClientDisconnect", "ClientSlowReader", "ClientTimeout"]

_FRACTION = Param("fraction", "fraction", default=1.0, doc="share of requests that behave this way")


class _RuleInjection(Injection):
    """Install the rule on inject, remove it on revert; the evidence is the rule itself."""

    def __init__(self, fault: Fault, ctx: RunContext, rule: ClientRule) -> None:
        super().__init__(fault, ctx)
        self.rule = rule

    async def inject(self) -> dict[str, Any]:
        self.ctx.clients.install(self.rule)
        return {"rule": type(self.rule).__name__, **asdict(self.rule)}  # type: ignore[call-overload]  # rules are dataclasses

    async def revert(self) -> dict[str, Any]:
        return {"removed": self.ctx.clients.remove(self.name)}


@dataclass(frozen=True, kw_only=True)
class _ClientFault(Fault):
    # A rule acts only on the requests sent while it is installed (the generator draws each request's
    # plan when it sends it: a hang-up point, a read pace, a read timeout), and it is installed after its
    # phase starts and removed before it ends: a stream of another phase never meets it.
    scope = PHASE_SCOPE

    fraction: float

    def rule(self) -> ClientRule:
        raise NotImplementedError

    def activate(self, ctx: RunContext) -> Injection:
        return _RuleInjection(self, ctx, self.rule())

    def describe(self, scene: Scene) -> FaultAccount:
        return FaultAccount(
            changes=(f"installs a rule in the load generator's clients ({self.schema.format(self.params)}): "
                     f"{self.summary}"),
            undo="removes the rule when the phase ends; nothing outside the load generator changes",
        )


@register
@dataclass(frozen=True, kw_only=True)
class ClientDisconnect(_ClientFault):
    kind = "client.disconnect"
    summary = "a fraction of clients hang up after N tokens, after a time, or while queued"
    schema = Schema(
        params=(
            _FRACTION,
            Param("after_tokens", "int_or_range", min=0,
                  doc="hang up after this many content events (or a seeded draw from [lo, hi]); at least 1"),
            Param("after", "duration", doc="hang up this long after the request was sent"),
            Param("while_queued", "bool",
                  doc="hang up before the first token: as the response headers arrive (or 50ms without them), "
                      "before any byte of the body: a client that leaves while its request is queued or in prefill"),
        ),
        one_of=(("after_tokens", "after", "while_queued"),),
    )

    after_tokens: tuple[int, int] | None
    after: float | None
    while_queued: bool | None

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if self.after_tokens is None and self.after is None and not self.while_queued:
            return [("while_queued", "while_queued: false alone disconnects nobody; use true, or after_tokens / after")]
        if self.after == 0:
            return [("after", "must be longer than 0s; use while_queued: true to hang up before the first byte")]
        if self.after_tokens is not None and self.after_tokens[0] == 0:
            # the client counts content events in the reads it gets: a 0 hangs up after the first read,
            # which may already carry the first token, so it cannot promise a hang-up before it
            return [("after_tokens", "must be at least 1: a count of 0 would hang up after the first read, which "
                     "may carry the first token; to hang up before the first token (while queued or in prefill) "
                     "add a second client.disconnect with while_queued: true")]
        return []

    def rule(self) -> ClientRule:
        return DisconnectRule(
            fault=self.name, fraction=self.fraction, after_tokens=self.after_tokens,
            after_s=self.after, while_queued=bool(self.while_queued),
        )


@register
@dataclass(frozen=True, kw_only=True)
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

    read_delay: float | None
    rate: float | None

    def rule(self) -> ClientRule:
        return SlowReaderRule(fault=self.name, fraction=self.fraction, read_delay_s=self.read_delay or 0.0,
                              read_rate_bps=self.rate)


@register
@dataclass(frozen=True, kw_only=True)
class ClientTimeout(_ClientFault):
    kind = "client.timeout"
    summary = "a fraction of clients give up when one read waits longer than a timeout"
    schema = Schema(
        params=(
            _FRACTION,
            Param("timeout", "duration", required=True,
                  doc="read timeout per network read; shorter than the stream needs"),
        ),
    )

    timeout: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if not self.timeout:
            return [("timeout", "must be longer than 0s, e.g. 200ms")]
        return []

    def rule(self) -> ClientRule:
        return TimeoutRule(fault=self.name, fraction=self.fraction, timeout_s=self.timeout)
