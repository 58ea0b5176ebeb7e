"""The builtin stack with one planted content or framing defect (issue 40: the defect classes a set
of servers written outside the project slipped past every shipped experiment).

    python tests/e2e/planted_content.py --defect NAME [stack serve flags]

NAME is one of:

- ``duplicate_events``: 2% of content events are sent twice (the same bytes, back to back); the
  usage chunk counts the events really generated, one token each, as the servers that did this did
  (the builtin engine's byte tokens would put several in one event where a character spans them).
- ``short_length``: every stream is cut 20% short and still ends with ``finish_reason: length``
  (the request's ``max_tokens`` lowered on the way in, ``ignore_eos`` honoured): its usage says so.
- ``json_content_type``: streaming responses go out as ``Content-Type: application/json`` (the body
  still SSE): every ``--json-every``-th one (default 1: all) from the ``--json-from``-th on (default 2:
  the preflight's request is answered right, so a run gets past it and its verdicts must catch the
  rest; 1: the preflight's too).
- ``html_everywhere``: every request, whatever its path, is answered ``200 text/html`` with a page.
- ``gzip_origin``: the origin itself compresses its event streams (``Content-Encoding: gzip`` when
  the request accepts it) and flushes only at the end, so each stream arrives in one piece.

These defects live here, in the tests, and nowhere in the product.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import zlib
from typing import Any

from planted_stack import (  # the script's own folder is on sys.path: python tests/e2e/planted_content.py
    _Wrapper,
    serve_wrapped,
)
from starlette.types import Message, Receive, Scope, Send

DUPLICATE_SHARE = 0.02
SHORT_SHARE = 0.8  # short_length: the share of max_tokens a stream gets
_CONTENT = re.compile(rb'^data: \{.*"(?:text|content)":"[^"]')


def _is_stream(message: Message) -> bool:
    headers = dict(message.get("headers") or [])
    return b"text/event-stream" in headers.get(b"content-type", b"")


class DuplicateEvents(_Wrapper):
    """A content event sent twice, 2% of them, drawn from a seeded generator (the same run, the same picks)."""

    rng = random.Random(40)

    def wrap_send(self, send: Send) -> Send:
        generated = 0

        async def duplicating(message: Message) -> None:
            nonlocal generated
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if b'"usage":{' in body:
                message = {**message, "body": _usage_of(body, generated)}
            await send(message)
            if body.count(b"data: ") == 1 and _CONTENT.match(body):
                generated += 1
                if self.rng.random() < DUPLICATE_SHARE:
                    await send(message)

        return duplicating


def _usage_of(body: bytes, tokens: int) -> bytes:
    """The usage chunk with ``completion_tokens`` = the content events generated (one token each)."""
    chunk = json.loads(body.removeprefix(b"data: "))
    usage = chunk["usage"]
    usage["completion_tokens"] = tokens
    usage["total_tokens"] = usage.get("prompt_tokens", 0) + tokens
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


class ShortLength(_Wrapper):
    """``max_tokens`` lowered to 80% before the engine sees it: a stream that ends on ``length`` early."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get("max_tokens"), int):
                data["max_tokens"] = max(1, int(data["max_tokens"] * SHORT_SHARE))
                body = json.dumps(data).encode()
        except ValueError:
            pass
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


class JsonContentType(_Wrapper):
    """Event streams relabelled ``application/json`` from the ``start``-th on."""

    start = 2
    every = 1
    seen = 0

    def wrap_send(self, send: Send) -> Send:
        async def relabelling(message: Message) -> None:
            if message["type"] == "http.response.start" and _is_stream(message):
                JsonContentType.seen += 1
                if JsonContentType.seen >= self.start and (JsonContentType.seen - self.start) % self.every == 0:
                    headers = [(k, v) for k, v in message["headers"] if k.lower() != b"content-type"]
                    message = {**message, "headers": [*headers, (b"content-type", b"application/json")]}
            await send(message)

        return relabelling


PAGE = b"<!doctype html><html><head><title>Welcome</title></head><body><h1>It works!</h1></body></html>\n"


class HtmlEverywhere(_Wrapper):
    """A web server's page for every request (a URL that points at the wrong thing)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                (b"content-length", str(len(PAGE)).encode())]})
        await send({"type": "http.response.body", "body": PAGE})


class GzipOrigin(_Wrapper):
    """The origin compresses its own event streams and flushes the compressor only at the end."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        accepts = dict(scope.get("headers") or []).get(b"accept-encoding", b"")
        if scope["type"] != "http" or b"gzip" not in accepts:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, self.wrap_send(send))

    def wrap_send(self, send: Send) -> Send:
        compressor: Any = None

        async def compressing(message: Message) -> None:
            nonlocal compressor
            if message["type"] == "http.response.start" and _is_stream(message):
                compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # gzip framing
                message = {**message, "headers": [*message["headers"], (b"content-encoding", b"gzip")]}
            elif message["type"] == "http.response.body" and compressor is not None:
                out = compressor.compress(message.get("body", b""))
                if not message.get("more_body", False):
                    out += compressor.flush()
                message = {**message, "body": out}
            await send(message)

        return compressing


WRAPPERS: dict[str, type[_Wrapper]] = {
    "duplicate_events": DuplicateEvents, "short_length": ShortLength, "json_content_type": JsonContentType,
    "html_everywhere": HtmlEverywhere, "gzip_origin": GzipOrigin}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--defect", required=True, choices=list(WRAPPERS))
    parser.add_argument("--json-from", type=int, default=2, help="json_content_type: from this streaming response on")
    parser.add_argument("--json-every", type=int, default=1, help="json_content_type: every this many")
    args, rest = parser.parse_known_args(argv)
    JsonContentType.start, JsonContentType.every = args.json_from, args.json_every
    return serve_wrapped(WRAPPERS[args.defect], rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
