"""vLLM on CPU beside the builtin engine, and what the streamchaos middleware costs inside vLLM
(prints figures; not a test).

    python benchmarks/bench_vllm.py [--seconds 15] [--rounds 2] [--concurrency 8]

Three servers of the same tiny model (the builtin one exported as a Hugging Face checkpoint), the
same KV budget and batch (max_num_seqs = concurrency): the builtin stack, vLLM with the
middleware (as `target.kind: vllm` runs it, every fault disarmed) and vLLM without it. All three
run at once and get the load in turns (A B C A B C ...), so a busy box weighs on each alike. All
three are confined to the same CPUs (vLLM's ``target.cpus: auto``: all but one on CPU, the last
left to this load), so the engines are compared on equal cores and the load is never starved.
Closed loop, 64-token requests that turn over (ignore_eos), streamed; per server: tokens/s
(content events/s), TTFT p50/p99, and the middleware's ratio to plain vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from chaos.model.experiment import TargetSpec  # noqa: E402
from chaos.stack.process import StackProcess  # noqa: E402
from chaos.targets.vllm import VllmTarget  # noqa: E402


async def closed_loop(url: str, model: str, seconds: float, concurrency: int) -> dict[str, float]:
    ttfts: list[float] = []
    events = 0
    deadline = time.monotonic() + seconds
    body = {"model": model, "prompt": "The stream broke halfway through the answer 今天天气很好", "max_tokens": 64,
            "stream": True, "ignore_eos": True, "temperature": 0}

    async def slot(client: httpx.AsyncClient) -> None:
        nonlocal events
        while time.monotonic() < deadline:
            sent = time.perf_counter()
            first = None
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]" and '"text":""' not in line:
                        events += 1
                        if first is None:
                            first = time.perf_counter() - sent
            if first is not None:
                ttfts.append(first)

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency * 2)) as client:
        await asyncio.gather(*(slot(client) for _ in range(concurrency)))
    q = statistics.quantiles(ttfts, n=100) if len(ttfts) > 2 else [float("nan")] * 99
    return {"tokens_s": events / (time.monotonic() - started), "ttft_p50_ms": q[49] * 1000, "ttft_p99_ms": q[98] * 1000,
            "requests": len(ttfts)}


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the stack's engine process, if it has one), from /proc."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


async def main() -> None:
    # the docstring's first paragraph (two lines); argparse joins its lines as it fills the text
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    spec = TargetSpec(kind="vllm", model="tiny", kv_blocks=512, block_size=16, max_num_seqs=args.concurrency,
                      max_model_len=512)
    with_mw = VllmTarget(spec, run_dir=run_dir / "mw", seed=0)
    plain = VllmTarget(spec, run_dir=run_dir / "plain", seed=0)
    plain.middleware = False
    for t in (with_mw, plain):
        t.run_dir.mkdir(parents=True)
    started = time.monotonic()
    infos = await asyncio.gather(with_mw.start(), plain.start())
    print(f"two vLLMs up in {time.monotonic() - started:.0f}s (vLLM {with_mw.version}, {with_mw.device})", flush=True)
    builtin = StackProcess.start("--model", str(run_dir / "mw" / "model"), "--served-model-name", "tiny",
                                 "--max-num-seqs", str(args.concurrency), "--kv-blocks", "512", timeout=120)
    if with_mw.cpus is not None:  # the builtin engine on vLLM's cores, so both are compared on equal ones
        for pid in (builtin.pid, *_children(builtin.pid)):
            os.sched_setaffinity(pid, with_mw.cpus)
    print(f"engines on CPUs {sorted(with_mw.cpus) if with_mw.cpus is not None else 'all'}; "
          f"this load on {sorted(os.sched_getaffinity(0))}", flush=True)
    servers = {"builtin": (builtin.url, "tiny"), "vllm+middleware": (infos[0].base_url[:-3], "tiny"),
               "vllm": (infos[1].base_url[:-3], "tiny")}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    try:
        for _name, (url, model) in servers.items():  # warm-up
            await closed_loop(url, model, 3, args.concurrency)
        for _ in range(args.rounds):
            for name, (url, model) in servers.items():
                results[name].append(await closed_loop(url, model, args.seconds, args.concurrency))
    finally:
        builtin.close()
        await asyncio.gather(with_mw.stop(), plain.stop())
    load = os.getloadavg()[0]
    print(f"\nclosed loop, {args.concurrency} streams, 64-token requests, {args.rounds} x {args.seconds:g}s each, "
          f"load average {load:.1f}")
    print(f"{'server':18} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'requests':>9}")
    med: dict[str, dict[str, float]] = {}
    for name, rows in results.items():
        med[name] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        m = med[name]
        print(f"{name:18} {m['tokens_s']:9.0f} {m['ttft_p50_ms']:8.1f}ms {m['ttft_p99_ms']:8.1f}ms "
              f"{m['requests']:9.0f}")
    mw, base = med["vllm+middleware"], med["vllm"]
    print(f"\nmiddleware / plain vLLM: tokens/s {mw['tokens_s'] / base['tokens_s']:.3f}x, TTFT p50 "
          f"{mw['ttft_p50_ms'] / base['ttft_p50_ms']:.3f}x, p99 {mw['ttft_p99_ms'] / base['ttft_p99_ms']:.3f}x")
    print(f"vLLM / builtin tokens/s: {base['tokens_s'] / med['builtin']['tokens_s']:.2f}x")


if __name__ == "__main__":
    os.environ.setdefault("STREAMCHAOS_VLLM_PYTHON", "/var/cache/streamchaos/vllm-venv/bin/python")
    asyncio.run(main())
