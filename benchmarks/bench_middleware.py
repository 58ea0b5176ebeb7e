"""What the streamchaos ASGI fault middleware costs a streamed request, disarmed and armed (prints figures; not a test).

    python benchmarks/bench_middleware.py [--requests 20000] [--events 64]

The same ASGI app (a generation handler that streams ``--events`` SSE chunks of one token each,
as vLLM's does) is called bare, through ``FaultMiddleware`` with nothing armed (what every request
of a `target.kind: vllm` run meets outside a fault phase), and through it with a mid-stream timeout
armed that never fires for the request (``fraction: 0``: every chunk is counted and checked). All
in one process, interleaved in rounds, so the figures are CPU per request on the same core; the
cost beside vLLM's own (its TTFT p50 on CPU is ~16 ms, benchmarks/bench_vllm.py) is the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.stack.asgi_faults import FaultMiddleware  # noqa: E402
from chaos.stack.hooks import Hooks, parse_spec  # noqa: E402

SCOPE = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}


def streaming_app(events: int) -> Any:
    chunk = b'data: {"choices":[{"text":"a","index":0}]}\n\n'

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(events):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def per_request_us(app: Any, requests: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        return None

    started = time.perf_counter()
    for _ in range(requests):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter() - started) / requests * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--events", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    inner = streaming_app(args.events)
    disarmed = FaultMiddleware(inner, Hooks(None))
    armed_hooks = Hooks(None)
    armed_hooks.install("bench", parse_spec({"type": "timeout", "where": "mid_stream", "fraction": 0.0,
                                             "after_events": 8}))
    armed = FaultMiddleware(inner, armed_hooks)
    cases = {"bare app": inner, "middleware, disarmed": disarmed, "middleware, armed (never fires)": armed}
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, app in cases.items():
            results[name].append(await per_request_us(app, args.requests))
    bare = statistics.median(results["bare app"])
    print(f"{args.requests} requests x {args.rounds} rounds, {args.events} SSE chunks each; median per request")
    for name, rows in results.items():
        med = statistics.median(rows)
        extra = med - bare
        print(f"{name:34} {med:8.2f} us   +{extra:6.2f} us over bare   = {extra / 16_000 * 100:.4f}% of a 16 ms TTFT")


if __name__ == "__main__":
    asyncio.run(main())
