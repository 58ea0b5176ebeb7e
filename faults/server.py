"""Server faults: asyncio timeouts, event-loop / engine stalls and Nagle on, inside the builtin stack.

All act through the stack's admin API (``chaos.stack.admin_client``): inject installs a hook fault
named after the experiment's fault under a short lease that a task renews while it is injected;
revert stops the renewals and deletes it, and a runner that dies leaves it for one lease at most.
Only the builtin target has that API; on any other target activation says so and names the faults
that work everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from chaos.context import FaultAccount, RunContext, Scene
from chaos.errors import FaultUnsupported
from chaos.params import Param, Schema
from chaos.stack.admin_client import LEASE_RENEW_EVERY_S, LEASE_TTL_S, AdminClient, LeaseKeeper, admin_delete_sync
from faults.base import Fault, Injection, register

if TYPE_CHECKING:
    from chaos.experiment.model import Experiment

__all__ = ["ServerNagle", "ServerStall", "ServerTimeout", "describe_no_admin", "require_admin"]


def require_admin(kind: str, ctx: RunContext, alternatives: str) -> str:
    """The target's admin URL, or ``FaultUnsupported`` naming why and what to use instead."""
    if not ctx.target.admin_url:
        raise FaultUnsupported(
            f"{kind} acts through the builtin stack's admin API, and target {ctx.target.kind!r} "
            f"({ctx.target.base_url}) has none; run it against target 'builtin', or use {alternatives}"
        )
    return ctx.target.admin_url


def describe_no_admin(kind: str, scene: Scene, alternatives: str) -> str:
    """Why a dry run expects ``kind`` to be refused: the target shows no admin API."""
    return (f"{kind} acts through the builtin stack's admin API, and target {scene.target.kind!r} ({scene.target.base_url}) "
            f"shows none (a builtin stack started elsewhere needs its admin token); use {alternatives}")


class _HookInjection(Injection):
    """One hook fault installed in the stack for the length of a phase."""

    def __init__(self, fault: _HookFault, ctx: RunContext, admin_url: str) -> None:
        super().__init__(fault, ctx)
        self.hook = fault
        self.admin_url = admin_url
        self._keeper: LeaseKeeper | None = None  # renews the hook's lease from inject to revert

    def plan(self) -> dict[str, Any]:
        # The token is not journaled; rollback reads STREAMCHAOS_ADMIN_TOKEN when it needs one.
        return {"admin_url": self.admin_url, "fault_name": self.name}

    async def inject(self) -> dict[str, Any]:
        token = self.ctx.target.admin_token
        async with AdminClient(self.admin_url, token) as admin:
            await admin.set_fault(self.name, {**self.hook.hook_spec(self.ctx), "ttl": LEASE_TTL_S})
            listed = (await admin.faults()).get(self.name)
        name = self.name
        self._keeper = LeaseKeeper(self.admin_url, token, lambda admin: admin.renew_fault(name), LEASE_RENEW_EVERY_S)
        self._keeper.start()
        return {"installed": listed, "lease_s": LEASE_TTL_S}

    async def revert(self) -> dict[str, Any]:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await keeper.stop()
        async with AdminClient(self.admin_url, self.ctx.target.admin_token) as admin:
            listed = (await admin.faults()).get(self.name)
            removed = await admin.clear_fault(self.name)
        return {"removed": removed, "last_seen": listed}


@dataclass(frozen=True, kw_only=True)
class _HookFault(Fault):
    """Faults that are one hook fault in the stack: shared activation and rollback."""

    alternatives = "client.timeout or network faults"
    injection = _HookInjection

    def hook_spec(self, ctx: RunContext) -> dict[str, Any]:
        raise NotImplementedError

    def activate(self, ctx: RunContext) -> Injection:
        return self.injection(self, ctx, require_admin(self.kind, ctx, self.alternatives))

    def describe(self, scene: Scene) -> FaultAccount:
        admin = scene.target.admin_url
        return FaultAccount(
            changes=(f"installs hook fault {self.name!r} in the builtin stack through its admin API at {admin or '(none)'} "
                     f"({self.schema.format(self.params)}): {self.summary}; under a {LEASE_TTL_S:g}s lease the runner renews"),
            undo=(f"deletes the hook fault when the phase ends; if the runner dies its lease lapses within {LEASE_TTL_S:g}s; "
                  "`streamchaos rollback` deletes it too"),
            refused=None if admin else describe_no_admin(self.kind, scene, self.alternatives),
        )

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        admin_url = str(undo["admin_url"])
        path = f"/faults/{quote(str(undo['fault_name']), safe='')}"
        body = admin_delete_sync(admin_url, path, os.environ.get("STREAMCHAOS_ADMIN_TOKEN"))
        if body is None:
            return {"skipped": f"the stack at {admin_url} is gone; nothing to undo"}
        return {"removed": bool(body.get("removed"))}


@register
@dataclass(frozen=True, kw_only=True)
class ServerTimeout(_HookFault):
    """``asyncio.TimeoutError`` at an engine step, around detokenization or before a send."""

    kind = "server.timeout"
    summary = "raise asyncio.TimeoutError inside the builtin stack for a share of requests"
    schema = Schema(
        params=(
            Param("where", "choice", required=True, choices=("engine_step", "detokenize", "send"),
                  doc="the hook point where the timeout fires"),
            Param("fraction", "fraction", doc="share of requests hit, drawn per request from the run's seed"),
            Param("every_n", "int", min=1, doc="hit every n-th request"),
            Param("after", "duration", default=0.0, doc="fire once the request is this old"),
        ),
        one_of=(("fraction", "every_n"),),
    )

    where: str
    fraction: float | None
    every_n: int | None
    after: float

    def hook_spec(self, ctx: RunContext) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "type": "timeout",
            "where": self.where,
            "after": self.after,
            "seed": ctx.rng(self.name).getrandbits(31),  # replayable from the run's seed
        }
        if self.every_n is not None:
            spec["every_n"] = self.every_n
        else:
            spec["fraction"] = self.fraction
        return spec


@register
@dataclass(frozen=True, kw_only=True)
class ServerStall(_HookFault):
    """Block the event loop with CPU work, or pause the engine thread, periodically."""

    kind = "server.stall"
    summary = "stall the builtin stack's event loop or engine for `duration` every `every`"
    alternatives = "network.latency or gpu.throttle"
    schema = Schema(
        params=(
            Param("where", "choice", required=True, choices=("event_loop", "engine"),
                  doc="event_loop: CPU work on the loop thread; engine: pause the engine thread"),
            Param("duration", "duration", required=True, min=0.001, max=60.0, doc="how long each stall lasts"),
            Param("every", "duration", required=True, min=0.002, doc="period between stall starts (the first starts at inject)"),
        ),
    )

    where: str
    duration: float
    every: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if self.every <= self.duration:
            return [("every", f"must be longer than duration ({self.duration:g}s), found {self.every:g}s; nothing would run between stalls")]
        return []

    def hook_spec(self, ctx: RunContext) -> dict[str, Any]:
        return {"type": "stall", "where": self.where, "duration": self.duration, "every": self.every}


class _NagleInjection(_HookInjection):
    """The nagle hook, with evidence read back from the stack's sockets before and after."""

    async def inject(self) -> dict[str, Any]:
        evidence = await super().inject()
        sockets = (evidence.get("installed") or {}).get("connections") or {}
        # how many live connections have Nagle on now, as getsockopt reports it
        return {**evidence, "connections_open": sockets.get("open"), "connections_nagle_on": sockets.get("nagle_on")}

    async def revert(self) -> dict[str, Any]:
        evidence = await super().revert()
        async with AdminClient(self.admin_url, self.ctx.target.admin_token) as admin:
            after = (await admin.state()).get("connections") or {}
        return {**evidence, "after": after}  # nagle_on 0: TCP_NODELAY restored on every live connection


@register
@dataclass(frozen=True, kw_only=True)
class ServerNagle(_HookFault):
    """Nagle's algorithm back on (TCP_NODELAY off) for the stack's accepted connections, live and new.

    The trap of a server that never sets TCP_NODELAY: on a keep-alive connection the first SSE
    event after the headers waits for the client's delayed ACK (~40 ms on Linux), so TTFT grows by
    that on every request but a connection's first. Evidence is read back from the sockets.
    """

    kind = "server.nagle"
    summary = "turn Nagle back on (TCP_NODELAY off) for the builtin stack's connections, live and new"
    alternatives = "network.latency or network.slicer"
    schema = Schema(params=())
    injection = _NagleInjection

    def hook_spec(self, ctx: RunContext) -> dict[str, Any]:
        return {"type": "nagle"}
