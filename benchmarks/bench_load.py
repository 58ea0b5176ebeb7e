"""Benchmark: the load generator at production scale, beside a vLLM-bench-style aiohttp client.

A loopback SSE server (this file, ``--serve``) streams ``--tokens`` content events per request, one
every ``--tick`` seconds, so requests turn over (closed loop: each stream sends its next request
when one ends). The server is built to cost less per event than any client: every event is a
pre-encoded chunk, one ticker task writes them all. Per configuration (N streams, W worker
processes) each client runs in its own process against the same server, side by side:

* ``ours``: ``chaos.load`` (``make_load``: LoadGenerator, or WorkerPool for W > 1);
* ``aiohttp``: the anchor, the client of ``vllm bench serve`` (one ``aiohttp.ClientSession`` with a
  ``TCPConnector``, ``async for line in response.content``, ``json.loads`` per event), W = 1 only.

Columns: events/s delivered (in the measured window) and as a share of offered (N / tick), the
client's event-loop lag p50/p99 (same monitor in both), client CPU-ms per 1,000 events (all its
processes, window only) and its CPU use (% of one core: on a shared machine, what it got), TTFT p50/p99 (sent → first content), the server's CPU use (% of one core)
and which process saturated: ``server`` when it used ≥ 90% of a core, ``client`` when its lag p99
exceeded the threshold or a process of it used ≥ 90% of a core. Prints figures; asserts nothing.

    python benchmarks/bench_load.py [--streams 64,256,512,1024] [--workers 1,2] [--tokens 64]
                                    [--tick 0.02] [--seconds 5] [--warmup 1.5] [--json]

Needs aiohttp for the anchor (``pip install -e '.[dev]'``); without it the anchor rows are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLK_TCK = os.sysconf("SC_CLK_TCK")
LAG_THRESHOLD_S = 0.005


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc; 0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return 0.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- the server ----------------------------------------------------------------------------------


def serve(port: int, tick: float) -> None:
    import httptools

    def chunk(payload: bytes) -> bytes:
        return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"

    def event(finish: str | None) -> bytes:
        obj = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
               "choices": [{"index": 0, "text": "tok ", "logprobs": None, "finish_reason": finish}]}
        return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    token, last = event(None), event("length")
    done = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    active: dict[int, list[Any]] = {}  # id → [transport, tokens left]

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop: not a subclass
            self.parser = httptools.HttpRequestParser(self)
            self.body = b""

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            try:
                tokens = int(json.loads(self.body).get("max_tokens", 16))
            except (ValueError, AttributeError):
                tokens = 16
            self.body = b""
            self.transport.write(head)
            active[id(self)] = [self.transport, max(1, tokens)]

        def connection_lost(self, exc: Exception | None) -> None:
            active.pop(id(self), None)

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            finished = []
            for key, entry in active.items():
                transport = entry[0]
                entry[1] -= 1
                if entry[1] > 0:
                    transport.write(token)
                else:
                    transport.write(last + done)
                    finished.append(key)
            for key in finished:
                del active[key]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Conn, "127.0.0.1", port, backlog=4096)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await ticker()

    from chaos.load.loop import run

    run(main())


# ---- the clients ---------------------------------------------------------------------------------


async def _window(start_at: float, end_at: float, pids: list[int], server_pid: int) -> dict[str, float]:
    """Sample CPU of the client processes and the server at the window's start and end."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    t0, c0, s0 = time.monotonic(), [proc_cpu_s(p) for p in pids], proc_cpu_s(server_pid)
    await asyncio.sleep(max(0.0, end_at - time.monotonic()))
    t1, c1, s1 = time.monotonic(), [proc_cpu_s(p) for p in pids], proc_cpu_s(server_pid)
    return {"t0": t0, "t1": t1, "client_cpu_s": sum(c1) - sum(c0), "max_proc_cpu_s": max(b - a for a, b in zip(c0, c1)),
            "server_cpu_s": s1 - s0}


async def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from chaos.load.workers import WorkerPool, make_load
    from chaos.load.workload import LoadTarget
    from chaos.load.workload import LoadSettings, PromptSettings
    from chaos.observations import StreamRecord
    from chaos.context import ClientPolicy

    spec: Any = LoadSettings(concurrency=args.streams, workers=args.workers, max_tokens=(args.tokens, args.tokens),
                        request_timeout=60.0, include_usage=False, lag_threshold=LAG_THRESHOLD_S,
                        prompts=PromptSettings(min_chars=32, max_chars=64))
    records: list[StreamRecord] = []
    load = make_load(spec, LoadTarget(args.url, "bench", 0), policy=ClientPolicy(), sink=records.append)
    pids = [os.getpid()]
    if isinstance(load, WorkerPool):
        await load.ready()
        pids += [p.pid for p in load._procs if p.pid is not None]
    start = time.monotonic()
    end = start + args.warmup + args.seconds
    window = asyncio.create_task(_window(start + args.warmup, end, pids, args.server_pid))
    await load.run(int(end * 1e9))
    win = await window
    await load.drain(0.0)  # cancel what is left: only the window counts
    lag = load.refresh_lag() if isinstance(load, WorkerPool) else None
    lag_stats = await lag if lag is not None else load.lag_stats()
    await load.aclose()
    t0, t1 = int(win["t0"] * 1e9), int(win["t1"] * 1e9)
    events = sum(1 for r in records for t in r.t_content if t0 <= t <= t1)
    ttft = [r.ttft_ns / 1e6 for r in records if r.ttft_ns is not None and r.t_sent is not None and t0 <= r.t_sent <= t1]
    errors = sum(1 for r in records if r.error is not None and r.error.kind != "cancelled")
    return _row(args, win, events, ttft, errors, lag_stats["p50_ms"], lag_stats["p99_ms"], len(pids))


async def run_aiohttp(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from chaos.load.lag import LagMonitor

    monitor = LagMonitor(threshold_s=LAG_THRESHOLD_S)
    stamps: list[float] = []
    ttfts: list[tuple[float, float]] = []
    errors = [0]
    # as `vllm bench serve` sets up its session
    connector = aiohttp.TCPConnector(limit=args.streams, limit_per_host=args.streams, ttl_dns_cache=300, use_dns_cache=True,
                                     keepalive_timeout=60, enable_cleanup_closed=True, force_close=False)
    session = aiohttp.ClientSession(connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))
    url = args.url + "/completions"

    async def request(n: int) -> None:
        payload = {"model": "bench", "prompt": f"{n} the quick brown fox jumps over the lazy dog", "max_tokens": args.tokens,
                   "stream": True, "temperature": 0.0, "ignore_eos": True}
        st = time.perf_counter()
        ttft = 0.0
        async with session.post(url=url, json=payload) as response:
            if response.status != 200:
                errors[0] += 1
                return
            async for chunk_bytes in response.content:  # the vLLM backend_request_func loop
                chunk_bytes = chunk_bytes.strip()
                if not chunk_bytes:
                    continue
                chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
                if chunk != "[DONE]":
                    timestamp = time.perf_counter()
                    data = json.loads(chunk)
                    if choices := data.get("choices"):
                        if ttft == 0.0:
                            ttft = timestamp - st
                            ttfts.append((st, ttft))
                        if choices[0].get("text"):
                            stamps.append(timestamp)

    async def slot(i: int, deadline: float) -> None:
        n = 0
        while time.perf_counter() < deadline:
            try:
                await request(i * 1_000_000 + n)
            except (aiohttp.ClientError, OSError):
                errors[0] += 1
            n += 1

    monitor.start()
    start = time.monotonic()
    end = start + args.warmup + args.seconds
    window = asyncio.create_task(_window(start + args.warmup, end, [os.getpid()], args.server_pid))
    slots = [asyncio.create_task(slot(i, end)) for i in range(args.streams)]
    win = await window
    for task in slots:
        task.cancel()
    await asyncio.gather(*slots, return_exceptions=True)
    await session.close()
    lag = monitor.summary()
    await monitor.stop()
    events = sum(1 for t in stamps if win["t0"] <= t <= win["t1"])
    ttft = [v * 1e3 for s, v in ttfts if win["t0"] <= s <= win["t1"]]
    return _row(args, win, events, ttft, errors[0], lag["p50_ms"], lag["p99_ms"], 1)


def _row(args: argparse.Namespace, win: dict[str, float], events: int, ttft: list[float], errors: int,
         lag_p50: float, lag_p99: float, processes: int) -> dict[str, Any]:
    seconds = win["t1"] - win["t0"]
    offered = args.streams / args.tick
    server_util = win["server_cpu_s"] / seconds
    proc_util = win["max_proc_cpu_s"] / seconds
    client_sat = lag_p99 > LAG_THRESHOLD_S * 1e3 or proc_util >= 0.9
    server_sat = server_util >= 0.9
    saturated = {(False, False): "none", (True, False): "client", (False, True): "server", (True, True): "both"}[(client_sat, server_sat)]
    from chaos.load.loop import loop_name

    return {
        "client": args.client, "streams": args.streams, "workers": args.workers, "tokens": args.tokens, "tick_s": args.tick,
        "loop": loop_name(), "offered_per_s": offered, "events_per_s": events / seconds, "share_of_offered": events / seconds / offered,
        "lag_p50_ms": lag_p50, "lag_p99_ms": lag_p99,
        "cpu_ms_per_1k_events": 1e6 * win["client_cpu_s"] / max(1, events), "client_cpu_util": win["client_cpu_s"] / seconds,
        "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99), "requests": len(ttft), "errors": errors,
        "server_cpu_util": server_util, "server_cpu_ms_per_1k_events": 1e6 * win["server_cpu_s"] / max(1, events),
        "saturated": saturated, "processes": processes, "window_s": seconds,
    }


# ---- the orchestrator ----------------------------------------------------------------------------


def _client_process(args: argparse.Namespace, client: str, streams: int, workers: int, url: str, server_pid: int) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--client", client, "--streams", str(streams), "--workers", str(workers),
           "--tokens", str(args.tokens), "--tick", str(args.tick), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
           "--url", url, "--server-pid", str(server_pid)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + args.warmup + 90, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"  {client} N={streams} W={workers}: timed out", file=sys.stderr)
        return None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"  {client} N={streams} W={workers}: failed (exit {out.returncode}): {out.stderr.strip()[-800:]}", file=sys.stderr)
        return None
    row: dict[str, Any] = json.loads(lines[-1])
    return row


HEADER = (f"{'streams':>7} {'workers':>7} {'client':>8} {'offered/s':>9} {'events/s':>9} {'share':>6} {'lag p50':>8} {'lag p99':>8} "
          f"{'CPU-ms/1k':>9} {'client CPU':>10} {'TTFT p50':>8} {'TTFT p99':>8} {'server CPU':>10} {'errors':>6}  saturated")


def _fmt(row: dict[str, Any]) -> str:
    return (f"{row['streams']:>7} {row['workers']:>7} {row['client']:>8} {row['offered_per_s']:>9.0f} {row['events_per_s']:>9.0f} "
            f"{row['share_of_offered']:>6.0%} {row['lag_p50_ms']:>6.2f}ms {row['lag_p99_ms']:>6.1f}ms {row['cpu_ms_per_1k_events']:>9.0f} "
            f"{row['client_cpu_util']:>9.0%} "
            f"{row['ttft_p50_ms']:>6.1f}ms {row['ttft_p99_ms']:>6.1f}ms {row['server_cpu_util']:>9.0%} {row['errors']:>6}  {row['saturated']}")


def orchestrate(args: argparse.Namespace) -> None:
    try:
        import aiohttp  # noqa: F401

        anchor = True
    except ImportError:
        anchor = False
        print("aiohttp is not installed: the anchor rows are skipped (pip install -e '.[dev]')", file=sys.stderr)
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--tick", str(args.tick)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    rows: list[dict[str, Any]] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}/v1"
        from chaos.load.loop import loop_name

        if not args.json:
            print(f"server: {1 / args.tick:g} events/s per stream, {args.tokens} tokens per request (turnover), "
                  f"{args.seconds:g}s window after {args.warmup:g}s warm-up; loop {loop_name()}; "
                  f"lag threshold {LAG_THRESHOLD_S * 1e3:g}ms; load average {os.getloadavg()[0]:.2f}")
            print(HEADER, flush=True)
        for streams in (int(s) for s in args.streams.split(",")):
            for workers in (int(w) for w in args.workers.split(",")):
                if workers > streams:
                    continue
                clients = [c for c in args.clients.split(",") if c == "ours" or (c == "aiohttp" and anchor and workers == 1)]
                got: dict[str, dict[str, Any]] = {}
                for client in clients:
                    row = _client_process(args, client, streams, workers, url, server.pid)
                    if row is None:
                        continue
                    got[client] = row
                    rows.append(row)
                    if not args.json:
                        print(_fmt(row), flush=True)
                if not args.json and "ours" in got and "aiohttp" in got:
                    o, a = got["ours"], got["aiohttp"]
                    print(f"{'':>7} {'':>7} {'ours/aio':>8} {'':>9} {o['events_per_s'] / max(1e-9, a['events_per_s']):>9.2f} {'':>6} {'':>8} {'':>8} "
                          f"{o['cpu_ms_per_1k_events'] / max(1e-9, a['cpu_ms_per_1k_events']):>9.2f}", flush=True)
    finally:
        server.terminate()  # our own child
        server.wait(10)
    if args.json:
        print(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="64,256,512,1024")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--tokens", type=int, default=64, help="content events per request (turnover)")
    parser.add_argument("--tick", type=float, default=0.02, help="seconds between a stream's events")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per row")
    parser.add_argument("--warmup", type=float, default=1.5, help="seconds before the window (connects, first requests)")
    parser.add_argument("--clients", default="ours,aiohttp", help="which clients to run: ours, aiohttp (the anchor)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=("ours", "aiohttp"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port, args.tick)
        return
    if args.client:
        args.streams, args.workers = int(args.streams), int(args.workers)
        from chaos.load.loop import run

        row = run(run_ours(args) if args.client == "ours" else run_aiohttp(args))
        print(json.dumps(row), flush=True)
        return
    orchestrate(args)


if __name__ == "__main__":
    main()
