"""Server faults: asyncio timeouts, aborts, event-loop / engine stalls and Nagle on, inside the server.

All act through the admin API of the builtin stack, or of the streamchaos middleware that a vllm
target loads into vLLM's own server (``chaos.stack.vllm_middleware``): inject installs a hook fault
named after the experiment's fault under a short lease that a task renews while it is injected;
revert stops the renewals and deletes it, and a runner that dies leaves it for one lease at most.
Inside vLLM only the ASGI points act (``first_byte``, ``mid_stream``, ``request_body``, aborts, and
event-loop stalls); the builtin engine's own points are refused at validation. Targets with no admin
API are refused at activation, naming the faults that work everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from chaos.admin.client import LEASE_RENEW_EVERY_S, LEASE_TTL_S, AdminClient, LeaseKeeper, admin_delete_sync
from chaos.model.context import FaultAccount, RunContext, Scene
from chaos.model.errors import FaultUnsupported
from chaos.model.params import Param, Schema
from faults.base import Fault, Injection, register

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["ServerAbort", "ServerNagle", "ServerStall", "ServerTimeout", "describe_no_admin", "require_admin"]

BUILTIN_ONLY_WHERE = ("engine_step", "detokenize", "send")  # points inside the builtin stack's request path
ASGI_WHERE = ("first_byte", "mid_stream", "request_body")  # the middleware's, in any ASGI server (vLLM's too)


# which requests a timeout or an abort hits: one of these, replayable from the run's seed
_PICK_REQUESTS = (
    Param("fraction", "fraction", doc="share of requests hit, drawn per request from the run's seed"),
    Param("every_n", "int", min=1, doc="hit every n-th request"),
)


def _builtin_only(experiment: Experiment, key: str, what: str, instead: str) -> list[tuple[str, str]]:
    """A validation problem when ``what`` needs the builtin stack and the experiment targets vLLM."""
    if getattr(getattr(experiment, "target", None), "kind", None) != "vllm":
        return []
    return [(key, f"{what} is inside the builtin stack, and target kind vllm runs vLLM's own server "
                  f"(the streamchaos middleware acts there at the ASGI points); use {instead}")]


def require_admin(kind: str, ctx: RunContext, alternatives: str) -> str:
    """The target's admin URL, or ``FaultUnsupported`` naming why and what to use instead."""
    if not ctx.target.admin_url:
        raise FaultUnsupported(
            f"{kind} acts through the admin API of the builtin stack (or of the middleware a vllm target loads), and "
            f"target {ctx.target.kind!r} ({ctx.target.base_url}) has none; run it against target 'builtin' or 'vllm', "
            f"or use {alternatives}"
        )
    return ctx.target.admin_url


def describe_no_admin(kind: str, scene: Scene, alternatives: str) -> str:
    """Why a dry run expects ``kind`` to be refused: the target shows no admin API."""
    return (f"{kind} acts through the admin API of the builtin stack or of a vllm target's middleware, and target "
            f"{scene.target.kind!r} ({scene.target.base_url}) shows none (a builtin stack started elsewhere needs its "
            f"admin token); use {alternatives}")


def _server_words(kind: str) -> str:
    return "vLLM's server (the streamchaos middleware)" if kind == "vllm" else "the builtin stack"


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
            changes=(f"installs hook fault {self.name!r} in {_server_words(scene.target.kind)} through its admin API "
                     f"at {admin or '(none)'} ({self.schema.format(self.params)}): {self.summary}; "
                     f"under a {LEASE_TTL_S:g}s lease the runner renews"),
            undo=("deletes the hook fault when the phase ends; if the runner dies its lease lapses within "
                  f"{LEASE_TTL_S:g}s; `streamchaos rollback` deletes it too"),
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
    summary = "raise asyncio.TimeoutError inside the server (builtin or vLLM) for a share of requests"
    schema = Schema(
        params=(
            Param("where", "choice", required=True, choices=BUILTIN_ONLY_WHERE + ASGI_WHERE,
                  doc="the hook point: first_byte (before the headers), mid_stream (after `after_events` events), "
                      "request_body (reading the body): any server; engine_step, detokenize, send: "
                      "the builtin stack's own"),
            *_PICK_REQUESTS,
            Param("after", "duration", default=0.0, doc="fire once the request is this old"),
            Param("after_events", "int", min=0,
                  doc="mid_stream: fire once this many SSE events have gone out (default 1)"),
        ),
        one_of=(("fraction", "every_n"),),
    )

    where: str
    fraction: float | None
    every_n: int | None
    after: float
    after_events: int | None

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if self.after_events is not None and self.where != "mid_stream":
            return [("after_events", "counts events already sent, so it applies only with where: mid_stream, "
                                     f"not {self.where}")]
        if self.where in BUILTIN_ONLY_WHERE:
            return _builtin_only(experiment, "where", f"where: {self.where}", f"where: {', '.join(ASGI_WHERE)}")
        return []

    def hook_spec(self, ctx: RunContext) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "type": "timeout",
            "where": self.where,
            "after": self.after,
            "seed": ctx.rng(self.name).getrandbits(31),  # replayable from the run's seed
        }
        if self.after_events is not None:
            spec["after_events"] = self.after_events
        return _pick_requests(spec, self.every_n, self.fraction)


def _pick_requests(spec: dict[str, Any], every_n: int | None, fraction: float | None) -> dict[str, Any]:
    if every_n is not None:
        spec["every_n"] = every_n
    else:
        spec["fraction"] = fraction
    return spec


@register
@dataclass(frozen=True, kw_only=True)
class ServerAbort(_HookFault):
    """End a share of streams mid-generation with an error event, as an engine that fails a request does."""

    kind = "server.abort"
    summary = ("end a share of streams after N events with an OpenAI error event and [DONE]; "
               "the handler (and engine request) is aborted")
    alternatives = "network.reset or client.disconnect"
    schema = Schema(
        params=(
            *_PICK_REQUESTS,
            Param("after_events", "int", default=1, min=0, doc="abort once this many SSE events have gone out"),
            Param("after", "duration", default=0.0, doc="and once the request is this old"),
        ),
        one_of=(("fraction", "every_n"),),
    )

    fraction: float | None
    every_n: int | None
    after_events: int
    after: float

    def hook_spec(self, ctx: RunContext) -> dict[str, Any]:
        spec: dict[str, Any] = {"type": "abort", "after_events": self.after_events, "after": self.after,
                                "seed": ctx.rng(self.name).getrandbits(31)}
        return _pick_requests(spec, self.every_n, self.fraction)


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
            Param("every", "duration", required=True, min=0.002,
                  doc="period between stall starts (the first starts at inject)"),
        ),
    )

    where: str
    duration: float
    every: float

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if self.every <= self.duration:
            return [("every", f"must be longer than duration ({self.duration:g}s), found {self.every:g}s; "
                              "nothing would run between stalls")]
        if self.where == "engine":
            return _builtin_only(experiment, "where", "where: engine (pausing the engine thread)",
                                 "where: event_loop, or process-level pauses (docker.pause)")
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

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        return _builtin_only(experiment, "", "server.nagle (the builtin stack's socket registry)",
                             "network.latency or network.slicer")

    def hook_spec(self, ctx: RunContext) -> dict[str, Any]:
        return {"type": "nagle"}
