"""Server faults: asyncio timeouts, event-loop / engine stalls and Nagle on, inside the builtin stack.

All act through the stack's admin API (``chaos.stack.admin_client``): inject installs a hook fault
named after the experiment's fault, revert deletes it. Only the builtin target has that API; on any
other target ``check`` says so and names the faults that work everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from chaos.errors import FaultUnsupported
from chaos.params import Param, Schema
from chaos.stack.admin_client import AdminClient
from faults.base import Fault, FaultEnv, register

__all__ = ["ServerNagle", "ServerStall", "ServerTimeout", "delete_hook_fault", "require_admin"]


def require_admin(kind: str, env: FaultEnv, alternatives: str) -> str:
    """The target's admin URL, or ``FaultUnsupported`` naming why and what to use instead."""
    if not env.target.admin_url:
        raise FaultUnsupported(
            f"{kind} acts through the builtin stack's admin API, and target {env.target.kind!r} "
            f"({env.target.base_url}) has none; run it against target 'builtin', or use {alternatives}"
        )
    return env.target.admin_url


def delete_hook_fault(admin_url: str, fault_name: str, token: str | None = None) -> dict[str, Any]:
    """Synchronously delete a hook fault; a stack that is gone has nothing left to undo."""
    token = token or os.environ.get("STREAMCHAOS_ADMIN_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.delete(f"{admin_url.rstrip('/')}/faults/{quote(fault_name, safe='')}", headers=headers, timeout=5.0, trust_env=False)
    except httpx.ConnectError:
        return {"skipped": f"the stack at {admin_url} is gone; nothing to undo"}
    response.raise_for_status()
    return {"removed": bool(response.json().get("removed"))}


class _HookFault(Fault):
    """Shared inject/revert/rollback of faults that are one hook fault in the stack."""

    alternatives = "client.timeout or network faults"

    def spec(self, env: FaultEnv) -> dict[str, Any]:
        raise NotImplementedError

    def check(self, env: FaultEnv) -> None:
        require_admin(self.kind, env, self.alternatives)

    def plan(self, env: FaultEnv) -> dict[str, Any]:
        # The token is not journaled; rollback reads STREAMCHAOS_ADMIN_TOKEN when it needs one.
        return {"admin_url": require_admin(self.kind, env, self.alternatives), "fault_name": self.name}

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        admin_url = require_admin(self.kind, env, self.alternatives)
        async with AdminClient(admin_url, env.target.admin_token) as admin:
            await admin.set_fault(self.name, self.spec(env))
            listed = (await admin.faults()).get(self.name)
        return {"installed": listed}

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        admin_url = require_admin(self.kind, env, self.alternatives)
        async with AdminClient(admin_url, env.target.admin_token) as admin:
            listed = (await admin.faults()).get(self.name)
            removed = await admin.clear_fault(self.name)
        return {"removed": removed, "last_seen": listed}

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        return delete_hook_fault(str(undo["admin_url"]), str(undo["fault_name"]))


@register
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

    def spec(self, env: FaultEnv) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "type": "timeout",
            "where": self.params["where"],
            "after": float(self.params.get("after") or 0.0),
            "seed": env.rng(self.name).getrandbits(31),  # replayable from the run's seed
        }
        if self.params.get("every_n") is not None:
            spec["every_n"] = int(self.params["every_n"])
        else:
            spec["fraction"] = float(self.params["fraction"])
        return spec


@register
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

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        duration, every = self.params.get("duration"), self.params.get("every")
        if isinstance(duration, float) and isinstance(every, float) and every <= duration:
            return [("every", f"must be longer than duration ({duration:g}s), found {every:g}s; nothing would run between stalls")]
        return []

    def spec(self, env: FaultEnv) -> dict[str, Any]:
        return {
            "type": "stall",
            "where": self.params["where"],
            "duration": float(self.params["duration"]),
            "every": float(self.params["every"]),
        }


@register
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

    def spec(self, env: FaultEnv) -> dict[str, Any]:
        return {"type": "nagle"}

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        evidence = await super().inject(env)
        sockets = (evidence.get("installed") or {}).get("connections") or {}
        # how many live connections have Nagle on now, as getsockopt reports it
        return {**evidence, "connections_open": sockets.get("open"), "connections_nagle_on": sockets.get("nagle_on")}

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        evidence = await super().revert(env)
        async with AdminClient(require_admin(self.kind, env, self.alternatives), env.target.admin_token) as admin:
            after = (await admin.state()).get("connections") or {}
        return {**evidence, "after": after}  # nagle_on 0: TCP_NODELAY restored on every live connection
