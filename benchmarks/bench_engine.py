"""Engine benchmark (prints figures; not a test).

    python benchmarks/bench_engine.py [--quick]

Model load time; aggregate decode tokens/s at batch 1, 8, 32 with the tiny model on CPU, intra-op
threads 1 vs 2 side by side; idle TTFT for a 32-token prompt (p50 over 30 requests, measured from
Engine.add_request to the first TokenOutput). Each configuration runs in a fresh subprocess,
because torch.set_num_threads is process-global.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(threads: int, device: str, quick: bool) -> dict:
    import torch

    from chaos.stack.engine import Engine, EngineConfig, SamplingParams

    t0 = time.perf_counter()
    eng = Engine(EngineConfig(device=device, num_threads=threads, kv_blocks=1024, max_num_seqs=64))
    load_s = time.perf_counter() - t0
    eng.start()
    res: dict = {"threads": torch.get_num_threads(), "load_s": load_s, "device": str(eng.device)}
    tok = eng.tokenizer
    base = tok.encode("The stream broke halfway through the answer, and nobody noticed 今天天气很好 🚀")

    def run_batch(bsz: int, max_tokens: int) -> float:
        done = threading.Event()
        lock = threading.Lock()
        first: dict[str, float] = {}
        left = [bsz]
        stamps: list[tuple[float, int]] = []

        def cb(out):
            with lock:
                if out.token_ids and out.request_id not in first:
                    first[out.request_id] = time.perf_counter()
                stamps.append((time.perf_counter(), len(out.token_ids)))
                if out.finished:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        for i in range(bsz):
            eng.add_request(f"b{bsz}-{i}-{time.monotonic_ns()}", base + [10 + i], params, cb)
        done.wait(300)
        # decode throughput: tokens delivered after every request has its first token (prefill over),
        # divided by the time from then to the last token
        t_start = max(first.values())
        late = [(t, n) for t, n in stamps if t > t_start]
        t_end = max(t for t, _ in late)
        return sum(n for _, n in late) / (t_end - t_start)

    n_tok = 64 if quick else 128
    run_batch(4, 8)  # warm-up
    for bsz in (1, 8, 32):
        res[f"decode_tok_s_b{bsz}"] = run_batch(bsz, n_tok)

    prompt32 = (tok.encode("Every token that leaves the server should be a complete character, never half of one. "
                           "今天天气很好 🚀 def add(a, b): return a + b") * 2)[:32]
    assert len(prompt32) == 32
    ttfts = []
    for i in range(10 if quick else 30):
        ev = threading.Event()
        stamp: list[float] = []

        def cb(out, stamp=stamp, ev=ev):
            if out.token_ids and not stamp:
                stamp.append(time.perf_counter())
            if out.finished:
                ev.set()

        time.sleep(0.02)  # idle engine
        t0 = time.perf_counter()
        eng.add_request(f"ttft-{i}", prompt32, SamplingParams(max_tokens=1), cb)
        ev.wait(10)
        ttfts.append((stamp[0] - t0) * 1000)
    res["ttft_ms_p50"] = statistics.median(ttfts)
    res["ttft_ms_p90"] = sorted(ttfts)[int(len(ttfts) * 0.9) - 1]
    eng.shutdown()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--_child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child is not None:
        print(json.dumps(measure(args._child, args.device, args.quick)))
        return
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); import chaos.stack.engine"],
                   check=True)
    import_s = time.perf_counter() - t0
    results = []
    for threads in (1, 2):
        cmd = ([sys.executable, __file__, "--_child", str(threads), "--device", args.device]
               + (["--quick"] if args.quick else []))
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    print(f"python + torch + engine import (fresh process): {import_s:.2f} s")
    print(f"{'':34s}{'1 thread':>12s}{'2 threads':>12s}")
    rows = [("model load (Engine.__init__), s", "load_s", "{:.3f}"),
            ("decode tok/s, batch 1", "decode_tok_s_b1", "{:.0f}"),
            ("decode tok/s, batch 8", "decode_tok_s_b8", "{:.0f}"),
            ("decode tok/s, batch 32", "decode_tok_s_b32", "{:.0f}"),
            ("idle TTFT p50, 32-token prompt, ms", "ttft_ms_p50", "{:.2f}"),
            ("idle TTFT p90, ms", "ttft_ms_p90", "{:.2f}")]
    for label, key, fmt in rows:
        print(f"{label:34s}" + "".join(f"{fmt.format(r[key]):>12s}" for r in results))
    print(f"goals: >= 2000 tok/s at batch 32; <= 25 ms TTFT p50  (device {results[0]['device']})")


if __name__ == "__main__":
    main()
