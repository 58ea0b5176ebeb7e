"""The builtin stack with one planted defect, for showing that each verifier catches its bug.

    python tests/e2e/planted_stack.py --defect leak|buffer|no_done|fffd|stall|hf_dialect [stack serve flags]

- ``leak``: the server never aborts an engine request when its client hangs up, so generation (and
  the KV blocks it holds) goes on for the departed client — the classic disconnect leak.
- ``buffer``: every response is held until it is complete, as a buffering proxy would (TTFT = E2E).
- ``no_done``: ``data: [DONE]`` is never sent (and no finish_reason), so streams end early.
- ``fffd``: content carries U+FFFD, as a detokenizer that emits partial UTF-8 would.
- ``stall``: every stream stalls once, for ``--stall-for`` seconds before its ``--stall-at``-th
  content event (1-based): early in the stream, or late, with the same gap distribution.
- ``hf_dialect``: not a defect but another engine's dialect, as ``transformers serve`` speaks it:
  HTTP 422 ``Unexpected fields in the request: {'ignore_eos'}`` for a field it does not know, no
  ``data: [DONE]`` after a complete stream (the finish_reason stays), no ``/metrics`` (404) and a
  ``/health`` that does not say "streamchaos".
These defects live here, in the tests, and nowhere in the product.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

import chaos.stack.server as server_module
from chaos.stack.engine import Engine
from chaos.stack.serve import serve_main


class _Wrapper:
    """An ASGI middleware that still exposes the wrapped app's ``state`` (serve.py reads it)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, self.wrap_send(send))

    def wrap_send(self, send: Send) -> Send:
        return send


class Buffering(_Wrapper):
    def wrap_send(self, send: Send) -> Send:
        held: list[bytes] = []

        async def buffered(message: Message) -> None:
            if message["type"] != "http.response.body":
                await send(message)
                return
            held.append(message.get("body", b""))
            if not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b"".join(held), "more_body": False})

        return buffered


class DropDone(_Wrapper):
    def wrap_send(self, send: Send) -> Send:
        async def dropping(message: Message) -> None:
            if message["type"] == "http.response.body":
                body = message.get("body", b"").replace(b"data: [DONE]\n\n", b"")
                body = re.sub(rb'"finish_reason":"[a-z]+"', b'"finish_reason":null', body)
                message = {**message, "body": body}
            await send(message)

        return dropping


class ReplacementChars(_Wrapper):
    def wrap_send(self, send: Send) -> Send:
        async def corrupting(message: Message) -> None:
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                body = body.replace(b'"text":"', '"text":"\ufffd'.encode(), 1) \
                    .replace(b'"content":"', '"content":"\ufffd'.encode(), 1)
                message = {**message, "body": body}
            await send(message)

        return corrupting


class Stall(_Wrapper):
    """Hold one content event of every stream back: the send path of that stream only."""

    at = 2
    seconds = 1.0

    def wrap_send(self, send: Send) -> Send:
        count = 0

        async def stalling(message: Message) -> None:
            nonlocal count
            if message["type"] == "http.response.body":
                body = message.get("body", b"")
                if re.search(rb'"text":"[^"]', body):
                    count += 1
                    if count == self.at:
                        await asyncio.sleep(self.seconds)
            await send(message)

        return stalling


class HfDialect(_Wrapper):
    """transformers serve's dialect (transformers 5.x, measured): strict fields, no [DONE], no /metrics."""

    UNKNOWN = ("ignore_eos", "min_tokens")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/health":
            await _json(send, 200, b'{"status":"ok"}')
            return
        if path == "/metrics":
            await _json(send, 404, b'{"detail":"Not Found"}')
            return
        if not path.startswith("/v1/") or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        unknown = [k for k in self.UNKNOWN if f'"{k}"'.encode() in body]
        if unknown:
            detail = "Unexpected fields in the request: {" + ", ".join(repr(k) for k in unknown) + "}"
            await _json(send, 422, ('{"detail":"' + detail + '"}').encode())
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, self.wrap_send(send))

    def wrap_send(self, send: Send) -> Send:
        async def no_done(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": message.get("body", b"").replace(b"data: [DONE]\n\n", b"")}
            await send(message)

        return no_done


async def _json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


WRAPPERS: dict[str, type[_Wrapper]] = {"buffer": Buffering, "no_done": DropDone, "fffd": ReplacementChars,
                                       "stall": Stall, "hf_dialect": HfDialect}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--defect", required=True, choices=["leak", *WRAPPERS])
    parser.add_argument("--stall-at", type=int, default=2, help="stall: before this content event (1-based)")
    parser.add_argument("--stall-for", type=float, default=1.0, help="stall: this many seconds")
    args, rest = parser.parse_known_args(argv)
    Stall.at, Stall.seconds = args.stall_at, args.stall_for
    if args.defect == "leak":
        Engine.abort = lambda self, request_id: None  # type: ignore[method-assign]
        return serve_main(rest)
    return serve_wrapped(WRAPPERS[args.defect], rest)


def serve_wrapped(wrapper: Callable[[Any], Any], argv: list[str]) -> int:
    """Serve the builtin stack (``serve_main`` with ``argv``) with every app it builds wrapped in
    ``wrapper``: how each planted server of these tests puts its defect in front of the real stack."""
    build = server_module.build_app

    def build_wrapped(*a: Any, **kw: Any) -> ASGIApp:
        return wrapper(build(*a, **kw))  # type: ignore[no-any-return]

    server_module.build_app = build_wrapped  # type: ignore[assignment]
    return serve_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
