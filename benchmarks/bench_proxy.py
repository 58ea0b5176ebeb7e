"""Benchmark of the embedded Toxiproxy's data path (no toxics) against direct loopback.

Prints, for each path (direct, embedded proxy, and a real ``toxiproxy-server`` when one is found
through ``TOXIPROXY_SERVER_BIN`` or PATH):

* per-SSE-event latency p50/p99 at 1 and 256 concurrent streams: a server process writes small
  SSE events stamped with ``time.monotonic_ns()`` at a steady tick; the client (this process)
  records arrival - send on the same (system-wide) monotonic clock. "added" = proxy - direct.
* bulk throughput (MB/s) of one connection through the path;
* the most concurrent connections held (up to ``--max-conns``, each verified by a round trip).

Every loop is bounded in count and time; everything runs on loopback. Processes: the SSE/bulk
server and the proxy each run in their own process; the client is this one.

    python benchmarks/bench_proxy.py [--quick] [--max-conns 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# -- the upstream server (runs in a child process: --role server) ----------------------------
async def _serve() -> None:

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        sock = w.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            req = (await r.readline()).decode().split()
            if not req:
                return
            if req[0] == "SSE":  # SSE N INTERVAL_MS START_AT_NS
                n, interval, start_ns = int(req[1]), int(req[2]) / 1000, int(req[3])
                delay = (start_ns - time.monotonic_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
                t0 = max(start_ns / 1e9, time.monotonic())  # keep the stream's phase
                for i in range(n):
                    w.write(b'data: {"t":%d,"i":%d}\n\n' % (time.monotonic_ns(), i))
                    nxt = t0 + (i + 1) * interval
                    await asyncio.sleep(max(0.0, nxt - time.monotonic()))
                w.write(b"data: [DONE]\n\n")
                await w.drain()
            elif req[0] == "BULK":  # BULK NBYTES
                left = int(req[1])
                block = b"\0" * 65536
                while left > 0:
                    w.write(block[: min(left, 65536)])
                    left -= 65536
                    await w.drain()
            elif req[0] == "ECHO":
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            w.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    print(srv.sockets[0].getsockname()[1], flush=True)
    async with srv:
        await srv.serve_forever()


# -- client side -------------------------------------------------------------------------------
class _SSEClient(asyncio.Protocol):
    def __init__(self, samples: list[float], done: asyncio.Future) -> None:
        self.samples, self.done, self.buf = samples, done, b""

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.buf += data
        while b"\n\n" in self.buf:
            ev, self.buf = self.buf.split(b"\n\n", 1)
            if ev.startswith(b"data: {"):
                t = int(ev[len(b'data: {"t":') :].split(b",", 1)[0])
                self.samples.append((now - t) / 1e6)
            elif ev == b"data: [DONE]" and not self.done.done():
                self.done.set_result(None)

    def connection_lost(self, exc: object) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def sse_latency(port: int, streams: int, events: int, interval_ms: int, burst: bool = False) -> list[float]:
    loop = asyncio.get_running_loop()
    samples: list[float] = []
    dones, transports = [], []
    # Streams tick at the same rate with phases spread evenly over the interval (as independent
    # LLM streams are); ``burst=True`` makes every stream tick at the same instant instead.
    start_ns = time.monotonic_ns() + int(1e9) + streams * 5_000_000  # all connected by then
    for k in range(streams):
        phase = 0 if burst else k * interval_ms * 1_000_000 // streams
        done = loop.create_future()
        tr, _ = await loop.create_connection(lambda d=done: _SSEClient(samples, d), "127.0.0.1", port)
        tr.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tr.write(f"SSE {events} {interval_ms} {start_ns + phase}\n".encode())
        dones.append(done)
        transports.append(tr)
    bound = 5 + events * interval_ms / 1000 * 3 + streams * 0.01
    await asyncio.wait(dones, timeout=bound)
    for tr in transports:
        tr.close()
    return samples


async def bulk(port: int, nbytes: int) -> float:
    r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    t0 = time.monotonic()
    w.write(f"BULK {nbytes}\n".encode())
    got = 0
    deadline = t0 + 30
    while got < nbytes and time.monotonic() < deadline:
        d = await r.read(1 << 20)
        if not d:
            break
        got += len(d)
    el = time.monotonic() - t0
    w.close()
    return got / el / 1e6


async def max_conns(port: int, limit: int, batch: int = 100, time_budget: float = 30.0) -> int:
    held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    t_end = time.monotonic() + time_budget
    ok = 0
    try:
        while len(held) < limit and time.monotonic() < t_end:
            new = []
            try:
                for _ in range(min(batch, limit - len(held))):
                    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
                    w.write(b"ECHO\n")
                    new.append((r, w))
            except (TimeoutError, OSError):
                held.extend(new)
                break
            held.extend(new)

            async def ping(rw: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> bool:
                r, w = rw
                w.write(b"p")
                try:
                    return await asyncio.wait_for(r.readexactly(1), 10) == b"p"
                except (TimeoutError, OSError, asyncio.IncompleteReadError):
                    return False

            results = await asyncio.gather(*(ping(rw) for rw in held))
            if not all(results):
                ok = sum(results)
                break
            ok = len(held)
    finally:
        for _, w in held:
            w.close()
        await asyncio.sleep(0.2)
    return ok


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


# -- processes -----------------------------------------------------------------------------
def start_server() -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, __file__, "--role", "server"], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def start_embedded() -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.toxiproxy.server", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    return proc, proc.stdout.readline().split()[-1]


def start_real(binary: str) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [binary, "-host", "127.0.0.1", "-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(150):
        try:
            urllib.request.urlopen(url + "/version", timeout=1).read()
            break
        except OSError:
            time.sleep(0.1)
    return proc, url


def make_proxy(url: str, upstream_port: int) -> int:
    body = json.dumps({"name": "bench", "upstream": f"127.0.0.1:{upstream_port}", "listen": "127.0.0.1:0"})
    req = urllib.request.Request(url + "/proxies", body.encode(), {"Content-Type": "application/json"})
    listen = json.loads(urllib.request.urlopen(req, timeout=10).read())["listen"]
    return int(listen.rsplit(":", 1)[1])


def measure(port: int, args: argparse.Namespace) -> dict[str, float]:
    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        await sse_latency(port, args.streams, 3, 50)  # warm-up, not measured
        s1 = await sse_latency(port, 1, args.events_1, 10)
        out["p50_1"], out["p99_1"], out["n_1"] = pct(s1, 50), pct(s1, 99), len(s1)
        s256 = await sse_latency(port, args.streams, args.events_n, 50)
        out["p50_n"], out["p99_n"], out["n_n"] = pct(s256, 50), pct(s256, 99), len(s256)
        sb = await sse_latency(port, args.streams, max(5, args.events_n // 4), 50, burst=True)
        out["p50_b"], out["p99_b"] = pct(sb, 50), pct(sb, 99)
        out["mbps"] = await bulk(port, args.bulk_mb * 1_000_000)
        out["conns"] = await max_conns(port, args.max_conns)
        return out

    return asyncio.run(run())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", default="bench", choices=["bench", "server"])
    ap.add_argument("--quick", action="store_true", help="fewer events, smaller transfer")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--max-conns", type=int, default=2000)
    args = ap.parse_args()
    if args.role == "server":
        asyncio.run(_serve())
        return 0
    args.events_1 = 100 if args.quick else 300
    args.events_n = 20 if args.quick else 60
    args.bulk_mb = 100 if args.quick else 500
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * args.max_conns + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    args.max_conns = min(args.max_conns, (want - 256) // 4)

    procs = []
    try:
        srv, up_port = start_server()
        procs.append(srv)
        results: dict[str, dict[str, float]] = {}
        results["direct"] = measure(up_port, args)
        emb, url = start_embedded()
        procs.append(emb)
        results["embedded"] = measure(make_proxy(url, up_port), args)
        binary = os.environ.get("TOXIPROXY_SERVER_BIN") or shutil.which("toxiproxy-server")
        if binary:
            real, rurl = start_real(binary)
            procs.append(real)
            results["toxiproxy-server"] = measure(make_proxy(rurl, up_port), args)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()

    d = results["direct"]
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, loopback; "
        f"1 stream: {args.events_1} events @10 ms; {args.streams} streams: {args.events_n} events @50 ms each"
    )
    print(
        f"{'path':18} {'p50 1':>8} {'p99 1':>8} {'p50 N':>8} {'p99 N':>8} {'+p50 1':>8} {'+p99 1':>8} "
        f"{'+p50 N':>8} {'+p99 N':>8} {'MB/s':>8} {'conns':>6}"
    )
    for name, r in results.items():
        added = [r[k] - d[k] for k in ("p50_1", "p99_1", "p50_n", "p99_n")]
        print(
            f"{name:18} {r['p50_1']:8.3f} {r['p99_1']:8.3f} {r['p50_n']:8.3f} {r['p99_n']:8.3f} "
            + " ".join(f"{a:8.3f}" for a in added)
            + f" {r['mbps']:8.0f} {int(r['conns']):6d}"
        )
    print(
        "(latencies in ms per SSE event; '+' = added over direct; N = %d streams, phases spread over "
        "the 50 ms tick)" % args.streams
    )
    print(
        "synchronised bursts (all %d streams write at the same instant), p50/p99 ms: " % args.streams
        + "; ".join(f"{n} {r['p50_b']:.3f}/{r['p99_b']:.3f}" for n, r in results.items())
    )
    if "toxiproxy-server" in results:
        e, t = results["embedded"], results["toxiproxy-server"]
        print(
            "embedded / toxiproxy-server ratios: "
            + ", ".join(
                f"{k} {e[k] / t[k]:.2f}"
                for k in ("p50_1", "p99_1", "p50_n", "p99_n", "p50_b", "p99_b", "mbps", "conns")
                if t[k]
            )
        )
    else:
        print("no toxiproxy-server found (PATH or TOXIPROXY_SERVER_BIN): no side-by-side figures")
    s = results["embedded"]
    goal = (
        s["p50_1"] - d["p50_1"] <= 0.2
        and s["p50_n"] - d["p50_n"] <= 0.2
        and s["p99_1"] - d["p99_1"] <= 1.0
        and s["p99_n"] - d["p99_n"] <= 1.0
    )
    print(f"goal (added <= 0.2 ms p50, <= 1 ms p99 at 1 and {args.streams} streams): {'met' if goal else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
