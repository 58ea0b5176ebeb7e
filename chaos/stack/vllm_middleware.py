"""streamchaos inside a real engine's server:
``vllm serve ... --middleware chaos.stack.vllm_middleware.StreamChaosMiddleware``.

vLLM adds an ASGI middleware class named by ``--middleware`` to its FastAPI app (``app.add_middleware``),
so this code runs on vLLM's own event loop, in front of its own handlers. It brings the builtin
stack's admin protocol with it (``chaos.stack.admin``): every route but ``/admin/proof`` needs
``Authorization: Bearer <token>`` with the token from ``STREAMCHAOS_ADMIN_TOKEN`` (environment only,
never the command line); hook faults are leases that end by themselves unless renewed.

What it can do inside vLLM: timeouts and aborts at the ASGI points (``chaos.stack.asgi_faults``:
``first_byte``, ``mid_stream``, ``request_body``; a request hit before its headers is answered 500
with ``Connection: close``, not left to vLLM's keep-alive 500 and the close after its traceback)
and event-loop stalls (CPU work on vLLM's API-server
loop, as a slow tokenizer holding the GIL would). What it cannot: the builtin engine's own points
(``engine_step``, ``detokenize``, ``send``), engine-thread stalls, Nagle on accepted sockets, KV
reservations; those are refused with the reason (``kv.pressure`` drives vLLM's cache with streams).

Imports: the standard library, Starlette (vLLM's FastAPI brings it) and the few stdlib-only modules
of ``chaos.stack`` below; nothing else of streamchaos, so it loads in vLLM's own virtualenv.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from chaos.admin.client import proof_of

from .asgi_faults import ASGIApp, FaultMiddleware, Receive, Scope, Send
from .bodies import BodyTooLarge, JsonRefused, loads_bounded, read_capped
from .hooks import Hooks, HookSpecInvalid, parse_spec
from .leases import Leases

__all__ = ["ADMIN_TOKEN_ENV", "SERVER_NAME", "StreamChaosMiddleware"]

log = logging.getLogger("streamchaos.middleware")

ADMIN_TOKEN_ENV = "STREAMCHAOS_ADMIN_TOKEN"
SERVER_NAME = "streamchaos-middleware"
MAX_ADMIN_BODY = 64 * 1024
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")
_FAULT = re.compile(r"/admin/faults/([^/]{1,200})(/renew)?")


def _error(message: str, status: int) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status)


class StreamChaosMiddleware:
    """The admin API under ``/admin/`` and the ASGI fault points, around a real engine's app."""

    def __init__(self, app: ASGIApp) -> None:
        self.token = os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None
        self.hooks = Hooks(None)  # no engine of ours: only the ASGI points and event-loop stalls
        self.leases = Leases()
        self.faulted = FaultMiddleware(app, self.hooks)
        self.started = time.time()
        if self.token is None:
            log.warning("%s is not set: the streamchaos admin API is closed, no fault can be armed", ADMIN_TOKEN_ENV)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith("/admin/"):
            await self.faulted(scope, receive, send)
            return
        request = Request(scope, receive)
        response = await self._admin(request, path)
        await response(scope, receive, send)

    async def _admin(self, request: Request, path: str) -> Response:
        if path == "/admin/proof":
            return self._proof(request)
        if self.token is None:
            return _error("the streamchaos middleware has no admin token, so its admin API is closed; start the "
                          f"server with {ADMIN_TOKEN_ENV}", 403)
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            return _error("the admin API needs the middleware's admin token as 'Authorization: Bearer <token>' "
                          f"({ADMIN_TOKEN_ENV})", 403)
        try:
            return await self._route(request, path)
        except (ValueError, HookSpecInvalid) as exc:
            return _error(str(exc), 400)

    def _proof(self, request: Request) -> Response:
        nonce = request.query_params.get("nonce", "")
        if not _NONCE.fullmatch(nonce):
            return _error("send ?nonce= with 16 to 128 characters of [A-Za-z0-9_-]", 400)
        if self.token is None:
            return _error("this server has no admin token", 404)
        return JSONResponse({"server": "streamchaos", "proof": proof_of(self.token, nonce)})

    async def _route(self, request: Request, path: str) -> Response:
        method = request.method
        if path == "/admin/state" and method == "GET":
            return JSONResponse(self.state())
        if path == "/admin/faults":
            if method == "GET":
                return JSONResponse({"faults": self.hooks.describe()})
            if method == "DELETE":
                for name in self.hooks.describe():
                    self.leases.drop(f"fault:{name}")
                return JSONResponse({"removed": self.hooks.clear()})
        if path.startswith("/admin/kv/"):
            return _error("KV reservations are a builtin-stack feature; against vLLM kv.pressure fills the real "
                          "cache with hog streams (mode: streams)", 404)
        match = _FAULT.fullmatch(path)
        if match is not None:
            return await self._fault(request, match.group(1), renew=bool(match.group(2)))
        return _error(f"no admin route {method} {path}", 404)

    async def _fault(self, request: Request, name: str, *, renew: bool) -> Response:
        lease = f"fault:{name}"
        if renew and request.method == "POST":
            renewed = self.hooks.renew(name)
            if renewed is None or self.leases.renew(lease) is None:
                return _error(f"no hook fault {name!r} is installed (it was removed, or its lease expired)", 404)
            return JSONResponse({"name": name, **renewed})
        if renew:
            return _error(f"use POST for {request.url.path}", 405)
        if request.method == "PUT":
            spec = parse_spec(await self._json(request))
            installed = self.hooks.install(name, spec)
            self.leases.grant(lease, spec.ttl, lambda: self.hooks.remove(name))
            return JSONResponse({"name": name, **installed})
        if request.method == "DELETE":
            self.leases.drop(lease)
            return JSONResponse({"name": name, "removed": self.hooks.remove(name)})
        return _error(f"use PUT or DELETE for {request.url.path}", 405)

    @staticmethod
    async def _json(request: Request) -> Any:
        try:
            body = await read_capped(request, MAX_ADMIN_BODY)
        except BodyTooLarge:
            raise ValueError(f"admin request body is larger than {MAX_ADMIN_BODY // 1024} KiB") from None
        try:
            return loads_bounded(body) if body.strip() else None
        except JsonRefused as exc:
            raise ValueError(f"admin request body refused: {exc.message}") from None

    def state(self) -> dict[str, Any]:
        """What the runner reads back: the faults in force and their leases (the engine's own state
        is vLLM's ``/metrics``)."""
        return {
            "server": SERVER_NAME,
            "pid": os.getpid(),
            "uptime_s": round(time.time() - self.started, 3),
            "faults": sorted(self.hooks.describe()),
            "leases": self.leases.describe(),
            "expired_leases": list(self.leases.expired),
        }
