"""The builtin stack's admin API (``/admin/...``): live requests, engine state, hook faults, KV reservation.

Served to loopback clients, or to any client presenting the configured bearer token
(``--admin-token`` / ``STREAMCHAOS_ADMIN_TOKEN``); everyone else gets 403. Bodies are validated
and a bad one gets a 400 error object, never a 500.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import protocol
from .hooks import HookSpecInvalid, parse_spec
from .runtime import Stack, stack_of

__all__ = ["admin_routes", "is_loopback"]

Handler = Callable[[Request], Awaitable[Response]]


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bad(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    return JSONResponse(protocol.error_body(message, "invalid_request_error", param, status), status_code=status)


def _guard(handler: Handler) -> Handler:
    """Loopback clients pass; others need ``Authorization: Bearer <token>`` matching the configured one."""

    async def guarded(request: Request) -> Response:
        token = stack_of(request).admin_token
        host = request.client.host if request.client else None
        given = request.headers.get("authorization", "")
        allowed = is_loopback(host) or (
            token is not None and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
        )
        if not allowed:
            why = "configure --admin-token and send it as 'Authorization: Bearer <token>'" if token is None else "send the admin token as 'Authorization: Bearer <token>'"
            return _bad(f"the admin API is served to loopback clients only; {why}", status=403)
        return await handler(request)

    return guarded


async def _json_body(request: Request) -> Any:
    body = await request.body()
    if len(body) > 64 * 1024:
        raise ValueError("admin request body is larger than 64 KiB")
    try:
        return json.loads(body) if body else None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"admin request body is not valid JSON: {exc}") from None


async def _requests(request: Request) -> Response:
    from .server import stack_of

    stack = stack_of(request)
    live = stack.engine.live_requests()
    for item in live:
        gen = stack.live.get(item["id"])
        item["server"] = gen is not None  # False: the engine holds a request the server forgot (a leak)
    return JSONResponse({"requests": live})


def state_of(stack: Stack) -> dict[str, Any]:
    stats = dataclasses.asdict(stack.engine.stats())
    stats["leaked_request_ids"] = list(stats["leaked_request_ids"])
    stats["kv_blocks_held"] = stats["kv_blocks_used"] - stats["kv_blocks_reserved"]
    stats["server_live_requests"] = len(stack.live)
    stats["engine_paused"] = bool(getattr(stack.engine, "paused", False))
    stats["faults"] = sorted(stack.hooks.describe())
    stats["connections"] = stack.connections.census()  # TCP_NODELAY read back from the accepted sockets
    return stats


async def _state(request: Request) -> Response:
    from .server import stack_of

    return JSONResponse(state_of(stack_of(request)))


async def _faults(request: Request) -> Response:
    from .server import stack_of

    return JSONResponse({"faults": stack_of(request).hooks.describe()})


async def _put_fault(request: Request) -> Response:
    from .server import stack_of

    name = request.path_params["name"]
    try:
        spec = parse_spec(await _json_body(request))
    except (ValueError, HookSpecInvalid) as exc:
        return _bad(f"fault {name!r}: {exc}")
    installed = stack_of(request).hooks.install(name, spec)
    return JSONResponse({"name": name, **installed})


async def _delete_fault(request: Request) -> Response:
    from .server import stack_of

    name = request.path_params["name"]
    removed = stack_of(request).hooks.remove(name)
    return JSONResponse({"name": name, "removed": removed})


async def _clear_faults(request: Request) -> Response:
    from .server import stack_of

    return JSONResponse({"removed": stack_of(request).hooks.clear()})


async def _reserve(request: Request) -> Response:
    from .server import stack_of

    try:
        body = await _json_body(request)
    except ValueError as exc:
        return _bad(str(exc))
    blocks = body.get("blocks") if isinstance(body, dict) else None
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 0:
        return _bad(f'send {{"blocks": n}} with an integer n >= 0, found {json.dumps(body)[:80]}', param="blocks")
    stack = stack_of(request)
    reserved = stack.engine.reserve_blocks(blocks)
    return JSONResponse({"reserved": reserved, "reserved_total": stack.engine.stats().kv_blocks_reserved})


async def _release(request: Request) -> Response:
    from .server import stack_of

    return JSONResponse({"released": stack_of(request).engine.release_reserved_blocks()})


def admin_routes() -> list[Route]:
    return [
        Route("/admin/requests", _guard(_requests), methods=["GET"]),
        Route("/admin/state", _guard(_state), methods=["GET"]),
        Route("/admin/faults", _guard(_faults), methods=["GET"]),
        Route("/admin/faults", _guard(_clear_faults), methods=["DELETE"]),
        Route("/admin/faults/{name}", _guard(_put_fault), methods=["PUT"]),
        Route("/admin/faults/{name}", _guard(_delete_fault), methods=["DELETE"]),
        Route("/admin/kv/reserve", _guard(_reserve), methods=["POST"]),
        Route("/admin/kv/reserve", _guard(_release), methods=["DELETE"]),
    ]
