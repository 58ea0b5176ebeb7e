"""Benchmark of the builtin stack over HTTP: start-to-ready, idle TTFT, aggregate streamed tokens/s.

    python benchmarks/bench_stack.py [--device auto] [--requests 30] [--tokens 256]

Prints figures; asserts nothing. The client speaks raw HTTP/1.1 over asyncio streams so that its
own overhead stays small next to the server's (reference/llm-serving.md §4.7: httpx adds a lot).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from urllib.parse import urlsplit

from chaos.stack.process import StackProcess

_USAGE = re.compile(rb'"completion_tokens":(\d+)')
_CONTENT = re.compile(rb'"text":"[^"]')  # the first event with non-empty text


async def _stream(host: str, port: int, body: dict[str, object]) -> tuple[float, int]:
    """One streamed completion: (seconds to the first content event, completion tokens)."""
    payload = json.dumps(body).encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: b\r\nConnection: close\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    await writer.drain()
    ttft = -1.0
    raw = b""
    while chunk := await reader.read(65536):
        raw += chunk
        if ttft < 0 and _CONTENT.search(raw):
            ttft = time.perf_counter() - t0
    writer.close()
    match = _USAGE.findall(raw)
    return ttft, int(match[-1]) if match else 0


async def _ttft_keepalive(host: str, port: int, n: int) -> list[float]:
    """Idle TTFT of ``n`` requests one after another on ONE kept-alive connection (concurrency 1).

    Every request but the first is where a server without TCP_NODELAY shows: its first SSE event
    waits for the client's delayed ACK of the headers, ~40 ms on Linux."""
    prompt = [100 + i for i in range(32)]
    payload = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
                          "stream": True}).encode()
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode())
    reader, writer = await asyncio.open_connection(host, port)
    out = []
    try:
        for i in range(n + 3):
            t0 = time.perf_counter()
            writer.write(head + payload)
            raw, ttft = b"", -1.0
            while not raw.endswith(b"0\r\n\r\n"):
                chunk = await reader.read(65536)
                if not chunk:
                    raise ConnectionError("the stack closed a keep-alive connection")
                raw += chunk
                if ttft < 0 and _CONTENT.search(raw):
                    ttft = time.perf_counter() - t0
            if i >= 3:  # the first requests warm up (and the very first is never delayed)
                out.append(ttft)
    finally:
        writer.close()
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _ttft(host: str, port: int, n: int) -> list[float]:
    prompt = [100 + i for i in range(32)]  # exactly 32 prompt tokens
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True}
    for _ in range(3):  # warm-up
        await _stream(host, port, body)
    out = []
    for _ in range(n):
        ttft, _ = await _stream(host, port, body)
        out.append(ttft)
    return out


async def _throughput(host: str, port: int, concurrency: int, tokens: int) -> tuple[float, int, float]:
    body = {"model": "tiny", "prompt": "Throughput test, please keep talking:", "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    await _stream(host, port, {**body, "max_tokens": 8})  # warm-up
    t0 = time.perf_counter()
    results = await asyncio.gather(*[_stream(host, port, body) for _ in range(concurrency)])
    wall = time.perf_counter() - t0
    total = sum(n for _, n in results)
    return total / wall, total, wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--requests", type=int, default=30)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    stack_args = ("--device", args.device, "--max-num-seqs", "64", "--kv-blocks", "2048")

    starts = []
    for _ in range(3):
        t0 = time.perf_counter()
        proc = StackProcess.start(*stack_args)
        starts.append(time.perf_counter() - t0)
        proc.close()
    print(f"start to ready: median {statistics.median(starts):.2f} s (runs: {', '.join(f'{s:.2f}' for s in starts)})")

    with StackProcess.start(*stack_args) as proc:
        parts = urlsplit(proc.url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        ttfts = asyncio.run(_ttft(host, port, args.requests))
        print(f"idle TTFT, 32-token prompt, {len(ttfts)} requests: p50 {_pct(ttfts, 0.5) * 1e3:.1f} ms, "
              f"p99 {_pct(ttfts, 0.99) * 1e3:.1f} ms")
        kept = asyncio.run(_ttft_keepalive(host, port, args.requests))
        print(f"idle TTFT, keep-alive, concurrency 1, {len(kept)} requests on one connection: "
              f"p50 {_pct(kept, 0.5) * 1e3:.1f} ms, "
              f"p99 {_pct(kept, 0.99) * 1e3:.1f} ms (goal p50 <= 8 ms; 43.5 ms with Nagle on)")
        for concurrency in (1, 8, 32):
            rate, total, wall = asyncio.run(_throughput(host, port, concurrency, args.tokens))
            print(f"streamed tokens/s at concurrency {concurrency:>2}: {rate:8.0f}  ({total} tokens in {wall:.2f} s)")


if __name__ == "__main__":
    main()
