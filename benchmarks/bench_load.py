"""Benchmark: the load generator's own event-loop lag and delivered events/s against a loopback mock.

Starts ``python -m chaos.load.mock`` in its own process (one content event per stream every 20 ms,
i.e. 50 events/s per stream) and drives 1, 64 and 256 closed-loop streams with 1 and 2 worker
processes. Prints one row per configuration. A benchmark prints figures; it asserts nothing.

    python benchmarks/bench_load.py [--seconds 3] [--tick 0.02] [--streams 1,64,256] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos.load.workers import WorkerPool, make_load  # noqa: E402
from chaos.load.workload import LoadSettings, PromptSettings  # noqa: E402
from chaos.observations import StreamRecord  # noqa: E402
from chaos.context import ClientPolicy  # noqa: E402


async def one(base_url: str, streams: int, workers: int, seconds: float, tokens: int) -> dict[str, float]:
    spec = LoadSettings(
        concurrency=streams, workers=workers, max_tokens=(tokens, tokens), request_timeout=60.0,
        prompts=PromptSettings(min_chars=32, max_chars=64),
    )
    records: list[StreamRecord] = []
    load = make_load(spec, base_url=base_url, model="mock", seed=0, policy=ClientPolicy(), sink=records.append)
    if isinstance(load, WorkerPool):
        await load.ready()
    start = time.monotonic_ns()
    deadline = start + int(seconds * 1e9)
    await load.run(deadline)
    await load.drain(0.0)  # cancel what is left: only the window counts
    lag = load.lag_stats()
    await load.aclose()
    events = sum(1 for r in records for t in r.t_content if start <= t <= deadline)
    errors = sum(1 for r in records if r.error is not None and r.error.kind != "cancelled")
    return {"events_per_s": events / seconds, "p50_ms": lag["p50_ms"], "p99_ms": lag["p99_ms"], "max_ms": lag["max_ms"],
            "samples": lag["samples"], "errors": errors, "saturated": lag["saturated"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--tick", type=float, default=0.02)
    parser.add_argument("--streams", default="1,64,256")
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "chaos.load.mock", "--tick", str(args.tick)],
                              stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        base_url = f"http://127.0.0.1:{port}/v1"
        offered = 1 / args.tick
        print(f"mock: {offered:g} events/s per stream, {args.seconds:g}s per row, lag threshold 5 ms")
        print(f"{'streams':>7} {'workers':>7} {'offered/s':>10} {'events/s':>9} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} {'errors':>6}  saturated")
        for streams in (int(s) for s in args.streams.split(",")):
            for workers in (int(w) for w in args.workers.split(",")):
                if workers > streams:
                    continue
                row = asyncio.run(one(base_url, streams, workers, args.seconds, tokens=int(args.seconds / args.tick) + 50))
                print(f"{streams:>7} {workers:>7} {streams * offered:>10.0f} {row['events_per_s']:>9.0f} "
                      f"{row['p50_ms']:>7.2f}ms {row['p99_ms']:>7.2f}ms {row['max_ms']:>7.1f}ms {row['errors']:>6}  {row['saturated']}",
                      flush=True)
    finally:
        server.terminate()  # our own child
        server.wait(10)


if __name__ == "__main__":
    main()
