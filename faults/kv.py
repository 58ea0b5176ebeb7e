"""KV-cache pressure: take blocks out of the builtin engine's pool, or hog KV with background streams.

``method: reserve`` removes free blocks through the builtin stack's admin API (released on revert),
under a short lease renewed while the fault is injected, so a dead runner's reservation ends by itself.
Only free blocks can be taken, so under load the fault keeps topping the reservation up as blocks
come free (finished or preempted requests) until it holds the target or is reverted;
``method: hog`` asks the runner's ``BackgroundLoad`` for long-prompt, long-output streams that hold
KV on any engine, vLLM included, and are kept out of the SLA population (aborted on revert).
Either way the engine must queue or preempt the real load: the evidence records the engine state.

``kv.prefix_flush`` empties the builtin engine's prefix cache through the admin API (vLLM's
``/reset_prefix_cache``): every free cached block is evicted and held ones serve no further hit, so the
requests that follow compute their shared prefixes again. A flush cannot be undone; its revert is a
no-op that says so (the cache refills by itself as requests recompute their prefixes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chaos.admin.client import LEASE_RENEW_EVERY_S, LEASE_TTL_S, AdminClient, LeaseKeeper, admin_delete_sync
from chaos.model.context import BackgroundLoad, FaultAccount, RunContext, Scene
from chaos.model.errors import FaultUnsupported
from chaos.model.params import Param, Schema
from faults.base import Fault, Injection, register
from faults.server import describe_no_admin, require_admin

if TYPE_CHECKING:
    from chaos.model.experiment import Experiment

__all__ = ["KvPrefixFlush", "KvPressure"]

TOPUP_INTERVAL_S = 0.02  # how often a short reservation tries again to take freed blocks
TOPUP_STOP_TIMEOUT_S = 2.0  # a reserve call answers in ms; a hung one is cancelled (the release count still tells)

_STATE_KEYS = ("kv_blocks_used", "kv_blocks_total", "kv_blocks_reserved", "num_running", "num_waiting",
               "num_preemptions")
_CACHE_KEYS = ("kv_blocks_cached", "kv_blocks_used", "prefix_cache_queries_total", "prefix_cache_hits_total",
               "prefix_caching")
_HOG_ALTERNATIVE = "kv.pressure with method: hog"
HOG_SETTLE_MAX_S = 10.0  # the longest a hog inject waits for its streams to hold their blocks


@register
@dataclass(frozen=True, kw_only=True)
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
            Param("hog_prompt_chars", "int", default=2000, min=1, max=1_000_000,
                  doc="hog: prompt length in characters"),
            Param("hog_max_tokens", "int", default=512, min=1, doc="hog: max_tokens of each background stream"),
        ),
        at_most_one_of=(("fraction", "blocks"),),
    )

    fraction: float | None
    blocks: int | None
    method: str
    hog_streams: int
    hog_prompt_chars: int
    hog_max_tokens: int

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        if self.method == "reserve" and self.fraction is None and self.blocks is None:
            return [("", "method 'reserve' needs 'fraction' (e.g. 0.8) or 'blocks' (e.g. 400)")]
        if self.method == "reserve" and getattr(getattr(experiment, "target", None), "kind", None) == "vllm":
            return [("method", "'reserve' takes blocks out of the builtin engine's pool, and target kind vllm "
                               "runs vLLM's own cache; use method: hog (background streams that fill vLLM's real "
                               "KV cache)")]
        return []

    def streams_opened(self) -> int:
        return self.hog_streams if self.method == "hog" else 0

    def activate(self, ctx: RunContext) -> Injection:
        if self.method == "reserve":
            return _Reservation(self, ctx, require_admin(self.kind, ctx, _HOG_ALTERNATIVE))
        if ctx.background is None:
            raise FaultUnsupported("kv.pressure method 'hog' needs the runner's background load, "
                                   "and none was given to this fault")
        return _Hog(self, ctx, ctx.background)

    def describe(self, scene: Scene) -> FaultAccount:
        if self.method == "hog":
            return FaultAccount(
                changes=(f"keeps {self.hog_streams} background streams of {self.hog_prompt_chars} prompt characters "
                         f"and up to {self.hog_max_tokens} tokens open against the target, so their KV blocks are "
                         "taken from the load (outside the SLA population)"),
                undo="hangs those streams up when the phase ends; they die with the runner, nothing outlives it",
            )
        share = f"{self.blocks}" if self.blocks is not None else f"{(self.fraction or 0.0):.0%} of the"
        admin = scene.target.admin_url
        return FaultAccount(
            changes=(f"reserves {share} KV-cache blocks of the builtin stack through its admin API at "
                     f"{admin or '(none)'}, topping the reservation up while live requests hold the rest"),
            undo=(f"releases the reservation when the phase ends; its lease lapses within {LEASE_TTL_S:g}s "
                  "if the runner dies; `streamchaos rollback` releases it too"),
            refused=None if admin else describe_no_admin(self.kind, scene, _HOG_ALTERNATIVE),
        )

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        if undo.get("method") != "reserve":
            return {"skipped": "background streams ended with the runner"}
        body = admin_delete_sync(str(undo["admin_url"]), "/kv/reserve", os.environ.get("STREAMCHAOS_ADMIN_TOKEN"))
        if body is None:
            return {"skipped": f"the stack at {undo['admin_url']} is gone; its pool went with it"}
        return {"released": int(body["released"])}


class _Reservation(Injection):
    """Reserve blocks through the admin API; top the reservation up while live requests hold the rest."""

    def __init__(self, fault: KvPressure, ctx: RunContext, admin_url: str) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.admin_url = admin_url
        self._topup: asyncio.Task[None] | None = None
        self._topup_stop = asyncio.Event()
        self._held = 0  # blocks this injection has reserved so far
        self._keeper: LeaseKeeper | None = None  # renews the reservation's lease from inject to revert

    def plan(self) -> dict[str, Any]:
        # The token is not journaled; rollback reads STREAMCHAOS_ADMIN_TOKEN when it needs one.
        return {"method": "reserve", "admin_url": self.admin_url}

    async def inject(self) -> dict[str, Any]:
        async with AdminClient(self.admin_url, self.ctx.target.admin_token) as admin:
            before = await admin.state()
            total = int(before["kv_blocks_total"])
            wanted = (self.spec.blocks if self.spec.blocks is not None
                      else round(float(self.spec.fraction or 0.0) * total))
            self._held = await admin.reserve(wanted, ttl=LEASE_TTL_S)
            after = await admin.state()
        self._keeper = LeaseKeeper(self.admin_url, self.ctx.target.admin_token, lambda admin: admin.renew_reserve(),
                                   LEASE_RENEW_EVERY_S)
        self._keeper.start()
        evidence: dict[str, Any] = {"method": "reserve", "requested": wanted, "reserved": self._held,
                                    "engine": _pick(after), "lease_s": LEASE_TTL_S}
        if self._held < wanted:
            # Live requests hold the rest; take them as they come free, for as long as we are injected.
            evidence["note"] = f"only {self._held} of {wanted} blocks were free; topping up as blocks come free"
            self._topup_stop = asyncio.Event()
            self._topup = asyncio.create_task(self._top_up(wanted))
        return evidence

    async def _top_up(self, wanted: int) -> None:
        async with AdminClient(self.admin_url, self.ctx.target.admin_token) as admin:
            while self._held < wanted and not self._topup_stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._topup_stop.wait(), TOPUP_INTERVAL_S)
                if not self._topup_stop.is_set():
                    self._held += await admin.reserve(wanted - self._held, ttl=LEASE_TTL_S)

    async def revert(self) -> dict[str, Any]:
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
        async with AdminClient(self.admin_url, self.ctx.target.admin_token) as admin:
            released = await admin.release()
            after = await admin.state()
        held, self._held = self._held, 0
        result: dict[str, Any] = {"method": "reserve", "reserved_at_revert": held, "released": released,
                                  "engine": _pick(after)}
        if released != held:
            result["note"] = f"the engine released {released} blocks; this fault had counted {held}"
        return result


class _Hog(Injection):
    """Background streams with long prompts and long outputs, outside the SLA population."""

    def __init__(self, fault: KvPressure, ctx: RunContext, background: BackgroundLoad) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.background = background

    def plan(self) -> dict[str, Any]:
        return {"method": "hog", "note": "background streams die with the runner; nothing outlives it"}

    async def inject(self) -> dict[str, Any]:
        spec = self.spec
        # the engine's state is read once the hog streams hold their blocks (each has its first token),
        # not at once: on a busy box they are admitted later. Bounded: half the phase, at most 10 s.
        phase_s = self.ctx.phase_duration_s
        settle_s = min(HOG_SETTLE_MAX_S, phase_s / 2) if phase_s else HOG_SETTLE_MAX_S
        started = time.monotonic()
        holding = await self.background.start(self.name, spec.hog_streams, spec.hog_prompt_chars,
                                              spec.hog_max_tokens, settle_s)
        evidence: dict[str, Any] = {"method": "hog", "streams_started": spec.hog_streams, "streams_holding": holding,
                                    "settled_in_s": round(time.monotonic() - started, 3)}
        if holding < spec.hog_streams:
            evidence["note"] = (f"{holding} of {spec.hog_streams} hog streams had their first token within "
                                f"{settle_s:g}s; the others are queued or refused by the engine")
        if self.ctx.target.admin_url:
            async with AdminClient(self.ctx.target.admin_url, self.ctx.target.admin_token) as admin:
                evidence["engine"] = _pick(await admin.state())
        return evidence

    async def revert(self) -> dict[str, Any]:
        return {"method": "hog", "streams_stopped": await self.background.stop(self.name)}


def _pick(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: state[k] for k in _STATE_KEYS if k in state}


@register
@dataclass(frozen=True, kw_only=True)
class KvPrefixFlush(Fault):
    """Empty the builtin engine's prefix cache, once at inject or again every ``every``."""

    kind = "kv.prefix_flush"
    summary = "empty the builtin engine's prefix cache (vLLM's /reset_prefix_cache): shared prefixes are recomputed"
    schema = Schema(
        params=(
            Param("every", "duration", min=0.01,
                  doc="flush again at this interval while the fault is in force; unset: once, at inject"),
        ),
    )

    every: float | None

    def problems(self, experiment: Experiment) -> list[tuple[str, str]]:
        target = getattr(experiment, "target", None)
        kind = getattr(target, "kind", None)
        if kind == "vllm":
            return [("", "kv.prefix_flush acts on the builtin engine's prefix cache through its admin API; vLLM's "
                         "own cache is flushed by its POST /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1), not by this "
                         "fault")]
        if kind == "builtin" and not getattr(target, "prefix_caching", True):
            return [("", "target.prefix_caching is false: there is no prefix cache to flush; set it true (the "
                         "default)")]
        return []

    def activate(self, ctx: RunContext) -> Injection:
        return _Flush(self, ctx, require_admin(self.kind, ctx, "kv.pressure (which evicts cached blocks as it "
                                                               "reserves them)"))

    def describe(self, scene: Scene) -> FaultAccount:
        admin = scene.target.admin_url
        when = f"every {self.every:g}s while in force" if self.every else "once, when the phase starts"
        return FaultAccount(
            changes=(f"empties the builtin stack's prefix cache through its admin API at {admin or '(none)'}, {when}: "
                     "free cached blocks are evicted, held ones serve no further hit"),
            undo="nothing to undo (a flush cannot be undone): the cache refills as requests recompute their prefixes",
            refused=None if admin else describe_no_admin(self.kind, scene, "kv.pressure"),
        )

    @classmethod
    def rollback(cls, undo: Mapping[str, Any]) -> dict[str, Any]:
        return {"skipped": "a prefix-cache flush cannot be undone; the cache refills by itself"}


class _Flush(Injection):
    """One flush at inject, then one every ``every`` seconds until revert."""

    def __init__(self, fault: KvPrefixFlush, ctx: RunContext, admin_url: str) -> None:
        super().__init__(fault, ctx)
        self.spec = fault
        self.admin_url = admin_url
        self._repeat: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.flushes = 0
        self.evicted = 0  # free cached blocks evicted, over every flush

    def plan(self) -> dict[str, Any]:
        return {"admin_url": self.admin_url, "note": "a flush cannot be undone; nothing to roll back"}

    async def _flush(self, admin: AdminClient) -> dict[str, int]:
        result = await admin.reset_prefix_cache()
        self.flushes += 1
        self.evicted += result["evicted"]
        return result

    async def inject(self) -> dict[str, Any]:
        async with AdminClient(self.admin_url, self.ctx.target.admin_token) as admin:
            before = await admin.state()
            if before.get("prefix_caching") is False:
                raise FaultUnsupported("kv.prefix_flush: the builtin stack runs without prefix caching "
                                       "(--no-prefix-caching), so there is no cache to flush")
            result = await self._flush(admin)
            after = await admin.state()
        evidence: dict[str, Any] = {"evicted": result["evicted"], "forgotten_held": result["forgotten_held"],
                                    "before": _pick_cache(before), "after": _pick_cache(after)}
        if self.spec.every:
            self._stop = asyncio.Event()
            self._repeat = asyncio.create_task(self._again(self.spec.every))
            evidence["every_s"] = self.spec.every
        return evidence

    async def _again(self, every: float) -> None:
        async with AdminClient(self.admin_url, self.ctx.target.admin_token) as admin:
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), every)
                if not self._stop.is_set():
                    await self._flush(admin)

    async def revert(self) -> dict[str, Any]:
        repeat, self._repeat = self._repeat, None
        if repeat is not None:
            self._stop.set()  # between calls, not mid-call: the tally stays exact
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(repeat, TOPUP_STOP_TIMEOUT_S)
        return {"flushes": self.flushes, "evicted_total": self.evicted,
                "note": "nothing undone: a flush cannot be; the cache refills as requests recompute their prefixes"}


def _pick_cache(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k: state[k] for k in _CACHE_KEYS if k in state}
