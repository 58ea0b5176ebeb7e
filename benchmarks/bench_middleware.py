"""What the streamchaos ASGI fault middleware costs a streamed request, disarmed and armed (prints figures; not a test).

    python benchmarks/bench_middleware.py [--requests 5000] [--events 64] [--concurrency 1]
                                          [--baseline OLD_asgi_faults.py]

The same ASGI app (a generation handler that streams ``--events`` SSE chunks of one token each,
as vLLM's does) is called bare, through ``FaultMiddleware`` with nothing armed (what every request
of a `target.kind: vllm` run meets outside a fault phase), and through it with a fault armed that
never fires for the request: a mid-stream timeout that does not choose it (``fraction: 0``: the
common case of a fault phase), one that chose it but waits for more events than the stream has
(``after_events`` past the end), and a first-byte timeout that does not choose it. All in one
process, interleaved in rounds, so the figures are CPU time per request (``time.thread_time``) on the
same core; the cost beside
vLLM's own (its TTFT p50 on CPU is ~16 ms, benchmarks/bench_vllm.py) is the ratio.

``--concurrency N``: N requests in flight at once, each chunk yielding to the event loop (as a
stream waiting on its engine does), so the hooks hold N requests at a time. ``--baseline FILE``: an
older ``chaos/stack/asgi_faults.py`` (e.g. ``git show HEAD~1:chaos/stack/asgi_faults.py > old.py``),
measured in the same rounds against today's ``Hooks``: before and after, side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.stack.asgi_faults import FaultMiddleware  # noqa: E402
from chaos.stack.hooks import Hooks, parse_spec  # noqa: E402

SCOPE = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": []}
ARMED = {  # the faults of each armed case: none of them fires for any request
    "mid_stream, not chosen": {"type": "timeout", "where": "mid_stream", "fraction": 0.0, "after_events": 8},
    "mid_stream, chosen, not yet": {"type": "timeout", "where": "mid_stream", "every_n": 1, "after_events": 1_000_000},
    "first_byte, not chosen": {"type": "timeout", "where": "first_byte", "fraction": 0.0},
}


def streaming_app(events: int, yields: bool) -> Any:
    chunk = b'data: {"choices":[{"text":"a","index":0}]}\n\n'

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(events):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if yields:
                await asyncio.sleep(0)  # the next token is not there yet: other streams run
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def per_request_us(app: Any, requests: int, concurrency: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Any) -> None:
        return None

    async def client(n: int) -> None:
        for _ in range(n):
            await app(dict(SCOPE), receive, send)

    # CPU time of this thread, not wall time: on a shared box the time spent waiting for a core would
    # swamp microseconds (the load average is printed beside the figures)
    started = time.thread_time()
    share = requests // concurrency
    await asyncio.gather(*(client(share) for _ in range(concurrency)))
    return (time.thread_time() - started) / (share * concurrency) * 1e6


def load_baseline(path: Path) -> Callable[..., Any]:
    """``FaultMiddleware`` of an older asgi_faults.py, loaded inside ``chaos.stack`` (its relative imports)."""
    spec = importlib.util.spec_from_file_location("chaos.stack._baseline_asgi_faults", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FaultMiddleware  # type: ignore[no-any-return]  # a module loaded from a path is untyped


def armed(middleware: Callable[..., Any], inner: Any, fault: dict[str, Any]) -> Any:
    hooks = Hooks(None)
    hooks.install("bench", parse_spec(fault))
    return middleware(inner, hooks)


def cases(inner: Any, baseline: Callable[..., Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"bare app": inner, "disarmed": FaultMiddleware(inner, Hooks(None))}
    for name, fault in ARMED.items():
        if baseline is not None:
            out[f"armed, {name} (before)"] = armed(baseline, inner, fault)
        out[f"armed, {name}"] = armed(FaultMiddleware, inner, fault)
    return out


def host() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return f"{model or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load {load}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--events", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--baseline", type=Path, help="an older chaos/stack/asgi_faults.py to measure beside")
    args = parser.parse_args()
    inner = streaming_app(args.events, yields=args.concurrency > 1)
    apps = cases(inner, load_baseline(args.baseline) if args.baseline else None)
    results: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(args.rounds):
        for name, app in apps.items():
            results[name].append(await per_request_us(app, args.requests, args.concurrency))
    bare = statistics.median(results["bare app"])
    print(f"host: {host()}")
    print(f"{args.requests} requests x {args.rounds} rounds, {args.events} SSE chunks each, {args.concurrency} "
          "in flight; median per request, the extra over the bare app per request and per chunk")
    for name, rows in results.items():
        med = statistics.median(rows)
        extra = med - bare
        print(f"{name:42} {med:8.2f} us  +{extra:7.2f} us  = {extra / args.events:5.2f} us a chunk"
              f"  ({extra / 16_000 * 100:.4f}% of a 16 ms TTFT)")


if __name__ == "__main__":
    asyncio.run(main())
