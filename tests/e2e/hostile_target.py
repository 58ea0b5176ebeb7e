"""A streaming server that answers its side routes as a hostile target would (issue 23, point 4).

``python tests/e2e/hostile_target.py`` prints ``PORT n`` and serves, until killed, the mock's token
streams (``chaos.load.mock``) and:

- ``GET /metrics``: a valid exposition of 150 MB, generated as it is sent, without a length;
- ``GET /v1/models``: ``{"data": [[[...]]]}`` nested 200,000 deep;
- ``GET /health``: declares a megabyte and drips one byte every 0.2 s (no read timeout ever fires);
- ``GET /version``: declares 50 MB;
- ``GET /info``: a TGI router name of 300,000 characters (under the byte cap: the report must clip it).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.load.mock import MockSSEServer  # noqa: E402

METRICS_BYTES = 150 << 20
DEPTH = 200_000


class HostileServer(MockSSEServer):
    async def _answer_get(self, path: str, writer: asyncio.StreamWriter) -> None:
        route = path.split("?", 1)[0]
        if route == "/metrics":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nConnection: close\r\n\r\n"
                         b"# TYPE streamchaos_filler gauge\n")
            line = b'streamchaos_filler{i="%d"} 1\n'
            sent = 0
            while sent < METRICS_BYTES:
                chunk = b"".join(line % (sent + i) for i in range(20_000))
                writer.write(chunk)
                sent += len(chunk)
                await writer.drain()
            raise ConnectionError("exposition sent; closing")
        if route == "/health":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
            while True:
                await writer.drain()
                await asyncio.sleep(0.2)
                writer.write(b" ")
        if route == "/v1/models":
            body = b'{"data":' + b"[" * DEPTH + b"]" * DEPTH + b"}"
        elif route == "/version":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 52428800\r\n\r\n"
                         b'{"version":"')
            await writer.drain()
            raise ConnectionError("declared more than it sends")
        elif route == "/info":
            body = b'{"router":"text-generation-router' + b"r" * 300_000 + b'"}'
        else:
            await super()._answer_get(path, writer)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)
        await writer.drain()


async def serve() -> None:
    server = HostileServer(tick_s=0.01)
    print(f"PORT {await server.start()}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
