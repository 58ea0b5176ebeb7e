"""Benchmark of the docker target and docker.cpu_limit, against the real daemon.

    python benchmarks/bench_docker.py [--starts 5] [--streams 6] [--tokens 64]

1. Start to first answer: the builtin stack as a child process vs the same stack in a container
   (``target.kind: docker`` without an image: this host's Python mounted into a skeleton image),
   alternated, medians side by side.
2. One container under ``docker.cpu_limit`` at several CPU shares: TTFT and streamed tokens/s of
   sequential requests, and the share of CFS periods the cgroup was throttled in, as the daemon
   reports it. The figures move together: the quota is what slows the engine.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chaos.experiment import experiment_from_dict  # noqa: E402
from chaos.model.context import RunContext  # noqa: E402
from chaos.stack.process import StackProcess  # noqa: E402
from chaos.targets.registry import running_target  # noqa: E402
from faults.docker import DockerCpuLimit  # noqa: E402


def _spec() -> object:
    return experiment_from_dict({"name": "bench", "target": {"kind": "docker"},
                                 "phases": [{"name": "p", "duration": "1s"}]}).target


async def _container_start(root: Path, i: int) -> float:
    run_dir = root / f"start-{i}"
    run_dir.mkdir()
    t0 = time.perf_counter()
    async with running_target(_spec(), target_url=None, run_dir=run_dir, seed=1, run_id=f"bench{i}"):  # type: ignore[arg-type]
        return time.perf_counter() - t0


def _process_start() -> float:
    t0 = time.perf_counter()
    stack = StackProcess.start("--port", "0")
    elapsed = time.perf_counter() - t0
    stack.close()
    return elapsed


async def _stream(client: httpx.AsyncClient, base: str, tokens: int) -> tuple[float, float]:
    body = {"model": "tiny", "prompt": "a" * 64, "max_tokens": tokens, "stream": True, "ignore_eos": True}
    sent = time.perf_counter()
    first, events = None, 0
    async with client.stream("POST", base + "/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                events += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return first - sent, events / max(end - first, 1e-9)


async def _sweep(root: Path, shares: list[float | None], streams: int, tokens: int) -> None:
    run_dir = root / "sweep"
    run_dir.mkdir()
    print(f"\ndocker.cpu_limit, one container, {streams} sequential streams of {tokens} tokens per row")
    print(f"{'cpus':>6}  {'TTFT p50':>10}  {'tokens/s p50':>12}  {'vs free':>8}  {'throttled periods':>18}")
    async with running_target(_spec(), target_url=None, run_dir=run_dir, seed=1, run_id="benchsweep") as target:  # type: ignore[arg-type]
        ctx = RunContext(seed=1, target=target.info, run_dir=run_dir)
        async with httpx.AsyncClient(timeout=120) as client:
            await _stream(client, target.info.base_url, 8)  # warm
            free_rate = None
            for cpus in shares:
                injection = None
                if cpus is not None:
                    injection = DockerCpuLimit.from_params("bench", {"cpus": cpus, "period": 0.1}).activate(ctx)
                    injection.plan()
                    await injection.inject()
                results = [await _stream(client, target.info.base_url, tokens) for _ in range(streams)]
                throttled = ""
                if injection is not None:
                    evidence = await injection.revert()
                    throttled = (f"{evidence['throttled_periods']}/{evidence['periods']} "
                                 f"({evidence['throttled_share']:.0%})")
                ttft = statistics.median(t for t, _ in results)
                rate = statistics.median(r for _, r in results)
                free_rate = free_rate or rate
                label = "none" if cpus is None else f"{cpus:g}"
                print(f"{label:>6}  {ttft * 1e3:>8.1f}ms  {rate:>12.0f}  {rate / free_rate:>8.2f}  {throttled:>18}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        process, container = [], []
        for i in range(args.starts):  # alternated, so a busy spell of the machine hits both
            process.append(await asyncio.to_thread(_process_start))
            container.append(await _container_start(root, i))
        print(f"start to first answer, {args.starts} each (median, range):")
        print(f"  child process  {statistics.median(process):.2f}s ({min(process):.2f}-{max(process):.2f})")
        print(f"  container      {statistics.median(container):.2f}s ({min(container):.2f}-{max(container):.2f})"
              f"  ratio {statistics.median(container) / statistics.median(process):.2f}")
        await _sweep(root, [None, 1.0, 0.5, 0.25, 0.1], args.streams, args.tokens)


if __name__ == "__main__":
    asyncio.run(main())
