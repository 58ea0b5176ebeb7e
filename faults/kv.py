"""KV-cache pressure: take blocks out of the builtin engine's pool, or hog KV with background streams.

``method: reserve`` removes free blocks through the builtin stack's admin API (released on revert),
under a short lease renewed while the fault is injected, so a dead runner's reservation ends by itself.
Only free blocks can be taken, so under load the fault keeps topping the reservation up as blocks
come free (finished or preempted requests) until it holds the target or is reverted;
``method: hog`` asks the runner's ``BackgroundLoad`` for long-prompt, long-output streams that hold
KV on any engine, vLLM included, and are kept out of the SLA population (aborted on revert).
Either way the engine must queue or preempt the real load: the evidence records the engine state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from typing import Any

import httpx

from chaos.errors import FaultUnsupported
from chaos.params import Param, Schema
from chaos.stack import admin_client
from chaos.stack.admin_client import AdminClient, LeaseKeeper
from faults.base import Fault, FaultEnv, register
from faults.server import require_admin

__all__ = ["KvPressure"]

TOPUP_INTERVAL_S = 0.02  # how often a short reservation tries again to take freed blocks
TOPUP_STOP_TIMEOUT_S = 2.0  # a reserve call answers in ms; a hung one is cancelled (the release count still tells)

_STATE_KEYS = ("kv_blocks_used", "kv_blocks_total", "kv_blocks_reserved", "num_running", "num_waiting", "num_preemptions")


@register
class KvPressure(Fault):
    """Shrink the KV pool (reserve) or fill it with background streams (hog)."""

    kind = "kv.pressure"
    summary = "take KV-cache blocks away from the load: reserve them (builtin) or hog them with background streams"
    schema = Schema(
        params=(
            Param("fraction", "fraction", doc="reserve: share of the pool's blocks to take"),
            Param("blocks", "int", min=1, doc="reserve: number of blocks to take"),
            Param("method", "choice", default="reserve", choices=("reserve", "hog")),
            Param("hog_streams", "int", default=4, min=1, max=512, doc="hog: background streams"),
            Param("hog_prompt_chars", "int", default=2000, min=1, max=1_000_000, doc="hog: prompt length in characters"),
            Param("hog_max_tokens", "int", default=512, min=1, doc="hog: max_tokens of each background stream"),
        ),
        at_most_one_of=(("fraction", "blocks"),),
    )

    def __init__(self, name: str, params: Mapping[str, Any]) -> None:
        super().__init__(name, params)
        self._topup: asyncio.Task[None] | None = None
        self._topup_stop = asyncio.Event()
        self._held = 0  # blocks this fault has reserved so far
        self._keeper: LeaseKeeper | None = None  # renews the reservation's lease from inject to revert

    def problems(self, experiment: Any) -> list[tuple[str, str]]:
        if self.params.get("method", "reserve") == "reserve" and self.params.get("fraction") is None and self.params.get("blocks") is None:
            return [("", "method 'reserve' needs 'fraction' (e.g. 0.8) or 'blocks' (e.g. 400)")]
        return []

    def check(self, env: FaultEnv) -> None:
        if self._method == "reserve":
            require_admin(self.kind, env, "kv.pressure with method: hog")
        elif env.background is None:
            raise FaultUnsupported("kv.pressure method 'hog' needs the runner's background load, and none was given to this fault")

    @property
    def _method(self) -> str:
        return str(self.params.get("method") or "reserve")

    def plan(self, env: FaultEnv) -> dict[str, Any]:
        if self._method == "reserve":
            # The token is not journaled; rollback reads STREAMCHAOS_ADMIN_TOKEN when it needs one.
            return {"method": "reserve", "admin_url": require_admin(self.kind, env, "kv.pressure with method: hog")}
        return {"method": "hog", "note": "background streams die with the runner; nothing outlives it"}

    async def inject(self, env: FaultEnv) -> dict[str, Any]:
        if self._method == "reserve":
            return await self._reserve(env)
        assert env.background is not None, "check() guarantees a background load"
        streams = int(self.params["hog_streams"])
        await env.background.start(self.name, streams, int(self.params["hog_prompt_chars"]), int(self.params["hog_max_tokens"]))
        evidence: dict[str, Any] = {"method": "hog", "streams_started": streams}
        if env.target.admin_url:
            async with AdminClient(env.target.admin_url, env.target.admin_token) as admin:
                evidence["engine"] = _pick(await admin.state())
        return evidence

    async def _reserve(self, env: FaultEnv) -> dict[str, Any]:
        admin_url = require_admin(self.kind, env, "kv.pressure with method: hog")
        async with AdminClient(admin_url, env.target.admin_token) as admin:
            before = await admin.state()
            total = int(before["kv_blocks_total"])
            wanted = int(self.params["blocks"]) if self.params.get("blocks") is not None else round(float(self.params["fraction"]) * total)
            self._held = await admin.reserve(wanted, ttl=admin_client.LEASE_TTL_S)
            after = await admin.state()
        self._keeper = LeaseKeeper(admin_url, env.target.admin_token, lambda admin: admin.renew_reserve(),
                                   admin_client.LEASE_RENEW_EVERY_S)
        self._keeper.start()
        evidence: dict[str, Any] = {"method": "reserve", "requested": wanted, "reserved": self._held, "engine": _pick(after),
                                    "lease_s": admin_client.LEASE_TTL_S}
        if self._held < wanted:
            # Live requests hold the rest; take them as they come free, for as long as we are injected.
            evidence["note"] = f"only {self._held} of {wanted} blocks were free; topping up as blocks come free"
            self._topup_stop = asyncio.Event()
            self._topup = asyncio.create_task(self._top_up(admin_url, env.target.admin_token, wanted))
        return evidence

    async def _top_up(self, admin_url: str, token: str | None, wanted: int) -> None:
        async with AdminClient(admin_url, token) as admin:
            while self._held < wanted and not self._topup_stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._topup_stop.wait(), TOPUP_INTERVAL_S)
                if not self._topup_stop.is_set():
                    self._held += await admin.reserve(wanted - self._held, ttl=admin_client.LEASE_TTL_S)

    async def revert(self, env: FaultEnv) -> dict[str, Any]:
        if self._method == "reserve":
            topup, self._topup = self._topup, None
            if topup is not None:
                # stop it between requests rather than cancel it mid-request: a cancelled reserve call
                # could take blocks on the engine and never add them to our tally
                self._topup_stop.set()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(topup, TOPUP_STOP_TIMEOUT_S)  # a failed top-up must not stop the release
            keeper, self._keeper = self._keeper, None
            if keeper is not None:
                await keeper.stop()
            admin_url = require_admin(self.kind, env, "kv.pressure with method: hog")
            async with AdminClient(admin_url, env.target.admin_token) as admin:
                released = await admin.release()
                after = await admin.state()
            held, self._held = self._held, 0
            result: dict[str, Any] = {"method": "reserve", "reserved_at_revert": held, "released": released, "engine": _pick(after)}
            if released != held:
                result["note"] = f"the engine released {released} blocks; this fault had counted {held}"
            return result
        assert env.background is not None
        stopped = await env.background.stop(self.name)
        return {"method": "hog", "streams_stopped": stopped}

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        if undo.get("method") != "reserve":
            return {"skipped": "background streams ended with the runner"}
        token = os.environ.get("STREAMCHAOS_ADMIN_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = httpx.delete(f"{str(undo['admin_url']).rstrip('/')}/kv/reserve", headers=headers, timeout=5.0, trust_env=False)
        except httpx.ConnectError:
            return {"skipped": f"the stack at {undo['admin_url']} is gone; its pool went with it"}
        response.raise_for_status()
        return {"released": int(response.json()["released"])}


def _pick(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: state[k] for k in _STATE_KEYS if k in state}
