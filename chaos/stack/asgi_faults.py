"""Hook faults at the ASGI boundary of any server: before the first byte, mid-stream, on the request body.

``FaultMiddleware`` wraps an ASGI app (the builtin server, or vLLM's FastAPI app through
``chaos.stack.vllm_middleware``) and consults ``Hooks`` at three points of each generation request
(``POST /v1/completions``, ``/v1/chat/completions``):

    request_body  while the handler reads the body: ``receive`` raises ``asyncio.TimeoutError`` inside
                  the handler, as a body read that timed out would
    first_byte    when the handler starts its response: ``send`` raises before the headers go out
    mid_stream    before a body chunk, once ``after_events`` SSE events have gone out: the handler
                  is cancelled at its next await, as ``asyncio.timeout`` would, and the middleware
                  re-raises ``asyncio.TimeoutError`` (the server's error path cuts the started stream
                  without a terminal chunk); an ``abort`` fault first ends the stream with an OpenAI
                  error event and ``[DONE]`` (what vLLM streams when a request fails mid-generation).
                  Either way the handler unwinds, so an engine aborts the request

Nothing here knows the engine: what the server does with the exception (a 500, a cut stream, an
aborted engine request) is the behaviour under test. Only standard-library imports and ours, so the
module loads in another project's virtualenv (vLLM's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .hooks import Due, Hooks

__all__ = ["GENERATION_PATHS", "FaultMiddleware", "error_event"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


class _Aborted(Exception):
    """Raised into a handler that writes again after a mid-stream fault ended or cut its stream."""


def error_event(message: str) -> bytes:
    """An SSE event carrying an OpenAI-style error object (what vLLM streams when a request fails)."""
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": 500}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class FaultMiddleware:
    """ASGI middleware that applies the ``Hooks``' ASGI-point faults to generation requests."""

    def __init__(self, app: ASGIApp, hooks: Hooks, paths: frozenset[str] = GENERATION_PATHS) -> None:
        self.app = app
        self.hooks = hooks
        self.paths = paths
        self._ids = itertools.count()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in self.paths
                or not self.hooks.asgi_armed()):
            # disarmed, a request costs this one check: no wrapped receive/send, no per-event work
            await self.app(scope, receive, send)
            return
        request = _Request(self.hooks, f"asgi-{next(self._ids)}", receive, send)
        self.hooks.begin(request.id)
        try:
            await self.app(scope, request.receive, request.send)
            if request.fired is not None:  # the handler returned before our cancellation reached it
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
        except (_Aborted, asyncio.CancelledError):
            if request.fired is None:
                raise  # not ours: the server is shutting down, or the client went away
        finally:
            self.hooks.end(request.id)
            request.uncancel()
        if request.fired is not None and not request.fired.abort:
            # the boundary of the injected timeout, as ``asyncio.timeout`` turns its cancellation
            # into TimeoutError: the server's own error path cuts the started response
            raise TimeoutError(request.fired.message)


class _Request:
    """One request's wrapped ``receive``/``send``, the SSE events it has sent, the fault that hit it."""

    def __init__(self, hooks: Hooks, request_id: str, receive: Receive, send: Send) -> None:
        self.hooks = hooks
        self.id = request_id
        self._receive = receive
        self._send = send
        self.events = 0
        self.fired: Due | None = None  # the mid_stream fault that cancelled the handler
        self._cancelled: list[asyncio.Task[Any]] = []

    async def receive(self) -> Message:
        message = await self._receive()
        if message.get("type") == "http.request":
            due = self.hooks.due(self.id, "request_body")
            if due is not None:
                raise TimeoutError(due.message)
        return message

    async def send(self, message: Message) -> None:
        if self.fired is not None:  # the stream was ended or cut; the handler's late writes go nowhere
            raise _Aborted()
        kind = message.get("type")
        if kind == "http.response.start":
            due = self.hooks.due(self.id, "first_byte")
            if due is not None:  # nothing has been sent, and the handler has not started generating
                raise TimeoutError(due.message)
        elif kind == "http.response.body":
            due = self.hooks.due(self.id, "mid_stream", self.events)
            if due is not None:
                await self._fire(due)
                return
            self.events += bytes(message.get("body", b"")).count(b"\n\n")
        await self._send(message)

    async def _fire(self, due: Due) -> None:
        """Unwind the handler from inside, as a timeout in its own code would.

        Raising from ``send`` would leave a streaming handler's generator suspended at its ``yield``
        until the garbage collector finds it (Starlette never closes it), and its engine request
        would run on. A cancellation reaches the generator at its next await, inside the engine
        call, which is where ``asyncio.timeout`` delivers a timeout, and where a client disconnect
        aborts the engine's request.
        """
        self.fired = due
        if due.abort:  # what vLLM streams when a request fails mid-generation: an error event, [DONE]
            body = error_event(due.message) + b"data: [DONE]\n\n"
            await self._send({"type": "http.response.body", "body": body, "more_body": False})
        task = asyncio.current_task()
        if task is not None:
            task.cancel()
            self._cancelled.append(task)

    def uncancel(self) -> None:
        for task in self._cancelled:
            task.uncancel()
        self._cancelled.clear()
