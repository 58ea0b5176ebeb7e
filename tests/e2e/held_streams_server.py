"""An OpenAI-compatible server that holds many slow streams open at little CPU: for runs that need
more sockets than a default open-file limit allows.

    python tests/e2e/held_streams_server.py TOKENS TICK_S [HOST]   # prints "listening PORT" once ready

Every completion streams TOKENS content events, one every TICK_S seconds, then ``[DONE]``;
``/v1/models`` names model ``held``; other paths are 404. Binds 127.0.0.1 only, unless HOST names
another address of this host (a test's bridge; never a wildcard: 0.0.0.0 and :: are refused). It
raises its own soft open-file limit to its hard one (a server's business, not the run's).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys

MODELS = json.dumps({"object": "list", "data": [{"id": "held", "object": "model"}]}).encode()


def _event(finish: str | None) -> bytes:
    body = {"id": "cmpl-held", "object": "text_completion", "created": 0, "model": "held",
            "choices": [{"index": 0, "text": "tok ", "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tokens: int, tick: float) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        method, path = head.split(b" ", 2)[:2]
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if length:
            await reader.readexactly(length)
        if method == b"GET" and path.startswith(b"/v1/models"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
        elif method == b"POST" and b"completions" in path:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
            for i in range(tokens):
                await asyncio.sleep(tick)
                writer.write(_event("length" if i == tokens - 1 else None))
                await writer.drain()  # a client that hung up ends the stream here (ConnectionError): no log per tick
            writer.write(b"data: [DONE]\n\n")
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        pass
    finally:
        writer.close()


async def main(tokens: int, tick: float, host: str = "127.0.0.1") -> None:
    if host in ("", "0.0.0.0", "::", "[::]"):
        raise SystemExit(f"held_streams_server: bind one address, not the wildcard {host!r}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = await asyncio.start_server(lambda r, w: _handle(r, w, tokens, tick), host, 0, backlog=4096)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:4]))
