"""Benchmark: trace replay fidelity at 500 requests/s, side by side with the peer tools' replay of one trace.

Issue 42 asks for a Mooncake trace replayed at 500 requests/s (the seeds' load) with a send-time error
p99 of at most 1 ms and an achieved rate within ±1% of the trace's, measured beside a peer's replay of
the same trace against the same server. One run of this file:

1. writes a seeded Mooncake JSONL trace into a temporary folder: ``--rate`` requests/s for ``--seconds``
   (10,000 requests by default), Poisson arrivals with whole-millisecond timestamps as Mooncake's own
   traces have them (``--float-ms``: fractional ones), input lengths drawn from ``--input-tokens``,
   ``hash_ids`` one per 512-token block with the first full block shared among ``--prefixes`` groups
   (a shared system prompt), the rest unique, output lengths from ``--output-tokens`` (a few tokens: the
   server must never be the bottleneck);
2. starts the loopback ticker server of ``bench_load.py`` (raw asyncio protocol + httptools, every event
   pre-encoded, one ticker task writing all streams every ``--tick``; ``GET /events`` counts requests);
3. replays the trace with each client in turn, each in its own process tree, against that server:

   * ``ours``: the load generator, ``load.workload: {kind: trace, layout: mooncake, speed: 1.0}``
     (``chaos.load.driver.make_load``; ``--workers`` processes), prompts made to the exact token
     lengths with the builtin tokenizer; per request ``StreamRecord.t_scheduled`` and ``t_sent``;
   * ``run``: the same load through ``streamchaos run`` (an experiment file, the load in a process
     of its own as the CLI runs it; an ``openai`` target, so no tokenizer is known and prompts are
     about 4 characters a token), per request the journal's ``t_scheduled`` / ``t_sent``;
   * ``anchor``: what a plain Python replayer gets, as ``vllm bench serve`` sends: one aiohttp
     session, prompts made before the clock starts, ``asyncio.sleep`` to each timestamp, then a task
     that stamps ``perf_counter()`` right before ``session.post``;
   * ``aiperf``: ``aiperf profile --custom-dataset-type mooncake_trace --fixed-schedule`` (its own
     trace replay; its defaults otherwise); per request ``metadata.request_start_ns`` from
     ``profile_export.jsonl``, the schedule zero from its phase start (``start_time``), the request's
     trace line from its ``conversation_id`` (checked against its input length);
   * ``guidellm``: ``guidellm run --profile kind=replay,time_scale=0.001,schedule_turn=timestamp --data
     kind=mooncake`` (the trace's ms as seconds × 0.001); per request ``info.timings.targeted_start``
     and ``request_start`` from its JSON (it records its own schedule).

4. then, unless ``--sessions 0``, 1,000 concurrent conversations (``--sessions``) against the project's
   mock (``python -m chaos.load.mock``, chat chunks: AIPerf's completions endpoint refuses a second
   turn): ``ours`` with ``load.workload: {kind: sessions, turns: [4, 8], think_time: [1s, 3s]}``
   (closed loop, chat, 2-6 tokens a reply) and ``aiperf`` with the same shape (``--concurrency 1000``,
   turns ~N(6, 1), turn delay ~N(2 s, 0.58 s)); over ``--session-seconds`` after ``--warmup``: turns/s
   the mock answered, turns done/s, distinct sessions seen, send delay (ours: ``t_sent - t_scheduled`` of
   turns 2+, the think time's end being the schedule; AIPerf's only the credit → request start, its due
   time not exported), TTFT, client CPU, ours' event-loop lag.

Per client of the trace: requests sent and completed, the trace's rate and the achieved one (sends − 1 over the
span from the first send to the last), send-time error = actual send − scheduled send (ms: p50, p99,
max, the earliest, negative where a request left early, the share more than 1 ms late, and p99 from
the schedule's second second on: start-up apart), client CPU over the replay (its whole process tree,
from the server's first request to its last: % of one core and CPU-ms per request), the server's CPU
and the whole machine's (``host``: the neighbours' load is part of what a client gets on a shared box)
over the same window, the host's own wake-up lateness p99 (``wake``: a probe process sleeping 2 ms
again and again beside the client; no client on this host wakes more punctually), and what saturated
(``server`` or ``client``: a process of it at ≥ 90% of a core; ``host``: the machine at ≥ 90%). Then
the ratios ours / each other client. Prints figures; asserts nothing.

How each tool stamps "sent" differs a little: ours when the request's bytes are written (or its
connect starts), the anchor and GuideLLM as the request coroutine starts, AIPerf at its worker's
transport dispatch; all within a loop iteration of the write on loopback.

How to run it (about 8 minutes: GuideLLM replays slowest); ``--save`` keeps the rows as JSON::

    python benchmarks/bench_trace_replay.py [--rate 500] [--seconds 20] [--clients ours,run,anchor,aiperf,guidellm]
        [--workers 1] [--tick 0.005] [--float-ms] [--sessions 1000] [--session-seconds 15]
        [--session-clients ours,aiperf] [--nice -10] [--json | --save rows.json]

On a box shared with other work read ``host`` and ``wake`` first: when the machine is busy, every
client's p99 is the scheduler's. ``--nice -10`` (root) runs everything of the benchmark at that
niceness, the same for every client.

The peers live in virtualenvs of their own under /var/cache/streamchaos/peers (as ``bench_load.py``'s
docstring installs them: ``aiperf-venv`` with aiperf 0.13.0, ``guidellm-venv`` with torch 2.13.0 CPU
then guidellm 0.8.1); one that is missing has its row skipped with a note. Neither reaches a hub: the
builtin tokenizer is given to GuideLLM as a local folder, and to AIPerf as a Hugging Face cache entry
(``HF_HOME`` in the temporary folder, ``HF_HUB_OFFLINE=1``, ``--tokenizer streamchaos/tiny``): its
``hash_ids`` prompt synthesis decodes in worker processes that force offline mode and then look any
name up as a hub snapshot, so a plain folder path fails there (AIPerf 0.13.0).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# one server and one peer layout for both benchmarks: the ticker server, /proc readers, the peer venvs
import bench_load as bl  # noqa: E402

BLOCK_TOKENS = 512  # Mooncake's block: one hash id per 512 prompt tokens
START_S = 240.0  # a client's start until its first request (a peer tokenizes its whole dataset first)
REPORT_S = 180.0  # a client's reports after its last request
QUIET_S = 5.0  # the server saw no new request this long: the replay is over
SATURATED = 0.9  # of one core (a process), of the machine (host)
PROBE_S = 0.002  # the wake-up probe's sleep: 500 wake-ups/s, as the trace's sends
CLIENTS = ("ours", "run", "anchor", "aiperf", "guidellm")
PEERS = ("aiperf", "guidellm")
SESSION_TURNS = (4, 8)  # turns per conversation, uniform
SESSION_THINK_S = (1.0, 3.0)  # the user's pause after each reply, uniform: 1,000 sessions make ~500 turns/s
HF_REPO = "streamchaos/tiny"  # the tokenizer's name in the Hugging Face cache made for AIPerf
HF_REVISION = "0" * 39 + "1"


# ---- the trace -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceShape:
    requests: int
    rate: float  # requests/s the arrivals are drawn at
    seed: int = 1
    input_tokens: tuple[int, int] = (128, 1536)
    output_tokens: tuple[int, int] = (2, 6)
    prefixes: int = 16
    float_ms: bool = False


def make_trace(shape: TraceShape) -> list[dict[str, Any]]:
    """Seeded Mooncake records: Poisson arrivals at ``rate``; a request spanning more than one block
    starts with one of ``prefixes`` shared full blocks (a system prompt), every other block its own
    (the last one may be partial, so it is never shared: a hash id names one block size). Pure."""
    rng = random.Random(f"bench-trace:{shape.seed}")
    t_s, next_id = 0.0, shape.prefixes
    lines = []
    for _ in range(shape.requests):
        t_s += rng.expovariate(shape.rate)
        isl = rng.randint(*shape.input_tokens)
        blocks = math.ceil(isl / BLOCK_TOKENS)
        ids = [rng.randrange(shape.prefixes)] if blocks > 1 else []
        ids += range(next_id, next_id + blocks - len(ids))
        next_id += blocks - (1 if blocks > 1 else 0)
        stamp: float = round(t_s * 1e3, 3) if shape.float_ms else int(t_s * 1e3)
        lines.append({"timestamp": stamp, "input_length": isl, "output_length": rng.randint(*shape.output_tokens),
                      "hash_ids": ids})
    return lines


def trace_rate(timestamps_ms: Sequence[float]) -> float:
    """Requests/s the trace asks for: (n - 1) over its span. Pure."""
    span = (max(timestamps_ms) - min(timestamps_ms)) / 1e3
    return (len(timestamps_ms) - 1) / span if span > 0 else float("nan")


# ---- the figures (pure) ----------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile by rank (as bench_load's); NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fidelity(scheduled_s: Sequence[float], sent_s: Sequence[float], rate: float) -> dict[str, Any]:
    """Send-time error (sent - scheduled, ms) and the achieved rate of one replay, from each sent
    request's scheduled and actual send time (seconds, one clock per client). Pure."""
    errors = [(b - a) * 1e3 for a, b in zip(scheduled_s, sent_s, strict=True)]
    # the same after the first second of the schedule: a start-up cost apart from the steady state
    start = min(scheduled_s, default=0.0)
    settled = [e for a, e in zip(scheduled_s, errors, strict=True) if a >= start + 1.0]
    span = max(sent_s) - min(sent_s) if len(sent_s) > 1 else 0.0
    achieved = (len(sent_s) - 1) / span if span > 0 else float("nan")
    return {"sent": len(sent_s), "achieved_per_s": achieved, "trace_per_s": rate, "rate_share": achieved / rate,
            "err_p50_ms": pct(errors, 0.5), "err_p99_ms": pct(errors, 0.99),
            "err_max_ms": max(errors, default=math.nan), "err_min_ms": min(errors, default=math.nan),
            "abs_err_p99_ms": pct([abs(e) for e in errors], 0.99), "settled_err_p99_ms": pct(settled, 0.99),
            "late_over_1ms": sum(e > 1.0 for e in errors) / max(1, len(errors))}


@dataclass
class Replay:
    """What one client's own output says of its replay, on the clock it stamps with."""

    scheduled_s: list[float]
    sent_s: list[float]
    completed: int
    errors: int
    note: str = ""


# ---- the clients: ours, the run, the anchor (child processes of this file) -------------------------


def run_ours(args: argparse.Namespace) -> None:
    """The bare load generator replays the trace; writes its Replay to ``args.out``."""
    from chaos.load.driver import make_load
    from chaos.load.loop import run
    from chaos.load.workload import LoadSettings, LoadTarget
    from chaos.load.workloads import WorkloadSettings
    from chaos.model.context import ClientPolicy
    from chaos.model.observations import StreamRecord

    workload = WorkloadSettings(kind="trace", path=args.trace, layout="mooncake", speed=1.0,
                                tokenizer=("builtin", "tiny"))
    spec = LoadSettings(workers=args.workers, include_usage=False, request_timeout=60.0, workload=workload,
                        process="own" if args.workers > 1 else "runner")
    records: list[tuple[int | None, int | None, bool, bool]] = []  # the stamps read here, not whole records

    def keep(r: StreamRecord) -> None:
        records.append((r.t_scheduled, r.t_sent, r.error is None and r.t_end is not None, r.error is not None))

    async def replay() -> None:
        load = make_load(spec, LoadTarget(args.url, "bench", 1), policy=ClientPolicy(), sink=keep)
        await load.ready()
        await load.run(time.monotonic_ns() + int((args.span_s + 60) * 1e9))
        await load.drain(30.0)
        await load.aclose()

    run(replay())
    sent = [(a, b) for a, b, _, _ in records if a is not None and b is not None]
    _write(args.out, Replay([a / 1e9 for a, _ in sent], [b / 1e9 for _, b in sent],
                            sum(1 for r in records if r[2]), sum(1 for r in records if r[3])))


def run_through(args: argparse.Namespace) -> None:
    """The same replay through ``streamchaos run``: an experiment with one phase as long as the trace,
    the figures from its journal's stream records."""
    folder = Path(args.out).parent
    experiment = folder / "replay.yaml"
    base = args.url.removesuffix("/v1")
    experiment.write_text(
        "name: bench-trace-replay\nseed: 1\n"
        f"target: {{kind: openai, url: '{base}', model: bench}}\n"
        f"load: {{workers: {args.workers}, include_usage: false, request_timeout: 60s, "
        f"workload: {{kind: trace, path: '{args.trace}', layout: mooncake, speed: 1.0}}}}\n"
        f"phases: [{{name: replay, duration: {args.span_s + 5:.0f}s}}]\n"
        "safety: {max_duration: 600s, drain_timeout: 30s, cleanup_window: 0s}\n", encoding="utf-8")
    out = folder / "run"
    done = subprocess.run([sys.executable, "-m", "chaos", "run", str(experiment), "--out", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=args.span_s + 300)
    journal = out / "journal.jsonl"
    if done.returncode not in (0, 1) or not journal.is_file():
        raise SystemExit(f"the run failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")
    streams = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines() if '"stream"' in line]
    streams = [s for s in streams if s.get("type") == "stream" and not s.get("background")]
    sent = [s for s in streams if s.get("t_sent") is not None and s.get("t_scheduled") is not None]
    _write(args.out, Replay([s["t_scheduled"] / 1e9 for s in sent], [s["t_sent"] / 1e9 for s in sent],
                            sum(1 for s in streams if not s.get("error") and s.get("t_end") is not None),
                            sum(1 for s in streams if s.get("error"))))


def run_anchor(args: argparse.Namespace) -> None:
    """A plain replayer as ``vllm bench serve`` sends: prompts first, then sleep to each timestamp and
    start a task that stamps perf_counter() right before ``session.post``."""
    import aiohttp

    from chaos.load.loop import run

    lines = [json.loads(line) for line in Path(args.trace).read_text(encoding="utf-8").splitlines()]
    words = "the of and to in is it that for on with as was at by be this from or an are not have".split()
    rng = random.Random(1)
    # about 4 characters a token, as the generator's approximate prompts: the same bytes on the wire
    bodies = [{"model": "bench", "prompt": " ".join(rng.choices(words, k=line["input_length"])),
               "max_tokens": line["output_length"], "stream": True, "temperature": 0.0, "ignore_eos": True}
              for line in lines]
    t_first = min(line["timestamp"] for line in lines)
    scheduled, sent = [0.0] * len(lines), [0.0] * len(lines)
    done = [0, 0]  # completed, errors

    async def replay() -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
            async def request(i: int) -> None:
                sent[i] = time.perf_counter()
                try:
                    async with session.post(args.url + "/completions", json=bodies[i]) as response:
                        async for _line in response.content:
                            pass
                    done[0 if response.status == 200 else 1] += 1
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    done[1] += 1

            tasks = []
            t0 = time.perf_counter()
            for i, line in enumerate(lines):
                scheduled[i] = t0 + (line["timestamp"] - t_first) / 1e3
                delay = scheduled[i] - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(request(i)))
            await asyncio.gather(*tasks)

    run(replay())
    _write(args.out, Replay(scheduled, sent, done[0], done[1]))


def run_sessions(args: argparse.Namespace) -> None:
    """``args.sessions`` concurrent conversations (closed loop: a slot starts a new session when one ends)
    for ``args.warmup`` + ``args.seconds``; figures over the last ``args.seconds``, written to ``args.out``."""
    from chaos.load.driver import make_load
    from chaos.load.loop import run
    from chaos.load.workers import WorkerPool
    from chaos.load.workload import LoadSettings, LoadTarget, PromptSettings
    from chaos.load.workloads import WorkloadSettings
    from chaos.model.context import ClientPolicy
    from chaos.model.observations import StreamRecord

    workload = WorkloadSettings(kind="sessions", turns=SESSION_TURNS, think_time=SESSION_THINK_S)
    spec = LoadSettings(endpoint="chat", concurrency=args.sessions, workers=args.workers, include_usage=False,
                        request_timeout=60.0,
                        max_tokens=(2, 6), prompts=PromptSettings(min_chars=32, max_chars=128), workload=workload,
                        process="own" if args.workers > 1 else "runner")
    # each record kept as the few stamps read here: a heap of whole records makes the collector's pauses
    # (measured: gen-2 passes of 45-120 ms) part of what is measured
    records: list[tuple[int | None, int | None, int | None, int | None, str | None, int | None, bool]] = []

    def keep(r: StreamRecord) -> None:
        failed = r.error is not None and r.error.kind != "cancelled"
        records.append((r.t_scheduled, r.t_sent, r.t_end if r.error is None else None, r.turn, r.session, r.ttft_ns,
                        failed))

    async def converse() -> dict[str, Any]:
        load = make_load(spec, LoadTarget(args.url, "bench", 1), policy=ClientPolicy(), sink=keep)
        await load.ready()
        pids = [os.getpid()] + ([p.pid for p in load._procs if p.pid is not None]  # noqa: SLF001 - its processes
                                if isinstance(load, WorkerPool) else [])
        start = time.monotonic()
        end = start + args.warmup + args.seconds
        # sending stops a longest think time after the window: in a slot's last think time before its deadline a
        # session ends at once and the slot starts the next one, whose turn 1 goes without a think (measured:
        # turn 1s from ~100/s to ~1,900/s in the last seconds), a shape the window must not hold
        runner = asyncio.create_task(load.run(int((end + SESSION_THINK_S[1] + 1.0) * 1e9)))
        await asyncio.sleep(args.warmup)
        t0, c0 = time.monotonic_ns(), sum(bl.proc_cpu_s(p) for p in pids)
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        t1, c1 = time.monotonic_ns(), sum(bl.proc_cpu_s(p) for p in pids)
        await runner
        lag = load.lag_stats()
        await load.drain(0.0)
        await load.aclose()
        return {"t0": t0, "t1": t1, "cpu_s": c1 - c0, "lag_p99_ms": lag.get("p99_ms"), "processes": len(pids)}

    win = run(converse())
    t0, t1 = win["t0"], win["t1"]
    seconds = (t1 - t0) / 1e9
    ended = [r for r in records if r[2] is not None and t0 <= r[2] <= t1]
    sent = [r for r in records if r[1] is not None and t0 <= r[1] <= t1]
    later = [(r[1] - r[0]) / 1e6 for r in sent if r[0] is not None and r[1] is not None and (r[3] or 1) > 1]
    ttft = [r[5] / 1e6 for r in sent if r[5] is not None]
    Path(args.out).write_text(json.dumps({
        "sessions": args.sessions, "window_s": seconds, "turns_done_per_s": len(ended) / seconds,
        "turns_sent_per_s": len(sent) / seconds, "sessions_seen": len({r[4] for r in sent}),
        "delay_p50_ms": pct(later, 0.5), "delay_p99_ms": pct(later, 0.99), "delay_max_ms": max(later, default=math.nan),
        "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99),
        "errors": sum(1 for r in records if r[6]),
        "cpu_util": win["cpu_s"] / seconds, "lag_p99_ms": win["lag_p99_ms"], "processes": win["processes"]}),
        encoding="utf-8")


def _write(path: str, replay: Replay) -> None:
    Path(path).write_text(json.dumps(replay.__dict__), encoding="utf-8")


# ---- the peers: command lines and their exports --------------------------------------------------


def _hf_cache(tmp: Path, tokenizer: Path) -> Path:
    """A Hugging Face cache (HF_HOME) holding the tokenizer folder as ``streamchaos/tiny``: AIPerf finds it
    offline by that name (see the module docstring)."""
    repo = tmp / "hf" / "hub" / ("models--" + HF_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / HF_REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(HF_REVISION, encoding="ascii")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (snapshot / name).write_bytes((tokenizer / name).read_bytes())
    return tmp / "hf"


def _aiperf_cmd(args: argparse.Namespace, exe: str, out: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    return [exe, "profile", "--model", "bench", "--url", args.url.removesuffix("/v1"), "--endpoint-type",
            "completions", "--streaming", "--tokenizer", HF_REPO, "--input-file", args.trace,
            "--custom-dataset-type", "mooncake_trace", "--fixed-schedule", "--ui", "none", "--no-server-metrics",
            "--no-gpu-telemetry", "--random-seed", "1", "--artifact-dir", str(out)], {
        "HF_HOME": str(tmp / "hf"), "HF_HUB_OFFLINE": "1"}


def _guidellm_cmd(args: argparse.Namespace, exe: str, out: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """max_requests: without it GuideLLM 0.8.1 once hung after its last request (every process idle)."""
    return [exe, "run", "--backend", f"kind=openai_http,target={args.url},model=bench,request_format=/v1/completions",
            "--profile", "kind=replay,time_scale=0.001,schedule_turn=timestamp",
            "--constraint", f"kind=max_requests,count={args.requests}",
            "--tokenizer", f"kind=huggingface_auto,model={tmp / 'tokenizer'}",
            "--data", f"kind=mooncake,source.kind=json_file,source.path={args.trace}",
            "--output", f"kind=json,path={out / 'benchmarks.json'}", "--disable-console-interactive"], {
        "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def aiperf_replay(out: Path, lines: list[dict[str, Any]], log: str = "") -> Replay:
    """Per request: its trace line from ``conversation_id`` (``session_000018`` = line 18; its input length
    must match that line's), sent = ``request_start_ns``, scheduled = the profiling phase's start
    (``start_time``, wall clock) + the line's timestamp. Also AIPerf's own anchored lag p99 as a note."""
    summary = json.loads((out / "profile_export_aiperf.json").read_text(encoding="utf-8"))
    own_log = out / "logs" / "aiperf.log"  # its full log (the console shows less)
    log += own_log.read_text(encoding="utf-8", errors="replace") if own_log.is_file() else ""
    zero = _phase_start_ns(log) or int(datetime.fromisoformat(summary["start_time"]).timestamp() * 1e9)
    # its schedule's zero in trace ms: the first timestamp (it turns --fixed-schedule-auto-offset on for a
    # trace), as its log says ("Built schedule with N timestamps, zero_ms=11, auto_offset=True")
    said = re.search(r"Built schedule with \d+ timestamps, zero_ms=([\d.]+)", log)
    t_first = float(said.group(1)) if said else min(line["timestamp"] for line in lines)
    scheduled, sent, errors, mismatched = [], [], 0, 0
    for raw in (out / "profile_export.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(raw)
        meta = rec["metadata"]
        if rec.get("error"):
            errors += 1
        i = int(str(meta["conversation_id"]).rsplit("_", 1)[-1])
        isl = ((rec.get("metrics") or {}).get("input_sequence_length") or {}).get("value")
        if isl is not None and isl != lines[i]["input_length"]:
            mismatched += 1
        scheduled.append((zero + (lines[i]["timestamp"] - t_first) * 1e6) / 1e9)
        sent.append(meta["request_start_ns"] / 1e9)
    own = (summary.get("replay_sched_lag_p99") or {}).get("avg")
    note = f"its own anchored lag p99 {own:.1f} ms" if own is not None else ""
    if mismatched:
        note += f"; {mismatched} records' input length differs from their line's"
    return Replay(scheduled, sent, len(sent) - errors, errors, note.strip("; "))


def _phase_start_ns(log: str) -> int | None:
    """The profiling phase's start in ns from AIPerf's log (``PhaseRecordsStats(... start_ns=...``), finer
    than its summary's microseconds; None when the log does not say."""
    found = re.search(r"phase=CreditPhase\.PROFILING.*?start_ns=(\d+)", log)
    return int(found.group(1)) if found else None


def guidellm_replay(out: Path, lines: list[dict[str, Any]], log: str = "") -> Replay:
    """Per request ``info.timings.targeted_start`` (its schedule) and ``request_start``, wall seconds."""
    bench = json.loads((out / "benchmarks.json").read_text(encoding="utf-8"))["benchmarks"][-1]["requests"]
    scheduled, sent = [], []
    for status in ("successful", "errored", "incomplete"):
        for r in bench.get(status) or ():
            timings = (r.get("info") or {}).get("timings") or {}
            if timings.get("targeted_start") is not None and timings.get("request_start") is not None:
                scheduled.append(timings["targeted_start"])
                sent.append(timings["request_start"])
    return Replay(scheduled, sent, len(bench.get("successful") or ()), len(bench.get("errored") or ()))


PEER_COMMANDS: dict[str, Callable[..., tuple[list[str], dict[str, str]]]] = {
    "aiperf": _aiperf_cmd, "guidellm": _guidellm_cmd}
PEER_EXPORTS: dict[str, Callable[[Path, list[dict[str, Any]], str], Replay]] = {
    "aiperf": aiperf_replay, "guidellm": guidellm_replay}


# ---- the window: CPU over the replay, from the server's side ---------------------------------------


def _requests_seen(url: str) -> int:
    return bl._server_counts(url)["requests"]


def _window(url: str, tool: subprocess.Popen[bytes], server_pid: int, expect: int, span_s: float,
            log: Path) -> dict[str, Any]:
    """From the server's first request of this client to its last: the client tree's and the server's
    CPU, each process's share (which one saturated). Polls the server every 20 ms only around the two
    ends (a poll is a busy process on a 2-core box too)."""
    base = _requests_seen(url)
    deadline = time.monotonic() + START_S
    while _requests_seen(url) == base:
        if tool.poll() is not None:
            raise RuntimeError(f"exited ({tool.returncode}) before its first request: "
                               f"{log.read_text(encoding='utf-8', errors='replace').strip()[-1500:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no request in {START_S:g}s")
        time.sleep(0.02)
    t0, c0, s0, h0 = time.monotonic(), bl._tree_cpu(tool.pid), bl.proc_cpu_s(server_pid), host_busy()
    time.sleep(max(0.0, span_s - 1.0))
    last_count, last_change = _requests_seen(url), time.monotonic()
    t1, c1, s1, h1 = last_change, bl._tree_cpu(tool.pid), bl.proc_cpu_s(server_pid), host_busy()
    while last_count - base < expect and time.monotonic() - last_change < QUIET_S and tool.poll() is None:
        time.sleep(0.05)
        count = _requests_seen(url)
        if count != last_count:
            last_count, last_change = count, time.monotonic()
            t1, c1, s1, h1 = last_change, bl._tree_cpu(tool.pid), bl.proc_cpu_s(server_pid), host_busy()
    seconds = max(1e-9, t1 - t0)
    deltas = {pid: cpu - c0.get(pid, 0.0) for pid, cpu in c1.items()}
    return {"window_s": seconds, "server_requests": last_count - base, "client_cpu_s": sum(deltas.values()),
            "busiest_util": max(deltas.values(), default=0.0) / seconds, "processes": len(c1),
            "server_util": (s1 - s0) / seconds, "host_busy": (h1[0] - h0[0]) / max(1.0, h1[1] - h0[1])}


def host_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far (/proc/stat's first line), for its CPU use between
    two readings: on a shared 2-core box the neighbours' load is part of what a client gets."""
    with open("/proc/stat", encoding="ascii") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return float(sum(fields) - idle), float(sum(fields))


def probe(interval_s: float, out: str) -> None:
    """The host's own wake-up lateness: sleep ``interval_s`` again and again, record how late each wake-up
    was, until SIGTERM; then write p50/p99/max (ms) to ``out``. No client on this host wakes up more
    punctually than this (it is the scheduler's, not Python's event loop's)."""
    late: list[float] = []
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    while not stop[0]:
        target = time.monotonic() + interval_s
        time.sleep(interval_s)
        late.append((time.monotonic() - target) * 1e3)
    Path(out).write_text(json.dumps({"p50_ms": pct(late, 0.5), "p99_ms": pct(late, 0.99),
                                     "max_ms": max(late, default=math.nan), "samples": len(late)}), encoding="utf-8")


def _stop(tool: subprocess.Popen[bytes], grace: float) -> bool:
    """Wait for the client to finish its reports; end its process group (ours) if it does not."""
    try:
        tool.wait(grace)
        return False
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tool.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            tool.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tool.pid, signal.SIGKILL)
        tool.wait()
        return True


def client_round(args: argparse.Namespace, client: str, tmp: Path, lines: list[dict[str, Any]],
                 server_pid: int) -> dict[str, Any]:
    """One client's replay of the trace: start it, measure its window, read its export."""
    out = tmp / f"out-{client}"
    out.mkdir()
    scratch = out / "tmp"
    scratch.mkdir()  # its TMPDIR: what a tool leaves there goes with ours
    log = out / "client.log"
    if client in PEERS:
        exe = bl.peer_executable(client)
        assert exe is not None  # _available() checked
        cmd, extra = PEER_COMMANDS[client](args, exe, out, tmp)
    else:
        cmd = [sys.executable, __file__, "--client", client, "--trace", args.trace, "--url", args.url,
               "--out", str(out / "replay.json"), "--workers", str(args.workers), "--span-s", f"{args.span_s:.3f}"]
        extra = {}
    probed = out / "probe.json"
    prober = subprocess.Popen([sys.executable, __file__, "--probe", str(probed)], cwd=ROOT)
    with log.open("wb") as sink:
        tool = subprocess.Popen(cmd, cwd=ROOT if client not in PEERS else out, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(scratch), **extra})
    try:
        win = _window(args.url, tool, server_pid, len(lines), args.span_s, log)
    except BaseException as exc:
        _stop(tool, 0.0)
        return {"client": client, "note": f"failed: {exc}"[:400]}
    finally:
        prober.terminate()  # our own child: it writes its figures as it goes
        prober.wait(10)
    with contextlib.suppress(OSError, ValueError):
        win["wake"] = json.loads(probed.read_text(encoding="utf-8"))
    stopped = _stop(tool, REPORT_S)
    text = log.read_text(encoding="utf-8", errors="replace")
    try:
        if client in PEERS:
            replay = PEER_EXPORTS[client](out, lines, text)
        else:
            replay = Replay(**json.loads((out / "replay.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError) as exc:
        why = "stopped while writing its export" if stopped else f"exit {tool.returncode}"
        return {"client": client, **win, "note": f"{why}, no per-request export ({exc}): {text.strip()[-300:]}"}
    return {"client": client, **_row(replay, win, trace_rate([line["timestamp"] for line in lines]))}


def _row(replay: Replay, win: dict[str, Any], rate: float) -> dict[str, Any]:
    fig = fidelity(replay.scheduled_s, replay.sent_s, rate) if replay.sent_s else {}
    named = [name for name, busy in (("client", win["busiest_util"] >= SATURATED),
                                     ("server", win["server_util"] >= SATURATED),
                                     ("host", win["host_busy"] >= SATURATED)) if busy]
    return {**fig, **win, "completed": replay.completed, "errors": replay.errors,
            "client_cpu_util": win["client_cpu_s"] / win["window_s"],
            "cpu_ms_per_request": 1e3 * win["client_cpu_s"] / max(1, win["server_requests"]),
            "saturated": "+".join(named) or "none", "note": replay.note}


# ---- sessions: 1,000 concurrent conversations ------------------------------------------------------


def _aiperf_sessions_cmd(args: argparse.Namespace, exe: str, out: Path, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """AIPerf's multi-turn synthetic load with the same shape: ``--concurrency`` sessions, turns ~N(6, 1)
    (its stddev is whole),
    think time ~N(2 s, 0.58 s), 16-token user messages, 4 output tokens; it stops issuing after
    ``--benchmark-duration`` (from its first request)."""
    turns_mean = sum(SESSION_TURNS) / 2
    think_ms = sum(SESSION_THINK_S) / 2 * 1e3
    return [exe, "profile", "--model", "bench", "--url", args.url.removesuffix("/v1"), "--endpoint-type",
            "chat", "--streaming", "--tokenizer", HF_REPO, "--concurrency", str(args.sessions),
            "--conversation-num", str(args.sessions * 3), "--conversation-turn-mean", f"{turns_mean:g}",
            "--conversation-turn-stddev", f"{round((SESSION_TURNS[1] - SESSION_TURNS[0]) / math.sqrt(12))}",
            "--conversation-turn-delay-mean", f"{think_ms:g}", "--conversation-turn-delay-stddev",
            f"{(SESSION_THINK_S[1] - SESSION_THINK_S[0]) * 1e3 / math.sqrt(12):.0f}", "--isl", "16", "--osl", "4",
            "--extra-inputs", "max_tokens:4",  # the mock reads max_tokens (AIPerf's chat sends max_completion_tokens)
            "--benchmark-duration", f"{args.warmup + args.seconds + 1:g}", "--benchmark-grace-period", "5",
            "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry", "--random-seed", "1",
            "--artifact-dir", str(out)], {"HF_HOME": str(tmp / "hf"), "HF_HUB_OFFLINE": "1"}


def aiperf_sessions(out: Path, wall0: float, wall1: float) -> dict[str, Any]:
    """Turns ended in the window, TTFT of turns sent in it, and its own send delay: credit issued → request
    start (its scheduler's timer lateness is not in it: a continuation turn's due time is not exported)."""
    done, ttft, delay, errors, sessions = 0, [], [], 0, set()
    for raw in (out / "profile_export.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(raw)
        meta, metrics = rec["metadata"], rec.get("metrics") or {}
        start, end = meta["request_start_ns"] / 1e9, meta["request_end_ns"] / 1e9
        if rec.get("error"):
            errors += 1
        elif wall0 <= end <= wall1:
            done += 1
        if wall0 <= start <= wall1:
            sessions.add(meta.get("x_correlation_id"))
            if (metrics.get("time_to_first_token") or {}).get("value") is not None:
                ttft.append(float(metrics["time_to_first_token"]["value"]))
            if meta.get("credit_issued_ns") is not None and (meta.get("turn_index") or 0) > 0:
                delay.append((meta["request_start_ns"] - meta["credit_issued_ns"]) / 1e6)
    seconds = wall1 - wall0
    return {"turns_done_per_s": done / seconds, "sessions_seen": len(sessions), "delay_p50_ms": pct(delay, 0.5),
            "delay_p99_ms": pct(delay, 0.99), "delay_max_ms": max(delay, default=math.nan),
            "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99), "errors": errors,
            "note": "send delay: credit issued -> request start"}


def _answered(url: str) -> int:
    """Requests the mock (chaos.load.mock) answered to their end so far, from its /metrics."""
    import urllib.request

    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10) as response:  # noqa: S310 - loopback
        text = response.read().decode()
    found = re.search(r"^vllm:request_success_total\{[^}]*\} (\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else 0


def sessions_round(args: argparse.Namespace, client: str, tmp: Path, server_pid: int) -> dict[str, Any]:
    """One client's conversations against the mock: the window opens ``warmup`` after the mock answered the
    client's first turn."""
    out = tmp / f"sessions-{client}"
    out.mkdir()
    log = out / "client.log"
    if client == "aiperf":
        exe = bl.peer_executable(client)
        assert exe is not None
        cmd, extra = _aiperf_sessions_cmd(args, exe, out, tmp)
    else:
        cmd = [sys.executable, __file__, "--client", "sessions", "--url", args.url, "--out", str(out / "row.json"),
               "--workers", str(args.workers), "--sessions", str(args.sessions), "--seconds", str(args.session_seconds),
               "--warmup", str(args.warmup)]
        extra = {}
    with log.open("wb") as sink:
        tool = subprocess.Popen(cmd, cwd=ROOT if client != "aiperf" else out, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "TMPDIR": str(out), **extra})
    try:
        base = _answered(args.url)
        deadline = time.monotonic() + START_S
        while _answered(args.url) == base:
            if tool.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no request (exit {tool.returncode}): "
                                   f"{log.read_text(encoding='utf-8', errors='replace').strip()[-800:]}")
            time.sleep(0.02)
        first = time.monotonic()
        time.sleep(max(0.0, first + args.warmup - time.monotonic()))
        t0, w0, n0, c0, s0, h0 = (time.monotonic(), time.time(), _answered(args.url), bl._tree_cpu(tool.pid),
                                  bl.proc_cpu_s(server_pid), host_busy())
        time.sleep(max(0.0, first + args.warmup + args.session_seconds - time.monotonic()))
        t1, w1, n1, c1, s1, h1 = (time.monotonic(), time.time(), _answered(args.url), bl._tree_cpu(tool.pid),
                                  bl.proc_cpu_s(server_pid), host_busy())
    except BaseException as exc:
        _stop(tool, 0.0)
        return {"client": client, "note": f"failed: {exc}"[:400]}
    _stop(tool, REPORT_S)
    seconds = t1 - t0
    deltas = [cpu - c0.get(pid, 0.0) for pid, cpu in c1.items()]
    row: dict[str, Any] = {"client": client, "sessions": args.sessions, "server_turns_per_s": (n1 - n0) / seconds,
                           "cpu_util": sum(deltas) / seconds, "busiest_util": max(deltas, default=0.0) / seconds,
                           "server_util": (s1 - s0) / seconds, "host_busy": (h1[0] - h0[0]) / max(1.0, h1[1] - h0[1])}
    try:
        if client == "aiperf":
            row.update(aiperf_sessions(out, w0, w1))
        else:
            own = json.loads((out / "row.json").read_text(encoding="utf-8"))
            own.pop("cpu_util", None)  # the tree's over the server's window above, as for the peer
            row.update(own)
    except (OSError, ValueError, KeyError) as exc:
        row["note"] = f"no export ({exc})"
    return row


SESSION_HEADER = (f"{'client':>9} {'sessions':>8} {'seen':>6} {'turns/s':>8} {'done/s':>8} {'delay p50':>9} "
                  f"{'delay p99':>9} {'delay max':>9} {'TTFT p50':>8} {'TTFT p99':>8} {'client CPU':>10} "
                  f"{'lag p99':>8} {'server CPU':>10} {'host':>5} {'errors':>6}")


def fmt_sessions(row: dict[str, Any]) -> str:
    if "server_turns_per_s" not in row:
        return f"{row['client']:>9}  ({row.get('note', '')})"
    nan = math.nan
    return (f"{row['client']:>9} {row['sessions']:>8} {row.get('sessions_seen', 0):>6} "
            f"{row['server_turns_per_s']:>8.1f} {row.get('turns_done_per_s', nan):>8.1f} "
            f"{row.get('delay_p50_ms', nan):>7.2f}ms {row.get('delay_p99_ms', nan):>7.2f}ms "
            f"{row.get('delay_max_ms', nan):>7.1f}ms {row.get('ttft_p50_ms', nan):>6.1f}ms "
            f"{row.get('ttft_p99_ms', nan):>6.1f}ms {row['cpu_util']:>10.0%} {row.get('lag_p99_ms') or nan:>6.1f}ms "
            f"{row['server_util']:>10.0%} {row['host_busy']:>5.0%} {row.get('errors', 0):>6}"
            + (f"  ({row['note']})" if row.get("note") else ""))


# ---- the table ------------------------------------------------------------------------------------

HEADER = (f"{'client':>9} {'sent':>6} {'done':>6} {'trace/s':>7} {'achieved':>8} {'share':>7} {'err p50':>8} "
          f"{'err p99':>8} {'err max':>8} {'earliest':>8} {'>1ms':>5} {'p99 1s+':>8} {'client CPU':>10} "
          f"{'CPU-ms/req':>10} {'server CPU':>10} {'host':>5} {'wake p99':>8}  saturated")


def fmt(row: dict[str, Any]) -> str:
    if "sent" not in row:
        return f"{row['client']:>9}  ({row.get('note', '')})"
    return (f"{row['client']:>9} {row['sent']:>6} {row['completed']:>6} {row['trace_per_s']:>7.1f} "
            f"{row['achieved_per_s']:>8.1f} {row['rate_share'] - 1:>+7.2%} {row['err_p50_ms']:>6.2f}ms "
            f"{row['err_p99_ms']:>6.2f}ms {row['err_max_ms']:>6.1f}ms {row['err_min_ms']:>6.2f}ms "
            f"{row['late_over_1ms']:>5.1%} {row['settled_err_p99_ms']:>6.2f}ms {row['client_cpu_util']:>10.0%} "
            f"{row['cpu_ms_per_request']:>10.2f} "
            f"{row['server_util']:>10.0%} {row['host_busy']:>5.0%} "
            f"{(row.get('wake') or {}).get('p99_ms', math.nan):>6.2f}ms"
            f"  {row['saturated']}" + (f"  ({row['note']})" if row.get("note") else ""))


def ratios(rows: dict[str, dict[str, Any]], ours: str = "ours") -> list[str]:
    """ours / each other client: send-error p99, rate deviation, CPU per request."""
    out: list[str] = []
    a = rows.get(ours)
    if a is None or "sent" not in a:
        return out
    for name, b in rows.items():
        if name == ours or "sent" not in b:
            continue
        out.append(f"{ours + '/' + name:>18}: err p99 {a['err_p99_ms'] / max(1e-9, b['err_p99_ms']):.2f}x "
                   f"({a['err_p99_ms']:.2f} vs {b['err_p99_ms']:.2f} ms), |rate - trace| "
                   f"{abs(a['rate_share'] - 1):.2%} vs {abs(b['rate_share'] - 1):.2%}, CPU per request "
                   f"{a['cpu_ms_per_request'] / max(1e-9, b['cpu_ms_per_request']):.2f}x")
    return out


# ---- the orchestrator -----------------------------------------------------------------------------


def _available(asked: list[str]) -> list[str]:
    ready = []
    for client in asked:
        if client not in CLIENTS:
            raise SystemExit(f"unknown client {client!r}: use {', '.join(CLIENTS)}")
        if client in PEERS and bl.peer_executable(client) is None:
            print(f"{client} not found at {bl.peer_path(client)}: its row is skipped", file=sys.stderr)
            continue
        if client == "anchor":
            try:
                import aiohttp  # noqa: F401
            except ImportError:
                print("aiohttp is not installed: the anchor row is skipped", file=sys.stderr)
                continue
        ready.append(client)
    return ready


def orchestrate(args: argparse.Namespace) -> None:
    clients = _available([c for c in args.clients.split(",") if c])
    if args.nice:
        # this process's niceness, inherited by every child: the server, the probe, each client's whole tree
        try:
            os.nice(args.nice)
        except PermissionError:
            raise SystemExit(f"--nice {args.nice}: a negative niceness needs root") from None
    shape = TraceShape(requests=round(args.rate * args.seconds), rate=args.rate, seed=args.seed,
                       input_tokens=_pair(args.input_tokens), output_tokens=_pair(args.output_tokens),
                       prefixes=args.prefixes, float_ms=args.float_ms)
    lines = make_trace(shape)
    server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "bench_load.py"), "--serve", "--tick",
                               str(args.tick)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    rows: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-trace-") as name:
            tmp = Path(name)
            trace = tmp / "trace.jsonl"
            trace.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
            _hf_cache(tmp, bl._tokenizer_dir(tmp))
            assert server.stdout is not None
            args.url = f"http://127.0.0.1:{int(server.stdout.readline().split()[1])}/v1"
            args.trace, args.requests = str(trace), len(lines)
            stamps = [line["timestamp"] for line in lines]
            args.span_s = (max(stamps) - min(stamps)) / 1e3
            if not args.json:
                print(f"trace: {len(lines):,} requests over {args.span_s:.1f}s ({trace_rate(stamps):.1f}/s, Poisson, "
                      f"{'fractional' if args.float_ms else 'whole'}-ms timestamps), input {shape.input_tokens[0]}-"
                      f"{shape.input_tokens[1]} tokens, output {shape.output_tokens[0]}-{shape.output_tokens[1]}; "
                      f"server tick {args.tick * 1e3:g} ms; ours with {args.workers} worker(s); niceness "
                      f"{os.nice(0)}; load average {os.getloadavg()[0]:.2f}")
                print(HEADER, flush=True)
            for client in clients:
                row = client_round(args, client, tmp, lines, server.pid)
                row["load_avg"] = os.getloadavg()[0]
                rows[client] = row
                if not args.json:
                    print(fmt(row), flush=True)
            if not args.json:
                for line in ratios(rows) + ratios(rows, "run"):
                    print(line)
            if args.sessions > 0:
                sessions_part(args, tmp, rows)
    finally:
        server.terminate()  # our own child
        server.wait(10)
    if args.json:
        print(json.dumps(list(rows.values()), indent=1))
    if args.save:
        Path(args.save).write_text(json.dumps(list(rows.values()), indent=1), encoding="utf-8")


def sessions_part(args: argparse.Namespace, tmp: Path, rows: dict[str, dict[str, Any]]) -> None:
    """The conversations, against the project's mock (``python -m chaos.load.mock``: it answers chat
    requests as chat chunks, which AIPerf's multi-turn needs; its completions endpoint refuses a second turn)."""
    talkers = [c for c in ("ours", "aiperf") if c in args.session_clients.split(",")
               and (c == "ours" or bl.peer_executable(c) is not None)]
    mock = subprocess.Popen([sys.executable, "-m", "chaos.load.mock", "--tick", str(args.tick)], stdout=subprocess.PIPE,
                            text=True, cwd=ROOT)
    try:
        assert mock.stdout is not None
        args.url = f"http://127.0.0.1:{int(mock.stdout.readline().split()[1])}/v1"
        _converse(args, talkers, tmp, mock.pid, rows)
    finally:
        mock.terminate()  # our own child
        mock.wait(10)


def _converse(args: argparse.Namespace, talkers: list[str], tmp: Path, server_pid: int,
              rows: dict[str, dict[str, Any]]) -> None:
    if not args.json:
        print(f"\nsessions: {args.sessions:,} concurrent conversations, {SESSION_TURNS[0]}-{SESSION_TURNS[1]} turns, "
              f"think time {SESSION_THINK_S[0]:g}-{SESSION_THINK_S[1]:g} s, {args.session_seconds:g} s window after "
              f"{args.warmup:g} s; load average {os.getloadavg()[0]:.2f}")
        print(SESSION_HEADER, flush=True)
    for client in talkers:
        row = sessions_round(args, client, tmp, server_pid)
        row["load_avg"] = os.getloadavg()[0]
        rows[f"sessions-{client}"] = row
        if not args.json:
            print(fmt_sessions(row), flush=True)


def _pair(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="the trace's requests/s")
    parser.add_argument("--seconds", type=float, default=20.0, help="the trace's length (requests = rate x seconds)")
    parser.add_argument("--clients", default="ours,run,anchor,aiperf,guidellm")
    parser.add_argument("--workers", type=int, default=1, help="our load processes")
    parser.add_argument("--tick", type=float, default=0.005, help="seconds between the server's events of a stream")
    parser.add_argument("--input-tokens", default="128,1536")
    parser.add_argument("--output-tokens", default="2,6")
    parser.add_argument("--prefixes", type=int, default=16, help="shared first blocks")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--float-ms", action="store_true", help="fractional-ms timestamps (Mooncake's are whole)")
    parser.add_argument("--sessions", type=int, default=1000, help="concurrent conversations in the second part "
                        "(0: skip it)")
    parser.add_argument("--session-clients", default="ours,aiperf")
    parser.add_argument("--session-seconds", type=float, default=15.0, help="the sessions' measured window")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before the sessions' window")
    parser.add_argument("--nice", type=int, default=0,
                        help="run everything (server, probe, every client's processes) at this niceness, e.g. -10 "
                             "(root): on a box shared with other work, closer to a client host of its own; the same "
                             "for every client")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the tables")
    parser.add_argument("--save", help="also write the rows as JSON to this file")
    parser.add_argument("--client", choices=("ours", "run", "anchor", "sessions"), help=argparse.SUPPRESS)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--span-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(PROBE_S, args.probe)
        return
    if args.client:
        {"ours": run_ours, "run": run_through, "anchor": run_anchor, "sessions": run_sessions}[args.client](args)
        return
    orchestrate(args)


if __name__ == "__main__":
    main()
