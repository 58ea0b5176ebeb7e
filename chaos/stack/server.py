"""The builtin OpenAI-compatible ASGI server (Starlette): routes, SSE streaming, disconnects, errors.

Disconnects are watched explicitly: while a response waits for tokens (queued, in prefill or in
decode) a second task waits on ``receive()`` for ``http.disconnect`` and cancels the writer, which
closes the ``Generation`` and aborts the engine request. Relying on ``send()`` failing would miss a
client that leaves before its first token (reference/llm-serving.md §1.2, ASGI spec 2.4). A failure
after the headers went out becomes an in-band ``data: {"error": ...}`` event, then ``data: [DONE]``
and the end of the body; before that, an OpenAI error object with a 4xx (or 5xx for our own faults).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from importlib.metadata import version
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from chaos.model.request_ids import record_id_of

from . import protocol
from .admin import admin_routes
from .asgi_faults import FaultMiddleware
from .bodies import BodyTooLarge, read_capped
from .engine import Engine, EngineStopped, InvalidRequest, SamplingParams
from .metrics import CONTENT_TYPE
from .protocol import CompletionRequest, RequestInvalid
from .reasoning import ChatDeltas, reasoning_budget, thinking_enabled
from .runtime import Delta, Generation, GenerationFailed, Stack, stack_of
from .tool_calls import parse_tool_request

__all__ = ["build_app", "versions"]

log = logging.getLogger("chaos.stack.server")

_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # ask nginx-style proxies not to buffer the stream
]


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def _error_json(exc: RequestInvalid) -> JSONResponse:
    return JSONResponse(protocol.error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status)


def _failure(exc: BaseException) -> dict[str, Any]:
    """The in-band error object for an exception raised while a response is under way."""
    if isinstance(exc, GenerationFailed):
        return protocol.error_body(exc.message, exc.type, None, exc.code)
    if isinstance(exc, asyncio.TimeoutError):
        return protocol.error_body(str(exc) or "timed out", "TimeoutError", None, 504)
    return protocol.error_body("Internal server error", "InternalServerError", None, 500)


async def _wait_disconnect(receive: Receive) -> None:
    """Return once the client has gone (the request body was already read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _race_disconnect(work: Awaitable[Any], receive: Receive) -> tuple[bool, Any]:
    """Run ``work`` until it ends or the client disconnects; ``(disconnected, result)``."""
    worker = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({worker, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loser = worker if watcher.done() and not worker.done() else watcher
        loser.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loser
    if not worker.done():  # only reachable when we ourselves were cancelled
        raise asyncio.CancelledError
    if worker.cancelled():
        return True, None
    return False, worker.result()


class _EventStream(Response):
    """``text/event-stream`` body of one generation, with in-band errors and disconnect aborts."""

    def __init__(self, gen: Generation, req: CompletionRequest, shaper: ChatDeltas | None = None) -> None:
        self.gen = gen
        self.req = req
        self.shaper = shaper  # chat: which delta field each token goes out in (reasoning, content, a tool call)
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
            await _race_disconnect(self._write(send), receive)
        except (OSError, ClientDisconnect):
            pass  # servers speaking ASGI spec 2.4 report a gone client here; the finally cleans up
        finally:
            self.gen.finalize()

    async def _write(self, send: Send) -> None:
        async with contextlib.aclosing(self._events()) as events:
            async for payload in events:
                await send({"type": "http.response.body", "body": payload, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _events(self) -> AsyncGenerator[bytes, None]:
        gen, req, hooks = self.gen, self.req, self.gen.stack.hooks
        rid, created, model = gen.request_id, gen.created, req.model
        try:
            first = True
            async with contextlib.aclosing(gen.deltas()) as deltas:
                async for delta in deltas:
                    for chunk in self._chunks(delta, first):
                        self._check_send(hooks)
                        yield _sse(chunk)
                    first = False
            if req.include_usage:
                self._check_send(hooks)
                use = self.shaper.usage(gen.usage()) if self.shaper is not None else gen.usage()
                yield _sse(protocol.usage_chunk(rid, created, model, req.chat, use))
        except Exception as exc:
            if not isinstance(exc, (GenerationFailed, asyncio.TimeoutError)):
                log.exception("stream %s failed", rid)
            gen.fail()
            yield _sse(_failure(exc))
        yield _DONE

    def _check_send(self, hooks: Any) -> None:
        hooks.check(self.gen.request_id, "send")

    def _chunks(self, delta: Delta, first: bool) -> list[dict[str, Any]]:
        gen, req = self.gen, self.req
        if not req.chat:
            if not delta.text and delta.finish_reason is None:
                return []
            return [protocol.completion_chunk(gen.request_id, gen.created, req.model, delta.text, delta.finish_reason)]
        out = []
        if first:  # vLLM sends the role with the first engine output, i.e. at the first token
            out.append(protocol.chat_chunk(gen.request_id, gen.created, req.model, {"role": "assistant", "content": ""},
                                           None))
        if self.shaper is not None:  # always, for chat
            shaped = self.shaper.shape(delta.text, gen.completion_tokens, delta.finish_reason)
            out += [protocol.chat_chunk(gen.request_id, gen.created, req.model, body, reason)
                    for body, reason in shaped]
        return out


class _Collected(Response):
    """A non-streaming generation: collected while watching for a disconnect, sent as one JSON body."""

    def __init__(self, gen: Generation, req: CompletionRequest, shaper: ChatDeltas | None = None) -> None:
        self.gen = gen
        self.req = req
        self.shaper = shaper
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            disconnected, response = await _race_disconnect(self._collect(), receive)
            if not disconnected:
                await response(scope, receive, send)
        finally:
            self.gen.finalize()

    async def _collect(self) -> Response:
        gen, req = self.gen, self.req
        texts: list[str] = []
        shaped: list[tuple[dict[str, Any], str | None]] = []
        reason = "stop"
        try:
            async with contextlib.aclosing(gen.deltas()) as deltas:
                async for delta in deltas:
                    reason = delta.finish_reason or reason
                    if self.shaper is not None:
                        shaped += self.shaper.shape(delta.text, gen.completion_tokens, delta.finish_reason)
                    else:
                        texts.append(delta.text)
            gen.stack.hooks.check(gen.request_id, "send")
        except Exception as exc:
            if not isinstance(exc, (GenerationFailed, asyncio.TimeoutError)):
                log.exception("request %s failed", gen.request_id)
            gen.fail()
            body = _failure(exc)
            return JSONResponse(body, status_code=body["error"]["code"])
        if self.shaper is None:  # a completion: every chat request has a shaper
            return JSONResponse(protocol.completion_response(gen.request_id, gen.created, req.model, "".join(texts),
                                                             reason, gen.usage()))
        reason = next((r for _, r in reversed(shaped) if r is not None), reason)
        use = self.shaper.usage(gen.usage())
        body = protocol.chat_response(gen.request_id, gen.created, req.model, "", reason, use)
        body["choices"][0]["message"].update(self.shaper.message(shaped))
        return JSONResponse(body)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes ``limit`` bytes."""
    try:
        return await read_capped(request, limit)
    except BodyTooLarge:
        raise RequestInvalid(
            f"request body is larger than {limit} bytes; send a smaller prompt", status=413, code="request_too_large"
        ) from None


def _generate_endpoint(chat: bool) -> Callable[[Request], Awaitable[Response]]:
    parse = protocol.parse_chat if chat else protocol.parse_completion

    async def endpoint(request: Request) -> Response:
        stack = stack_of(request)
        try:
            if stack.shutting_down:
                raise RequestInvalid("the server is shutting down", status=503, code="shutting_down",
                                     type="ServiceUnavailableError")
            body = await _read_body(request, stack.max_body_bytes)
            data = protocol.parse_body(body)
            req = parse(data, (stack.model_name,))
            tool = parse_tool_request(data) if chat else None
            thinking = thinking_enabled(data) if chat else False
            ids, param = _prompt_ids(stack, req)
            max_tokens = protocol.resolve_max_tokens(req.max_tokens, len(ids), stack.engine.config.max_model_len, param)
            params = SamplingParams(
                max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, seed=req.seed,
                stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos,
            )
            try:
                gen = Generation(stack, "chatcmpl" if chat else "cmpl", ids, params)
            except InvalidRequest as exc:
                raise RequestInvalid(str(exc), param=param, code="invalid_prompt") from None
            except EngineStopped as exc:
                raise RequestInvalid(str(exc), status=503, code="engine_stopped",
                                     type="ServiceUnavailableError") from None
        except RequestInvalid as exc:
            return _error_json(exc)
        except ClientDisconnect:
            return Response(status_code=499)  # nobody is left to read it
        shaper = None
        if chat:
            tokens: tuple[int, int] = request.app.state.reasoning_tokens
            # seeded by the client's request id where it sends one, so a replayed run reasons alike: the load's
            # UUID-shaped id read back to its record id ("0-17"), the run's tag left out (chaos.model.request_ids)
            key = record_id_of(request.headers.get("x-request-id") or "") or gen.request_id
            n = reasoning_budget(tokens, stack.engine.config.seed, key, max_tokens, thinking)
            shaper = ChatDeltas(n, tool, "call_" + gen.request_id.rsplit("-", 1)[-1][:24], report=tokens[1] > 0)
        return _EventStream(gen, req, shaper) if req.stream else _Collected(gen, req, shaper)

    return endpoint


def _prompt_ids(stack: Stack, req: CompletionRequest) -> tuple[list[int], str]:
    tok = stack.tokenizer
    if req.chat:
        return _encode(stack, tok.apply_chat_template(list(req.messages)), "messages"), "messages"
    if isinstance(req.prompt, str):
        if not req.prompt:
            raise RequestInvalid("'prompt' must not be empty", param="prompt", code="invalid_value")
        return _encode(stack, req.prompt, "prompt"), "prompt"
    assert req.prompt is not None
    return list(req.prompt), "prompt"


def _encode(stack: Stack, text: str, param: str) -> list[int]:
    """``text``'s token ids; a text too long for the context by its size alone is refused (400,
    ``context_length_exceeded``) before it is tokenized: tokenization holds the loop (and the GIL)
    for its whole length, 0.7-1.4 s for a 900 KB prompt here."""
    per_token = stack.tokenizer.max_token_bytes
    context = stack.engine.config.max_model_len
    if per_token is not None and len(text) > per_token * (context - 1) // 4:  # bytes >= chars: cheap test first
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > per_token * (context - 1):
            raise RequestInvalid(
                f"this model's maximum context length is {context} tokens, but the prompt is {size} bytes, more "
                f"than {context - 1} tokens of at most {per_token} bytes each can hold; shorten the prompt",
                param=param, code="context_length_exceeded")
    return stack.tokenizer.encode(text)


async def _models(request: Request) -> Response:
    stack = stack_of(request)
    card = {
        "id": stack.model_name, "object": "model", "created": 0, "owned_by": "streamchaos",
        "root": stack.model_name, "max_model_len": stack.engine.config.max_model_len,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def _health(request: Request) -> Response:
    stack = stack_of(request)
    ok = stack.engine.running and not stack.shutting_down
    return JSONResponse(
        {
            "status": "ok" if ok else "unavailable",
            "server": "streamchaos",  # how a runner recognises a builtin stack (then it asks /admin/proof)
            "model": stack.model_name,
            "device": str(stack.engine.device),
            "max_model_len": stack.engine.config.max_model_len,
            **stack.versions,
        },
        status_code=200 if ok else 503,
    )


async def _metrics(request: Request) -> Response:
    return Response(stack_of(request).metrics.render(), media_type=CONTENT_TYPE)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "NotFoundError", 405: "MethodNotAllowedError"}.get(exc.status_code, "invalid_request_error")
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return JSONResponse(protocol.error_body(message, kind, None, exc.status_code), status_code=exc.status_code)


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(protocol.error_body("Internal server error", "InternalServerError", None, 500), status_code=500)


def versions() -> dict[str, str]:
    """Installed versions that decide how disconnects are noticed (recorded in /health and /metrics)."""
    return {name: version(name) for name in ("starlette", "uvicorn")}


def build_app(
    engine: Engine,
    *,
    model_name: str | None = None,
    admin_token: str | None = None,
    max_body_bytes: int = protocol.MAX_BODY_BYTES,
    reasoning_tokens: tuple[int, int] = (0, 0),
) -> Starlette:
    """The ASGI app over a started ``engine``; the caller owns the engine's lifecycle. ``reasoning_tokens``:
    a chat answer's first N tokens, N drawn in [lo, hi] per request, are reasoning (``chaos.stack.reasoning``)."""
    name = model_name or engine.config.model
    stack = Stack(engine, name, versions(), admin_token, max_body_bytes)
    routes = [
        Route("/v1/completions", _generate_endpoint(chat=False), methods=["POST"]),
        Route("/v1/chat/completions", _generate_endpoint(chat=True), methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        *admin_routes(),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _unexpected})
    app.add_middleware(FaultMiddleware, hooks=stack.hooks)  # first_byte, mid_stream, request_body, abort
    app.state.stack = stack
    app.state.reasoning_tokens = reasoning_tokens
    return app
