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

Nothing here knows the engine: what the server does with the exception (its error path, a cut
stream, an aborted engine request) is the behaviour under test. One thing is ours: a request that a
``first_byte`` or ``request_body`` fault hit is answered with a 500 carrying ``Connection: close``
(or, when the handler answers the timeout itself, its answer gets that header), and the server
closes the connection after it; the exception ends there, once the handler has unwound. A
framework's own 500 went out keep-alive and the connection closed a moment later, after its
traceback was logged (15-30 ms inside vLLM): a client that reused the connection in that moment
lost its next request too, so every fired fault cost two errors.

The cost while a fault is armed is paid per request, not per chunk: whether a ``mid_stream`` fault
has chosen a request is decided once, at its first body chunk (``Hooks.selects``); from then on a
request no fault can hit is sent straight through (``benchmarks/bench_middleware.py``).

Only standard-library imports and ours, so the module loads in another project's virtualenv (vLLM's).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .hooks import Due, Hooks

__all__ = ["GENERATION_PATHS", "FaultMiddleware", "error_event", "fault_response"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


class _Aborted(Exception):
    """Raised into a handler that writes again after a mid-stream fault ended or cut its stream."""


def _error_object(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": 500}}).encode()


def error_event(message: str) -> bytes:
    """An SSE event carrying an OpenAI-style error object (what vLLM streams when a request fails)."""
    return b"data: " + _error_object(message) + b"\n\n"


def fault_response(message: str) -> tuple[Message, Message]:
    """The ASGI messages of the 500 that answers a request a fault hit before its headers: an OpenAI
    error object naming the fault, and ``Connection: close``, so the server closes the connection
    after it and no client sends its next request into a connection that is about to go."""
    body = _error_object(message)
    start: Message = {"type": "http.response.start", "status": 500, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]}
    return start, {"type": "http.response.body", "body": body, "more_body": False}


def _closing(message: Message) -> Message:
    """A response start with ``Connection: close`` (replacing a ``Connection`` header it had)."""
    headers = [(k, v) for k, v in message.get("headers", ()) if bytes(k).lower() != b"connection"]
    return {**message, "headers": [*headers, (b"connection", b"close")]}


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
        except Exception:
            if request.early is None or request.started:
                raise  # not ours, or the handler's own answer to the timeout is under way: the server's
            # the injected timeout (or what the handler made of it), the handler unwound: answered
            # here, so the 500 closes the connection; not passed on, where the server would log a
            # traceback a fault (inside vLLM 15-30 ms of its event loop, other streams' latency)
            await request.answer_early()
        finally:
            self.hooks.end(request.id)
            request.uncancel()
        await request.answer_early()  # the handler swallowed the timeout and answered nothing
        if request.fired is not None and not request.fired.abort:
            # the boundary of the injected timeout, as ``asyncio.timeout`` turns its cancellation
            # into TimeoutError: the server's own error path cuts the started response
            raise TimeoutError(request.fired.message)


_UNDECIDED = -1  # _Request.threshold before its first body chunk


class _Request:
    """One request's wrapped ``receive``/``send``, the SSE events it has sent, the fault that hit it.

    ``send`` is a plain function returning the awaitable, not a coroutine of its own: a chunk no fault
    fires on costs no extra coroutine, and once the request is known to be out of every fault's reach
    (``plain``) one attribute test, no counting.
    """

    __slots__ = ("hooks", "id", "_receive", "_send", "events", "fired", "early", "started", "threshold",
                 "plain", "body_read", "_cancelled")

    def __init__(self, hooks: Hooks, request_id: str, receive: Receive, send: Send) -> None:
        self.hooks = hooks
        self.id = request_id
        self._receive = receive
        self._send = send
        self.events = 0
        self.fired: Due | None = None  # the mid_stream fault that cancelled the handler
        self.early: Due | None = None  # the first_byte or request_body fault that hit it before its headers
        self.started = False  # a response start went out
        # mid_stream: the fewest events before a fault that chose this request may fire; None: no fault
        # can hit it (decided at its first body chunk)
        self.threshold: int | None = _UNDECIDED
        self.plain = False  # nothing can hit this request any more: chunks go straight through
        self.body_read = False  # the request body is in: receive has nothing left to check
        self._cancelled: list[asyncio.Task[Any]] = []

    def receive(self) -> Awaitable[Message]:
        if self.body_read:
            return self._receive()  # what comes now is http.disconnect: nothing to check
        return self._checked_receive()

    async def _checked_receive(self) -> Message:
        message = await self._receive()
        if message.get("type") == "http.request":
            self.body_read = not message.get("more_body", False)
            due = self.hooks.due(self.id, "request_body")
            if due is not None:
                self.early = due
                raise TimeoutError(due.message)
        return message

    def send(self, message: Message) -> Awaitable[None]:
        """The server's ``send`` of ``message``, checked; what a fault raises is raised here, as the
        handler's ``await send(...)`` would see it from a coroutine."""
        if self.plain:
            return self._send(message)
        if self.fired is not None:  # the stream was ended or cut; the handler's late writes go nowhere
            raise _Aborted()
        kind = message.get("type")
        if kind == "http.response.start":
            return self._send(self._start(message))
        if kind == "http.response.body":
            due = self._body_due(message)
            if due is not None:
                return self._fire(due)
        return self._send(message)

    def _start(self, message: Message) -> Message:
        """The response start to send, or ``TimeoutError`` when a first_byte fault hits the request."""
        if self.early is None:
            due = self.hooks.due(self.id, "first_byte")
            if due is not None:  # nothing has been sent, and the handler has not started generating
                self.early = due
                raise TimeoutError(due.message)
        self.started = True
        # the handler answering the injected timeout itself: its answer closes the connection too
        return message if self.early is None else _closing(message)

    def _body_due(self, message: Message) -> Due | None:
        """The mid_stream fault that fires before this chunk, else None (the chunk's events counted)."""
        threshold = self.threshold
        if threshold == _UNDECIDED:
            threshold = self.threshold = self.hooks.selects(self.id, "mid_stream")
            if threshold is None:
                self.plain = True  # no fault chose it, and none installed later can
                return None
        if threshold is None:
            return None
        if self.events >= threshold:
            due = self.hooks.due(self.id, "mid_stream", self.events)
            if due is not None:
                return due
        body = message.get("body", b"")
        self.events += (body if type(body) is bytes else bytes(body)).count(b"\n\n")
        return None

    async def answer_early(self) -> None:
        """Answer a request that a first_byte or request_body fault hit, when nothing else did: a 500
        with ``Connection: close`` (``fault_response``)."""
        if self.early is None or self.started:
            return
        self.started = True
        start, body = fault_response(self.early.message)
        with contextlib.suppress(OSError):  # the client left meanwhile: nobody to answer
            await self._send(start)
            await self._send(body)

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
