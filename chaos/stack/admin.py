"""The builtin stack's admin API (``/admin/...``): live requests, engine state, hook faults, KV reservation,
prefix-cache reset (also at vLLM's path, ``POST /reset_prefix_cache``, behind the same token).

Every route needs ``Authorization: Bearer <token>`` with the stack's admin token, whoever asks:
the peer address proves nothing (a same-host TCP proxy, such as the Toxiproxy proxy a run creates
on ``0.0.0.0``, makes every remote client look local). The token reaches the stack by environment
(``STREAMCHAOS_ADMIN_TOKEN``) or a 0600 file, never by command line (``chaos.stack.serve``).

One route is open: ``GET /admin/proof?nonce=N`` answers ``HMAC-SHA256(token, "streamchaos-admin:" + N)``,
so a client holding a token can check that a server holds the same one before it sends it
(``chaos.admin.client.recognise``). A proof reveals nothing about the token and is never accepted
in its place.

Changes made here (hook faults, the KV reservation) are leases (``chaos.stack.leases``): they end by
themselves ``ttl`` seconds after they were set or last renewed. Bodies are read with a cap checked
against Content-Length first, parsed within JSON budgets, and a bad one gets a 400 error object.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaos.admin.client import proof_of

from . import protocol
from .bodies import BodyTooLarge, JsonRefused, loads_bounded, read_capped
from .hooks import HookSpecInvalid, parse_spec
from .leases import parse_ttl
from .runtime import Stack, stack_of

__all__ = ["KV_LEASE", "MAX_ADMIN_BODY", "admin_routes", "state_of"]

Handler = Callable[[Request], Awaitable[Response]]

MAX_ADMIN_BODY = 64 * 1024  # a hook spec or a reserve call is under 200 bytes
KV_LEASE = "kv:reserve"
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def _bad(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, "invalid_request_error", param, status), status_code=status)


def _guard(handler: Handler) -> Handler:
    """Only ``Authorization: Bearer <token>`` with this stack's admin token passes, from any address."""

    async def guarded(request: Request) -> Response:
        token = stack_of(request).admin_token
        given = request.headers.get("authorization", "")
        if token is None:
            return _bad("this stack has no admin token, so its admin API is closed; start it with "
                        "STREAMCHAOS_ADMIN_TOKEN or --admin-token-file", status=403)
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _bad("the admin API needs the stack's admin token as 'Authorization: Bearer <token>' "
                        "(STREAMCHAOS_ADMIN_TOKEN or the file named by --admin-token-file)", status=403)
        return await handler(request)

    return guarded


async def _json_body(request: Request) -> Any:
    """The body as JSON (None when empty); ``ValueError`` with the reason when it is too large or bad."""
    try:
        body = await read_capped(request, MAX_ADMIN_BODY)
    except BodyTooLarge:
        raise ValueError(f"admin request body is larger than {MAX_ADMIN_BODY // 1024} KiB") from None
    if not body.strip():
        return None
    try:
        return loads_bounded(body)
    except JsonRefused as exc:
        where = f" at {exc.path}" if exc.path else ""
        raise ValueError(f"admin request body refused{where}: {exc.message}") from None


async def _proof(request: Request) -> Response:
    nonce = request.query_params.get("nonce", "")
    token = stack_of(request).admin_token
    if not _NONCE.fullmatch(nonce):
        return _bad("send ?nonce= with 16 to 128 characters of [A-Za-z0-9_-]", param="nonce")
    if token is None:
        return _bad("this stack has no admin token", status=404)
    return JSONResponse({"server": "streamchaos", "proof": proof_of(token, nonce)})


async def _requests(request: Request) -> Response:
    stack = stack_of(request)
    live = stack.engine.live_requests()
    for item in live:
        gen = stack.live.get(item["id"])
        item["server"] = gen is not None  # False: the engine holds a request the server forgot (a leak)
    return JSONResponse({"requests": live})


def state_of(stack: Stack) -> dict[str, Any]:
    stats = dataclasses.asdict(stack.engine.stats())
    stats["leaked_request_ids"] = list(stats["leaked_request_ids"])
    for name in ("queue_time", "prefill_time"):  # histograms: /metrics has them, by bucket
        stats.pop(name, None)
    stats["kv_blocks_held"] = stats["kv_blocks_used"] - stats["kv_blocks_reserved"]
    stats["server_live_requests"] = len(stack.live)
    stats["engine_paused"] = bool(getattr(stack.engine, "paused", False))
    stats["faults"] = sorted(stack.hooks.describe())
    stats["leases"] = stack.leases.describe()
    stats["expired_leases"] = list(stack.leases.expired)
    stats["connections"] = stack.connections.census()  # TCP_NODELAY read back from the accepted sockets
    return stats


async def _state(request: Request) -> Response:
    return JSONResponse(state_of(stack_of(request)))


async def _faults(request: Request) -> Response:
    return JSONResponse({"faults": stack_of(request).hooks.describe()})


def _fault_lease(name: str) -> str:
    return f"fault:{name}"


async def _put_fault(request: Request) -> Response:
    name = request.path_params["name"]
    try:
        spec = parse_spec(await _json_body(request))
    except (ValueError, HookSpecInvalid) as exc:
        return _bad(f"fault {name!r}: {exc}")
    stack = stack_of(request)
    installed = stack.hooks.install(name, spec)
    stack.leases.grant(_fault_lease(name), spec.ttl, lambda: stack.hooks.remove(name))
    return JSONResponse({"name": name, **installed})


async def _renew_fault(request: Request) -> Response:
    name = request.path_params["name"]
    stack = stack_of(request)
    renewed = stack.hooks.renew(name)
    if renewed is None or stack.leases.renew(_fault_lease(name)) is None:
        return _bad(f"no hook fault {name!r} is installed (it was removed, or its lease expired)", status=404)
    return JSONResponse({"name": name, **renewed})


async def _delete_fault(request: Request) -> Response:
    name = request.path_params["name"]
    stack = stack_of(request)
    stack.leases.drop(_fault_lease(name))
    removed = stack.hooks.remove(name)
    return JSONResponse({"name": name, "removed": removed})


async def _clear_faults(request: Request) -> Response:
    stack = stack_of(request)
    for name in stack.hooks.describe():
        stack.leases.drop(_fault_lease(name))
    return JSONResponse({"removed": stack.hooks.clear()})


async def _reserve(request: Request) -> Response:
    try:
        body = await _json_body(request)
        ttl = parse_ttl(body.get("ttl") if isinstance(body, dict) else None)
    except ValueError as exc:
        return _bad(str(exc))
    blocks = body.get("blocks") if isinstance(body, dict) else None
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 0:
        return _bad(f'send {{"blocks": n, "ttl": seconds}} with an integer n >= 0, found {json.dumps(body)[:80]}',
                    param="blocks")
    stack = stack_of(request)
    reserved = stack.engine.reserve_blocks(blocks)
    total = stack.engine.stats().kv_blocks_reserved
    lease = None
    if total:  # every reserve call (re)starts the one lease on the whole reservation
        lease = stack.leases.grant(KV_LEASE, ttl, stack.engine.release_reserved_blocks)
    return JSONResponse({"reserved": reserved, "reserved_total": total, "lease": lease})


async def _renew_reserve(request: Request) -> Response:
    try:
        body = await _json_body(request)
        ttl = parse_ttl(body.get("ttl") if isinstance(body, dict) else None, default=0.0) or None
    except ValueError as exc:
        return _bad(str(exc))
    stack = stack_of(request)
    lease = stack.leases.renew(KV_LEASE, ttl)
    if lease is None:
        return _bad("no KV blocks are reserved (they were released, or the lease expired)", status=404)
    return JSONResponse({"reserved_total": stack.engine.stats().kv_blocks_reserved, "lease": lease})


async def _release(request: Request) -> Response:
    stack = stack_of(request)
    stack.leases.drop(KV_LEASE)
    return JSONResponse({"released": stack.engine.release_reserved_blocks()})


async def _reset_prefix_cache(request: Request) -> Response:
    """Empty the prefix cache (vLLM's ``POST /reset_prefix_cache``): free cached blocks are evicted, held
    ones stay with their requests but serve no further hit. Nothing to undo: the cache refills as
    requests compute their prefixes again."""
    evicted, forgotten = stack_of(request).engine.reset_prefix_cache()
    return JSONResponse({"evicted": evicted, "forgotten_held": forgotten})


def admin_routes() -> list[Route]:
    return [
        Route("/admin/requests", _guard(_requests), methods=["GET"]),
        Route("/admin/state", _guard(_state), methods=["GET"]),
        Route("/admin/faults", _guard(_faults), methods=["GET"]),
        Route("/admin/faults", _guard(_clear_faults), methods=["DELETE"]),
        Route("/admin/faults/{name}", _guard(_put_fault), methods=["PUT"]),
        Route("/admin/faults/{name}", _guard(_delete_fault), methods=["DELETE"]),
        Route("/admin/faults/{name}/renew", _guard(_renew_fault), methods=["POST"]),
        Route("/admin/kv/reserve", _guard(_reserve), methods=["POST"]),
        Route("/admin/kv/reserve", _guard(_release), methods=["DELETE"]),
        Route("/admin/kv/reserve/renew", _guard(_renew_reserve), methods=["POST"]),
        Route("/admin/kv/reset_prefix_cache", _guard(_reset_prefix_cache), methods=["POST"]),
        Route("/reset_prefix_cache", _guard(_reset_prefix_cache), methods=["POST"]),  # vLLM's path, token-guarded
        Route("/admin/proof", _proof, methods=["GET"]),
    ]
