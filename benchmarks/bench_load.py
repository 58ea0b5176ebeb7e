"""Benchmark: the load generator at production scale, beside a vLLM-bench-style aiohttp client and peer tools.

A loopback SSE server (this file, ``--serve``) streams ``--tokens`` content events per request, one
every ``--tick`` seconds, so requests turn over (closed loop: each stream sends its next request
when one ends). The server is built to cost less per event than any client: every event is a
pre-encoded chunk, one ticker task writes them all. Per configuration (N streams, W worker
processes) each client runs in its own process against the same server, side by side:

* ``ours``: ``chaos.load`` (``make_load``: LoadGenerator, or WorkerPool for W > 1);
* ``run``: the same load through a real experiment (``streamchaos run``, its defaults: the load in
  a process of its own), figures from the run's journal, CPU of the runner's whole process tree;
* ``aiohttp``: the anchor, the client of ``vllm bench serve`` (one ``aiohttp.ClientSession`` with a
  ``TCPConnector``, ``async for line in response.content``, ``json.loads`` per event), W = 1 only;
* the peer tools users would pick instead, each as its users run it (its own CLI, its own process
  tree; W is its worker-process count): ``aiperf`` (``aiperf profile --endpoint-type completions
  --streaming --concurrency N --benchmark-duration``, ``--workers-max W``), ``guidellm`` (``guidellm run
  --profile kind=concurrent,streams=N --constraint kind=max_duration``, ``GUIDELLM__MAX_WORKER_PROCESSES=W``)
  and ``inference-perf`` (a config with load type ``concurrent``: N streams, a count of requests that
  outlasts the window, ``num_workers: W``). All stream /v1/completions with 16-token prompts and
  ``--tokens`` max tokens, tokenize with the project's tiny tokenizer from a local folder (nothing from
  the hub), and write their per-request export to a temporary folder. Their window opens ``--warmup``
  after the server saw the tool's first request (its start-up, up to tens of seconds, stays outside);
  events/s are the server's count of events written in the window (``GET /events``), CPU is the tool's
  whole process tree's, TTFT is the tool's own (its per-request export, requests sent in the window),
  RSS is the sum over its processes (pages a fork shares count in each); its event-loop lag is not ours
  to see (nan).

Columns: events/s delivered (in the measured window) and as a share of offered (N / tick), the
client's event-loop lag p50/p99 (same monitor in both), client CPU-ms per 1,000 events (all its
processes, window only) and its CPU use (% of one core: on a shared machine, what it got), TTFT
p50/p99 (sent → first content), the server's CPU use (% of one core) and which process saturated:
``server`` when it used ≥ 90% of a core, ``client`` when its lag p99 exceeded the threshold or a
process of it used ≥ 90% of a core. Prints figures; asserts nothing.

    python benchmarks/bench_load.py [--streams 64,256,512,1024] [--workers 1,2] [--tokens 64]
                                    [--through-run [--pairs 6]] [--tick 0.02] [--seconds 5] [--warmup 1.5]
                                    [--gzip] [--json] [--first-hold 0.05]
                                    [--clients ours,run,aiohttp,aiperf,guidellm,inference-perf]
    python benchmarks/bench_load.py --http 2 [--streams 256,1024] [--connections 1,8,64]
                                    [--stream-window 16777216] [--first-hold 0.05] [--seconds 8] [--warmup 2] [--json]

``--http 2``: the HTTP/2 client (``chaos.load.http2``) beside the HTTP/1.1 one. The server also speaks h2c
with prior knowledge (``h2c_server.py``: a connection that opens with the HTTP/2 preface; the same events,
``/events`` counts and first holds, each event a DATA frame built once per stream and written by a ticker of
its own, a connection's due frames in one write). Per (N streams, C connections), in one round, each in its
own process: ``ours`` over HTTP/2 (``load.http`` version 2, ``streams_per_connection`` = ceil(N / C)) and
``ours`` over HTTP/1.1 (N connections, as the rounds above), in alternating order, and the ratio h2 / h1.1
of events/s and of CPU per event; besides the columns above, TTFT p50 minus the server's true hold p50
(with ``--first-hold``) and the connections the HTTP/2 client opened. The server does no flow control (it
never waits on the client's window) and the client runs with a ``--stream-window`` its responses never use
up, so this is the client's cost per event, not flow control's.

Needs aiohttp for the anchor (``pip install -e '.[dev]'``); without it the anchor rows are skipped. Each
peer tool lives in a virtualenv of its own (their pins are not ours), found from ``$STREAMCHAOS_AIPERF``,
``$STREAMCHAOS_GUIDELLM``, ``$STREAMCHAOS_INFERENCE_PERF`` (the executable) or under
/var/cache/streamchaos/peers; one that is missing has its rows skipped, with a note. As measured here:

    cd /var/cache/streamchaos/peers
    python3.11 -m venv aiperf-venv && aiperf-venv/bin/pip install aiperf==0.13.0
    python3.11 -m venv guidellm-venv && guidellm-venv/bin/pip install torch==2.13.0 \
        && guidellm-venv/bin/pip install guidellm==0.8.1        # torch first: the CPU wheel, not CUDA's
    python3.12 -m venv inference-perf-venv && inference-perf-venv/bin/pip install inference-perf==0.7.0
                                                                # it needs Python >= 3.12
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
MODELS = b'{"object":"list","data":[{"id":"bench","object":"model"}]}'
LAG_THRESHOLD_S = 0.005
TAIL_S = 2.0  # --through-run: the same load after the measured phase (see run_through)


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


def serve(port: int, tick: float, compress: bool = False, first_hold: float = 0.0, h2c: bool = False) -> None:
    """``compress``: answer a client that sends Accept-Encoding with gzip, each event sync-flushed in
    its own chunk (as nginx's gzip filter does for an unbuffered upstream). ``first_hold``: hold each
    stream's first event that long after its request arrived, and record the hold as it really was
    (``GET /holds`` returns their p50/p99 and clears them): the wire TTFT a client should measure.
    ``h2c``: a connection that opens with the HTTP/2 preface is served in HTTP/2 (``h2c_server.py``: the
    same events, holds and counts, by a ticker of its own), any other in HTTP/1.1 as without it."""
    import zlib

    import httptools

    def chunk(payload: bytes) -> bytes:
        return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"

    def event(finish: str | None) -> bytes:
        obj = {"id": "cmpl-bench", "object": "text_completion", "created": 0, "model": "bench",
               "choices": [{"index": 0, "text": "tok ", "logprobs": None, "finish_reason": finish}]}
        return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    head = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    gzip_head = head.replace(b"transfer-encoding", b"content-encoding: gzip\r\ntransfer-encoding")
    token, last = event(None), event("length")
    done = chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    raw_token, raw_last = token.split(b"\r\n", 1)[1][:-2], last.split(b"\r\n", 1)[1][:-2]
    active: dict[int, list[Any]] = {}  # id → [transport, tokens left, compressor or None]
    holds: list[float] = []  # seconds from a request's arrival to its first event's write
    counts = [0, 0]  # content events written, requests answered: GET /events (a peer tool's figures)

    def squeeze(comp: Any, payload: bytes, end: bool = False) -> bytes:
        data = comp.compress(payload) + comp.flush(zlib.Z_FINISH if end else zlib.Z_SYNC_FLUSH)
        return chunk(data) + (b"0\r\n\r\n" if end else b"")

    class Conn(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: asyncio.Transport = transport  # type: ignore[assignment]  # uvloop: not a subclass
            self.parser = httptools.HttpRequestParser(self)
            self.body = b""
            self.gzip = False

        def on_header(self, name: bytes, value: bytes) -> None:
            if compress and name.lower() == b"accept-encoding" and b"gzip" in value.lower():
                self.gzip = True

        def data_received(self, data: bytes) -> None:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.transport.close()

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_url(self, url: bytes) -> None:
            self.url = url

        def on_message_complete(self) -> None:
            if self.parser.get_method() == b"GET":  # preflights (model list, health); the bench's own
                path = getattr(self, "url", b"").split(b"?")[0].rstrip(b"/")
                body = _get_body(path, holds, counts)
                self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                                     % (b"404 Not Found" if body is None else b"200 OK", len(body or b""), body or b""))
                return
            tokens = _max_tokens(self.body)
            self.body = b""
            counts[1] += 1
            comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if self.gzip else None
            self.gzip = False
            self.transport.write(gzip_head if comp is not None else head)
            if first_hold > 0:
                # the hold recorded from time.monotonic(), not loop.time(): uvloop's is libuv's cached loop
                # time in whole milliseconds, which read a hold of 50.0-51.x ms as 50
                asyncio.get_running_loop().call_later(first_hold, self._first, time.monotonic(), max(1, tokens), comp)
            else:
                active[id(self)] = [self.transport, max(1, tokens), comp]

        def _first(self, arrived: float, tokens: int, comp: Any) -> None:
            if self.transport.is_closing():
                return
            holds.append(time.monotonic() - arrived)
            counts[0] += 1
            if tokens == 1:
                self.transport.write(last + done if comp is None
                                     else squeeze(comp, raw_last + b"data: [DONE]\n\n", end=True))
                return
            self.transport.write(token if comp is None else squeeze(comp, raw_token))
            active[id(self)] = [self.transport, tokens - 1, comp]

        def connection_lost(self, exc: Exception | None) -> None:
            active.pop(id(self), None)

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            finished = []
            counts[0] += len(active)
            for key, entry in active.items():
                transport, comp = entry[0], entry[2]
                entry[1] -= 1
                if entry[1] > 0:
                    transport.write(token if comp is None else squeeze(comp, raw_token))
                else:
                    transport.write(last + done if comp is None
                                    else squeeze(comp, raw_last + b"data: [DONE]\n\n", end=True))
                    finished.append(key)
            for key in finished:
                del active[key]

    async def main() -> None:
        loop = asyncio.get_running_loop()
        if h2c:
            from h2c_server import h2c_protocols  # beside this file

            factory, h2_ticker = h2c_protocols(
                first_hold=first_hold, token=raw_token, last=raw_last + b"data: [DONE]\n\n", holds=holds,
                counts=counts, max_tokens=_max_tokens, get_body=lambda path: _get_body(path, holds, counts),
                http1=Conn)
            server = await loop.create_server(factory, "127.0.0.1", port, backlog=4096)
            print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
            await asyncio.gather(ticker(), h2_ticker(tick))
            return
        server = await loop.create_server(Conn, "127.0.0.1", port, backlog=4096)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await ticker()

    from chaos.load.loop import run

    run(main())


def _max_tokens(body: bytes) -> int:
    """The events a request asks for: ``max_tokens`` or ``max_completion_tokens`` (AIPerf's), else 16."""
    try:
        req = json.loads(body)
        return int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
    except (ValueError, AttributeError, TypeError):
        return 16


def _get_body(path: bytes, holds: list[float], counts: list[int]) -> bytes | None:
    """A GET's JSON body (None: 404): the model list and /health (preflights: a run's, GuideLLM's); the
    true holds; /events: content events written and requests answered so far, for a peer tool's row."""
    if path == b"/v1/models":
        return MODELS
    if path == b"/health":
        return b"{}"
    if path == b"/holds":
        return _hold_summary(holds)
    if path == b"/events":
        return json.dumps({"events": counts[0], "requests": counts[1]}).encode()
    return None


def _hold_summary(holds: list[float]) -> bytes:
    """The recorded first-event holds as JSON (p50/p99 in ms), then forgotten: one client's round each."""
    ordered, n = sorted(holds), len(holds)
    holds.clear()
    pick = (lambda q: round(ordered[min(n - 1, int(q * n))] * 1e3, 3)) if n else (lambda q: None)
    return json.dumps({"n": n, "p50_ms": pick(0.5), "p99_ms": pick(0.99)}).encode()


def _rss_mb(pids: list[int]) -> float:
    """Resident memory of these processes in MB (from /proc; 0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
                total += int(fh.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total * os.sysconf("SC_PAGE_SIZE") / 1e6


# ---- the clients ---------------------------------------------------------------------------------


async def _window(start_at: float, end_at: float, pids: list[int], server_pid: int) -> dict[str, float]:
    """Sample CPU of the client processes and the server at the window's start and end."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    t0, c0, s0 = time.monotonic(), [proc_cpu_s(p) for p in pids], proc_cpu_s(server_pid)
    await asyncio.sleep(max(0.0, end_at - time.monotonic()))
    t1, c1, s1 = time.monotonic(), [proc_cpu_s(p) for p in pids], proc_cpu_s(server_pid)
    return {"t0": t0, "t1": t1, "client_cpu_s": sum(c1) - sum(c0),
            "max_proc_cpu_s": max(b - a for a, b in zip(c0, c1, strict=True)), "server_cpu_s": s1 - s0}


async def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from chaos.load.driver import make_load
    from chaos.load.workers import WorkerPool
    from chaos.load.workload import LoadSettings, LoadTarget, PromptSettings
    from chaos.model.context import ClientPolicy
    from chaos.model.observations import StreamRecord

    spec: Any = LoadSettings(concurrency=args.streams, workers=args.workers, max_tokens=(args.tokens, args.tokens),
                        request_timeout=60.0, include_usage=False, lag_threshold=LAG_THRESHOLD_S,
                        prompts=PromptSettings(min_chars=32, max_chars=64))
    if args.http == "2":  # --http 2: the streams spread over --connections, each with a window never used up
        spec = LoadSettings.of(spec, http_version="2", streams_per_connection=_per_connection(args),
                               stream_window=args.stream_window)
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
    win["rss_mb"] = _rss_mb(pids)
    await load.drain(0.0)  # cancel what is left: only the window counts
    lag = load.refresh_lag() if isinstance(load, WorkerPool) else None
    lag_stats = await lag if lag is not None else load.lag_stats()
    connects = getattr(getattr(load, "_http", None), "connects", None)  # the bare generator's connections opened
    await load.aclose()
    t0, t1 = int(win["t0"] * 1e9), int(win["t1"] * 1e9)
    events = sum(1 for r in records for t in r.t_content if t0 <= t <= t1)
    ttft = [r.ttft_ns / 1e6 for r in records if r.ttft_ns is not None and r.t_sent is not None and t0 <= r.t_sent <= t1]
    errors = sum(1 for r in records if r.error is not None and r.error.kind != "cancelled")
    row = _row(args, win, events, ttft, errors, lag_stats["p50_ms"], lag_stats["p99_ms"], len(pids))
    if args.http == "2":
        row.update(http="2", connections=args.connections, streams_per_connection=_per_connection(args),
                   stream_window=args.stream_window, connects=connects)
    return row


def _per_connection(args: argparse.Namespace) -> int:
    """--http 2: streams per connection, so that the streams fill ``--connections`` connections."""
    return -(-args.streams // max(1, args.connections))


async def run_aiohttp(args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    from chaos.load.lag import LagMonitor

    monitor = LagMonitor(threshold_s=LAG_THRESHOLD_S)
    stamps: list[float] = []
    ttfts: list[tuple[float, float]] = []
    errors = [0]
    # as `vllm bench serve` sets up its session
    connector = aiohttp.TCPConnector(limit=args.streams, limit_per_host=args.streams, ttl_dns_cache=300,
                                     use_dns_cache=True, keepalive_timeout=60, enable_cleanup_closed=True,
                                     force_close=False)
    session = aiohttp.ClientSession(connector=connector, trust_env=True,
                                    timeout=aiohttp.ClientTimeout(total=6 * 60 * 60))
    url = args.url + "/completions"

    async def request(n: int) -> None:
        payload = {"model": "bench", "prompt": f"{n} the quick brown fox jumps over the lazy dog",
                   "max_tokens": args.tokens, "stream": True, "temperature": 0.0, "ignore_eos": True}
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
    win["rss_mb"] = _rss_mb([os.getpid()])
    for task in slots:
        task.cancel()
    await asyncio.gather(*slots, return_exceptions=True)
    await session.close()
    lag = monitor.summary()
    await monitor.stop()
    events = sum(1 for t in stamps if win["t0"] <= t <= win["t1"])
    ttft = [v * 1e3 for s, v in ttfts if win["t0"] <= s <= win["t1"]]
    return _row(args, win, events, ttft, errors[0], lag["p50_ms"], lag["p99_ms"], 1)


def _tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo.extend(children.get(pid, []))
    return pids


def run_through(args: argparse.Namespace) -> dict[str, Any]:
    """The same load through a real experiment: ``streamchaos run`` with a warm-up phase, a measured
    one and a tail against the bench server, figures from the run's journal (stamps as it judges
    them), CPU of the runner's whole process tree (load workers included) over the measured phase.

    The CPU is read when this process sees the measured phase's start and end in the journal, a
    poll (20 ms) or more after the runner wrote them; the events counted for it are the ones
    stamped between those two readings (one monotonic clock), so the two cover one interval. The
    tail phase keeps the same load running past the end, so what a late reading takes in is more
    of the same, not the run's teardown (its report's charts are seconds of CPU)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-run-") as tmp:
        experiment = Path(tmp) / "bench.yaml"
        experiment.write_text(
            "name: bench-through-run\nseed: 1\n"
            f"target: {{kind: openai, url: '{args.url.removesuffix('/v1')}', model: bench}}\n"
            f"load: {{concurrency: {args.streams}, workers: {args.workers}, max_tokens: {args.tokens}, "
            f"include_usage: false, request_timeout: 60s, lag_threshold: {LAG_THRESHOLD_S * 1e3:g}ms, "
            "prompts: {min_chars: 32, max_chars: 64}}\n"
            f"phases: [{{name: warmup, duration: {args.warmup}s}}, {{name: measured, duration: {args.seconds}s}}, "
            f"{{name: tail, duration: {TAIL_S}s}}]\n"
            "safety: {max_duration: 300s, drain_timeout: 0s, cleanup_window: 0s}\n", encoding="utf-8")
        out = Path(tmp) / "run"
        runner = subprocess.Popen([sys.executable, "-m", "chaos", "run", str(experiment), "--out", str(out), "--quiet"],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        rss = float("nan")
        # start/end → (monotonic, tree cpu, each process's cpu, server, the runner's own cpu)
        marks: dict[str, tuple[float, float, dict[int, float], float, float]] = {}
        journal, read = out / "journal.jsonl", 0
        while runner.poll() is None and len(marks) < 2:
            # inside the measured phase, one sleep to just before its end: a poll every 20 ms is a
            # fourth busy process on the box, which the bare generator's window does not have
            time.sleep(max(0.02, marks["start"][0] + args.seconds - 0.2 - time.monotonic()) if "start" in marks
                       else 0.02)
            if not journal.is_file():
                continue
            with journal.open("rb") as fh:
                fh.seek(read)
                chunk = fh.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]
            read += len(complete)
            for line in complete.splitlines():
                if b'"measured"' not in line:  # parse only the phase lines: this process shares the box too
                    continue
                rec = json.loads(line)
                if rec.get("type") != "phase" or rec.get("name") != "measured":
                    continue
                mark = "end" if rec.get("t_end") is not None else "start"
                if mark not in marks:
                    before = time.monotonic()
                    each = _tree_cpu(runner.pid)
                    server, own = proc_cpu_s(args.server_pid), each.get(runner.pid, 0.0)
                    marks[mark] = ((before + time.monotonic()) / 2, sum(each.values()), each, server, own)
                    if mark == "end":
                        rss = _rss_mb(list(each))  # the tree just read, not a second walk of /proc
        _, err = runner.communicate(timeout=args.seconds + args.warmup + TAIL_S + 120)
        if runner.returncode not in (0, 1) or not journal.is_file():
            raise SystemExit(f"the run failed (exit {runner.returncode}): {err.strip()[-800:]}")
        records = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines()]
    phase = [r for r in records if r.get("type") == "phase" and r.get("name") == "measured"][-1]
    t0, t1 = phase["t_in_force"] or phase["t_start"], phase["t_end"]
    streams = [r for r in records if r.get("type") == "stream"]
    start, end = marks.get("start"), marks.get("end")
    if start and end:  # the interval the CPU readings cover, on the clock the stamps are on
        t0, t1 = int(start[0] * 1e9), int(end[0] * 1e9)
    events = sum(1 for r in streams for t in r.get("t_content") or () if t0 <= t <= t1)
    ttft = [(r["t_first_content"] - r["t_sent"]) / 1e6 for r in streams
            if r.get("t_first_content") is not None and r.get("t_sent") is not None and t0 <= r["t_sent"] <= t1]
    errors = sum(1 for r in streams if r.get("error") and r["error"].get("kind") != "cancelled")
    lag: dict[str, Any] = next((r["data"] for r in reversed(records)
                                if r.get("type") == "note" and r.get("topic") == "client_lag"), {})
    seconds = (t1 - t0) / 1e9
    win = {"t0": 0.0, "t1": seconds, "client_cpu_s": (end[1] - start[1]) if start and end else float("nan"),
           "max_proc_cpu_s": max((cpu - start[2].get(pid, 0.0) for pid, cpu in end[2].items()), default=0.0)
           if start and end else float("nan"),
           "server_cpu_s": (end[3] - start[3]) if start and end else float("nan"), "rss_mb": rss}
    processes = 1 + args.workers
    row = _row(args, win, events, ttft, errors, float(lag.get("p50_ms") or 0.0), float(lag.get("p99_ms") or 0.0),
               processes)
    # the runner apart from its load processes: which of the two a CPU-per-event ratio is about
    row["runner_cpu_ms_per_1k_events"] = (1e6 * (end[4] - start[4]) / max(1, events) if start and end
                                          else float("nan"))
    return row


# ---- the peer tools ------------------------------------------------------------------------------
# Each in a virtualenv of its own (their pins are not ours), found from its variable or the default
# path; each drives the same closed loop against /v1/completions (streaming), with the project's
# tokenizer from a local folder (no hub). The window opens `warmup` after the server saw the tool's
# first request, so the tool's start (imports, data generation) is outside it; its run covers it.

PEER_VENVS = Path("/var/cache/streamchaos/peers")
PEERS = {"aiperf": ("STREAMCHAOS_AIPERF", "aiperf"), "guidellm": ("STREAMCHAOS_GUIDELLM", "guidellm"),
         "inference-perf": ("STREAMCHAOS_INFERENCE_PERF", "inference-perf")}
PEER_START_S = 180.0  # a tool's start until its first request (imports, tokenizing its corpus)
PEER_REPORT_S = 120.0  # a tool's reports after its last request (inference-perf at 2,048 streams: longer)
PEER_PROMPT_TOKENS = 16


def peer_path(tool: str) -> str:
    """Where the tool's executable is looked for: ``$STREAMCHAOS_<TOOL>``, else its default virtualenv."""
    variable, name = PEERS[tool]
    return os.environ.get(variable) or str(PEER_VENVS / f"{tool}-venv" / "bin" / name)


def peer_executable(tool: str) -> str | None:
    path = peer_path(tool)
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def _tokenizer_dir(tmp: Path) -> Path:
    """The project's tiny tokenizer as a Hugging Face tokenizer folder (AutoTokenizer loads it offline)."""
    import shutil

    folder = tmp / "tokenizer"
    folder.mkdir()
    shutil.copyfile(ROOT / "chaos" / "stack" / "engine" / "data" / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>", "eos_token": "<|eos|>",
        "pad_token": "<|pad|>", "add_bos_token": False, "model_max_length": 4096}), encoding="utf-8")
    return folder


def _request_s(args: argparse.Namespace) -> float:
    """How long one request lasts at the server (its first-event hold, then one event per tick)."""
    return args.tokens * args.tick + args.first_hold


def _aiperf_cmd(args: argparse.Namespace, exe: str, out: Path, tok: Path) -> tuple[list[str], dict[str, str]]:
    """Stops issuing after --benchmark-duration (from its first request), then waits the grace for what is
    in flight: every request the window saw completes and is recorded. No HF_HUB_OFFLINE: with it set
    AIPerf 0.13 looks a local tokenizer path up as a hub snapshot and fails; a local path never hits the hub."""
    return [exe, "profile", "--model", "bench", "--url", args.url.removesuffix("/v1"), "--endpoint-type", "completions",
            "--streaming", "--tokenizer", str(tok), "--concurrency", str(args.streams),
            "--benchmark-duration", f"{args.warmup + args.seconds + 1:g}",
            "--benchmark-grace-period", f"{_request_s(args) + 2:g}", "--isl", str(PEER_PROMPT_TOKENS),
            "--osl", str(args.tokens), "--workers-max", str(args.workers), "--ui", "none", "--no-server-metrics",
            "--no-gpu-telemetry", "--random-seed", "1", "--artifact-dir", str(out)], {}


def _guidellm_cmd(args: argparse.Namespace, exe: str, out: Path, tok: Path) -> tuple[list[str], dict[str, str]]:
    """max_duration cancels what is in flight: it runs a request's length past the window's end."""
    seconds = args.warmup + args.seconds + _request_s(args) + 1
    return [exe, "run", "--backend", f"kind=openai_http,target={args.url},model=bench,request_format=/v1/completions",
            "--profile", f"kind=concurrent,streams={args.streams}", "--constraint",
            f"kind=max_duration,seconds={seconds:g}", "--tokenizer", f"kind=huggingface_auto,model={tok}",
            "--data", f"kind=synthetic_text,prompt_tokens={PEER_PROMPT_TOKENS},output_tokens={args.tokens}",
            "--output", f"kind=json,path={out / 'benchmarks.json'}", "--disable-console-interactive"], {
        "GUIDELLM__MAX_WORKER_PROCESSES": str(args.workers), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _inference_perf_cmd(args: argparse.Namespace, exe: str, out: Path, tok: Path) -> tuple[list[str], dict[str, str]]:
    """Its closed loop (load type ``concurrent``) runs a count of requests, not a time: enough for each
    stream to last the warm-up and the window, and two requests more."""
    import math

    per_stream = math.ceil((args.warmup + args.seconds + 1) / _request_s(args)) + 2
    config = {
        "load": {"type": "concurrent", "num_workers": args.workers,
                 "stages": [{"num_requests": args.streams * per_stream, "concurrency_level": args.streams}]},
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": "bench", "base_url": args.url.removesuffix("/v1"), "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tok)},
        "data": {"type": "synthetic", "input_distribution": _fixed(PEER_PROMPT_TOKENS),
                 "output_distribution": _fixed(args.tokens)},
        "report": {"request_lifecycle": {  # per request: its start and computed TTFT, not its payloads
            "summary": True, "per_stage": True, "per_request": True, "per_request_fields": {
                "request": False, "response": False, "info": False, "response_chunks": False,
                "computed_metrics": True}}},
        "storage": {"local_storage": {"path": str(out)}},
    }
    path = out / "config.json"  # JSON is YAML
    path.write_text(json.dumps(config), encoding="utf-8")
    return [exe, "--config_file", str(path)], {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _fixed(n: int) -> dict[str, int]:
    return {"min": n, "max": n, "mean": n, "std_dev": 0}


def _aiperf_results(out: Path) -> tuple[list[tuple[float, float]], int, str]:
    """(request start, TTFT ms) per request from profile_export.jsonl, errors; starts are wall-clock ns."""
    records, errors = [], 0
    for line in (out / "profile_export.jsonl").read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        ttft = (rec.get("metrics") or {}).get("time_to_first_token")
        if rec.get("error"):
            errors += 1
        elif ttft is not None:
            records.append((rec["metadata"]["request_start_ns"] / 1e9, float(ttft["value"])))
    return records, errors, "wall"


def _guidellm_results(out: Path) -> tuple[list[tuple[float, float]], int, str]:
    """(request start, TTFT ms) per successful request from benchmarks.json, errors (not the requests its
    max_duration cancelled); starts are wall-clock seconds."""
    bench = json.loads((out / "benchmarks.json").read_text(encoding="utf-8"))["benchmarks"][-1]["requests"]
    records = [(r["request_start_time"], r["time_to_first_token_ms"]) for r in bench["successful"]
               if r.get("time_to_first_token_ms") is not None]
    return records, len(bench.get("errored") or ()), "wall"


def _inference_perf_results(out: Path) -> tuple[list[tuple[float, float]], int, str]:
    """(request start, TTFT ms) per request from per_request_lifecycle_metrics.json, errors; starts are
    its perf_counter (CLOCK_MONOTONIC here, as ours)."""
    entries = json.loads((out / "per_request_lifecycle_metrics.json").read_text(encoding="utf-8"))
    records = [(e["start_time"], e["computed_metrics"]["time_to_first_token"] * 1e3) for e in entries
               if e.get("error") is None and (e.get("computed_metrics") or {}).get("time_to_first_token") is not None]
    return records, sum(1 for e in entries if e.get("error") is not None), "monotonic"


PEER_COMMANDS = {"aiperf": _aiperf_cmd, "guidellm": _guidellm_cmd, "inference-perf": _inference_perf_cmd}
PEER_RESULTS = {"aiperf": _aiperf_results, "guidellm": _guidellm_results, "inference-perf": _inference_perf_results}


def _server_counts(url: str) -> dict[str, int]:
    import urllib.request

    with urllib.request.urlopen(url.removesuffix("/v1") + "/events", timeout=10) as response:  # noqa: S310 - loopback
        counts: dict[str, int] = json.loads(response.read())
    return counts


def _tree_cpu(root: int) -> dict[int, float]:
    return {pid: proc_cpu_s(pid) for pid in _tree_pids(root)}


def _wait_first_request(args: argparse.Namespace, tool: subprocess.Popen[bytes], log: Path) -> float:
    """Monotonic time the server answered the tool's first request (polled every 20 ms)."""
    base = _server_counts(args.url)["requests"]
    deadline = time.monotonic() + PEER_START_S
    while _server_counts(args.url)["requests"] == base:
        if tool.poll() is not None:
            raise SystemExit(f"{args.client} exited ({tool.returncode}) before its first request: "
                             f"{log.read_text(encoding='utf-8', errors='replace').strip()[-1500:]}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{args.client} sent no request in {PEER_START_S:g}s")
        time.sleep(0.02)
    return time.monotonic()


def _peer_sample(args: argparse.Namespace, root: int) -> tuple[float, float, int, dict[int, float], float]:
    """(monotonic, wall clock, server events so far, CPU of each process of the tool, server CPU)."""
    cpu = _tree_cpu(root)
    return time.monotonic(), time.time(), _server_counts(args.url)["events"], cpu, proc_cpu_s(args.server_pid)


def _peer_window(args: argparse.Namespace, tool: subprocess.Popen[bytes], log: Path) -> tuple[dict[str, float], int]:
    """The measured window from the server's side: its events, the tool's whole process tree's CPU."""
    first = _wait_first_request(args, tool, log)
    time.sleep(max(0.0, first + args.warmup - time.monotonic()))
    t0, w0, e0, c0, s0 = _peer_sample(args, tool.pid)
    time.sleep(max(0.0, first + args.warmup + args.seconds - time.monotonic()))
    t1, w1, e1, c1, s1 = _peer_sample(args, tool.pid)
    deltas = [cpu - c0.get(pid, 0.0) for pid, cpu in c1.items()]
    win = {"t0": t0, "t1": t1, "wall0": w0, "wall1": w1, "client_cpu_s": sum(deltas),
           "max_proc_cpu_s": max(deltas, default=0.0), "server_cpu_s": s1 - s0, "rss_mb": _rss_mb(list(c1)),
           "processes": len(c1)}
    return win, e1 - e0


def _stop_group(tool: subprocess.Popen[bytes], grace: float) -> bool:
    """Let the tool finish writing its results, then end whatever of its process group is left (ours).
    True when it was still running after ``grace`` and we stopped it."""
    import signal

    stopped = False
    try:
        tool.wait(grace)
    except subprocess.TimeoutExpired:
        stopped = True
        if grace:
            print(f"  the tool ran on {grace:g}s past its window: stopped", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(tool.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            tool.wait(15)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(tool.pid, signal.SIGKILL)  # stragglers of its group, if any; the group is the tool's own
    tool.wait()
    return stopped


def run_peer(args: argparse.Namespace) -> dict[str, Any]:
    """A peer load tool as its users run it: events counted at the server in the window, CPU of the
    tool's whole process tree in the window, TTFT from its own per-request export (requests sent in the
    window), RSS of its processes at the window's end. Its event-loop lag is not ours to see (NaN)."""
    import tempfile

    exe = peer_executable(args.client)
    if exe is None:
        raise SystemExit(f"{args.client} not found at {peer_path(args.client)} (set ${PEERS[args.client][0]})")
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.client}-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        cmd, extra = PEER_COMMANDS[args.client](args, exe, out, _tokenizer_dir(Path(tmp)))
        log, scratch = Path(tmp) / "tool.log", Path(tmp) / "tmp"
        scratch.mkdir()  # its TMPDIR: what it leaves there (AIPerf: aiperf_mmap_*, IPC folders) goes with ours
        with log.open("wb") as sink:
            tool = subprocess.Popen(cmd, cwd=tmp, env={**os.environ, "TMPDIR": str(scratch), **extra}, stdout=sink,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            win, events = _peer_window(args, tool, log)
        except BaseException:
            _stop_group(tool, 0.0)
            raise
        grace = _request_s(args) + PEER_REPORT_S
        stopped = _stop_group(tool, grace)  # its last requests, its reports
        if tool.returncode != 0:
            # its window was measured (events at the server, its CPU): keep those, say why its TTFT is missing
            tail = log.read_text(encoding="utf-8", errors="replace").strip()[-1500:]
            print(f"  {args.client}: exit {tool.returncode} after its window: {tail}", file=sys.stderr)
            row = _row(args, win, events, [], 0, float("nan"), float("nan"), int(win["processes"]))
            row["note"] = (f"still writing its report {grace:.0f}s after its window: stopped, no TTFT export"
                           if stopped else f"exit {tool.returncode} after its window: no TTFT export")
            return row
        records, errors, clock = PEER_RESULTS[args.client](out)
    lo, hi = (win["wall0"], win["wall1"]) if clock == "wall" else (win["t0"], win["t1"])
    ttft = [ms for start, ms in records if lo <= start <= hi]
    return _row(args, win, events, ttft, errors, float("nan"), float("nan"), int(win["processes"]))


def _row(args: argparse.Namespace, win: dict[str, float], events: int, ttft: list[float], errors: int,
         lag_p50: float, lag_p99: float, processes: int) -> dict[str, Any]:
    seconds = win["t1"] - win["t0"]
    offered = args.streams / args.tick
    server_util = win["server_cpu_s"] / seconds
    proc_util = win["max_proc_cpu_s"] / seconds
    client_sat = lag_p99 > LAG_THRESHOLD_S * 1e3 or proc_util >= 0.9
    server_sat = server_util >= 0.9
    saturated = {(False, False): "none", (True, False): "client", (False, True): "server",
                 (True, True): "both"}[(client_sat, server_sat)]
    from chaos.load.loop import loop_name

    return {
        "client": args.client, "streams": args.streams, "workers": args.workers, "tokens": args.tokens,
        "tick_s": args.tick, "loop": loop_name(), "offered_per_s": offered, "events_per_s": events / seconds,
        "share_of_offered": events / seconds / offered, "lag_p50_ms": lag_p50, "lag_p99_ms": lag_p99,
        "cpu_ms_per_1k_events": 1e6 * win["client_cpu_s"] / max(1, events),
        "busiest_cpu_ms_per_1k_events": 1e6 * win["max_proc_cpu_s"] / max(1, events),
        "client_cpu_util": win["client_cpu_s"] / seconds,
        "ttft_p50_ms": pct(ttft, 0.5), "ttft_p99_ms": pct(ttft, 0.99), "requests": len(ttft), "errors": errors,
        "server_cpu_util": server_util, "server_cpu_ms_per_1k_events": 1e6 * win["server_cpu_s"] / max(1, events),
        "saturated": saturated, "processes": processes, "window_s": seconds,
        "rss_mb": win.get("rss_mb"), "rss_mb_per_1k_streams": (win.get("rss_mb") or 0.0) * 1000 / args.streams,
    }


# ---- the orchestrator ----------------------------------------------------------------------------


def _client_process(args: argparse.Namespace, client: str, streams: int, workers: int, url: str,
                    server_pid: int, extra: tuple[str, ...] = ()) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--client", client, "--streams", str(streams), "--workers", str(workers),
           "--tokens", str(args.tokens), "--tick", str(args.tick), "--seconds", str(args.seconds),
           "--warmup", str(args.warmup), "--url", url, "--server-pid", str(server_pid),
           "--first-hold", str(args.first_hold), *extra]
    timeout = args.seconds + args.warmup + 90 + (PEER_START_S + PEER_REPORT_S + 30 if client in PEERS else 0)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        print(f"  {client} N={streams} W={workers} {' '.join(extra)}: timed out", file=sys.stderr)
        return None
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        print(f"  {client} N={streams} W={workers} {' '.join(extra)}: failed (exit {out.returncode}): "
              f"{out.stderr.strip()[-800:]}", file=sys.stderr)
        return None
    row: dict[str, Any] = json.loads(lines[-1])
    return row


HEADER = (f"{'streams':>7} {'workers':>7} {'client':>14} {'offered/s':>9} {'events/s':>9} {'share':>6} "
          f"{'lag p50':>8} {'lag p99':>8} {'CPU-ms/1k':>9} {'client CPU':>10} {'TTFT p50':>8} {'TTFT p99':>8} "
          f"{'server CPU':>10} {'errors':>6}  saturated")


def _fmt(row: dict[str, Any]) -> str:
    return (f"{row['streams']:>7} {row['workers']:>7} {row['client']:>14} {row['offered_per_s']:>9.0f} "
            f"{row['events_per_s']:>9.0f} {row['share_of_offered']:>6.0%} {row['lag_p50_ms']:>6.2f}ms "
            f"{row['lag_p99_ms']:>6.1f}ms {row['cpu_ms_per_1k_events']:>9.0f} "
            f"{row['client_cpu_util']:>9.0%} "
            f"{row['ttft_p50_ms']:>6.1f}ms {row['ttft_p99_ms']:>6.1f}ms {row['server_cpu_util']:>9.0%} "
            f"{row['errors']:>6}  {row['saturated']}  RSS {row.get('rss_mb') or 0:.0f}MB"
            + (f"  true hold p50/p99 {row['true_hold']['p50_ms']:.1f}/{row['true_hold']['p99_ms']:.1f}ms"
               if row.get("true_hold") and row["true_hold"].get("n") else "")
            + (f"  ({row['note']})" if row.get("note") else ""))


def _fetch_holds(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url.removesuffix("/v1") + "/holds", timeout=10) as response:  # noqa: S310 - loopback
        held: dict[str, Any] = json.loads(response.read())
    return held


def _print_ratios(got: dict[str, dict[str, Any]]) -> None:
    """Side by side in one round: events/s and CPU per event of ``a`` over ``b`` for each pair measured."""
    for a, b in (("ours", "aiohttp"), ("run", "ours"), ("run", "aiohttp"), *(("ours", p) for p in PEERS)):
        if a in got and b in got:
            x, y = got[a], got[b]
            label = f"{a[:4]}/{b[:3]}"
            print(f"{'':>7} {'':>7} {label:>14} {'':>9} "
                  f"{x['events_per_s'] / max(1e-9, y['events_per_s']):>9.2f} {'':>6} {'':>8} {'':>8} "
                  f"{x['cpu_ms_per_1k_events'] / max(1e-9, y['cpu_ms_per_1k_events']):>9.2f} {'':>10} "
                  f"{x['ttft_p50_ms'] - y['ttft_p50_ms']:>+6.1f}ms {x['ttft_p99_ms'] - y['ttft_p99_ms']:>+6.1f}ms",
                  flush=True)


def _available(args: argparse.Namespace) -> set[str]:
    """The clients asked for that can run here; a one-line note for each that cannot."""
    asked = set(args.clients.split(","))
    unknown = asked - {"ours", "run", "aiohttp", *PEERS}
    if unknown:
        raise SystemExit(f"unknown clients: {', '.join(sorted(unknown))}")
    ready = asked & {"ours", "run"}
    if "aiohttp" in asked:
        try:
            import aiohttp  # noqa: F401

            ready.add("aiohttp")
        except ImportError:
            print("aiohttp is not installed: the anchor rows are skipped (pip install -e '.[dev]')", file=sys.stderr)
    for tool in asked & set(PEERS):
        if peer_executable(tool) is None:
            print(f"{tool} not found at {peer_path(tool)} (${PEERS[tool][0]} or its default): its rows are skipped",
                  file=sys.stderr)
        else:
            ready.add(tool)
    return ready


def _round(args: argparse.Namespace, clients: list[str], streams: int, workers: int, url: str,
           server_pid: int) -> list[dict[str, Any]]:
    """Each client in turn against the same server at one configuration, printed as it comes; with
    ``--pairs N``, the bare generator and the run N - 1 times more, and the median of their ratios.

    One pair cannot settle a bound of 1.1x on this kind of VM: the same work's CPU per event moves
    by 10-20% within a minute (the bare generator alone read 12 to 21 CPU-ms per 1,000 events in
    one hour), while the two in one pair run seconds apart."""
    import statistics

    rows: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {"events_per_s": [], "cpu_ms_per_1k_events": []}
    runner_share: list[float] = []  # the runner's own CPU per event over the bare generator's
    busiest: list[float] = []  # the run's busiest process (its load worker) over the bare's busiest
    for turn in range(max(1, args.pairs)):
        got = _clients_once(args, clients if turn == 0 else ["ours", "run"], streams, workers, url, server_pid)
        rows += got.values()
        if "ours" not in got or "run" not in got:
            if turn == 0:
                break  # no pair to repeat
            continue
        for key, values in ratios.items():
            values.append(got["run"][key] / max(1e-9, got["ours"][key]))
        runner_share.append(got["run"]["runner_cpu_ms_per_1k_events"] / max(1e-9, got["ours"]["cpu_ms_per_1k_events"]))
        busiest.append(got["run"]["busiest_cpu_ms_per_1k_events"]
                       / max(1e-9, got["ours"]["busiest_cpu_ms_per_1k_events"]))
    if args.pairs > 1 and ratios["cpu_ms_per_1k_events"] and not args.json:
        cpu, events = sorted(ratios["cpu_ms_per_1k_events"]), sorted(ratios["events_per_s"])
        loads = [c - r for c, r in zip(ratios["cpu_ms_per_1k_events"], runner_share, strict=True)]
        print(f"run/ours over {len(cpu)} pairs at {streams} streams: CPU per event median {statistics.median(cpu):.2f} "
              f"({', '.join(f'{r:.2f}' for r in cpu)}); events/s median {statistics.median(events):.2f} "
              f"({events[0]:.2f}-{events[-1]:.2f}); of the run's, the runner's own "
              f"{statistics.median(runner_share):.2f} and its load processes' {statistics.median(loads):.2f} "
              f"(medians); busiest process run/ours {statistics.median(busiest):.2f} "
              f"({', '.join(f'{r:.2f}' for r in busiest)})", flush=True)
    return rows


def _clients_once(args: argparse.Namespace, clients: list[str], streams: int, workers: int, url: str,
                  server_pid: int) -> dict[str, dict[str, Any]]:
    """Each of ``clients`` once, its row printed as it comes, then their ratios."""
    got: dict[str, dict[str, Any]] = {}
    for client in clients:
        if workers > 1 and client == "aiohttp":  # the anchor is one process
            continue
        row = _client_process(args, client, streams, workers, url, server_pid)
        if row is None:
            continue
        row["true_hold"] = _fetch_holds(url) if args.first_hold > 0 else None
        got[client] = row
        if not args.json:
            print(_fmt(row), flush=True)
    if not args.json:
        _print_ratios(got)
    return got


def orchestrate(args: argparse.Namespace) -> None:
    ready = _available(args)
    clients = [c for c in args.clients.split(",") if c in ready]
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--tick", str(args.tick),
                               "--first-hold", str(args.first_hold), *(["--gzip"] if args.gzip else [])],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    rows: list[dict[str, Any]] = []
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        url = f"http://127.0.0.1:{port}/v1"
        from chaos.load.loop import loop_name

        if not args.json:
            print(f"server: {1 / args.tick:g} events/s per stream, {args.tokens} tokens per request (turnover), "
                  f"{'gzip (sync flush per event)' if args.gzip else 'uncompressed'}, "
                  f"{args.seconds:g}s window after {args.warmup:g}s warm-up; loop {loop_name()}; "
                  f"lag threshold {LAG_THRESHOLD_S * 1e3:g}ms; load average {os.getloadavg()[0]:.2f}")
            print(HEADER, flush=True)
        for streams in (int(s) for s in args.streams.split(",")):
            for workers in (int(w) for w in args.workers.split(",")):
                if workers <= streams:
                    rows += _round(args, clients, streams, workers, url, server.pid)
    finally:
        server.terminate()  # our own child
        server.wait(10)
    if args.json:
        print(json.dumps(rows, indent=1))


# ---- --http 2: the HTTP/2 client beside the HTTP/1.1 one ------------------------------------------------

H2_HEADER = (f"{'streams':>7} {'conns':>5} {'per conn':>8} {'client':>7} {'offered/s':>9} {'events/s':>9} "
             f"{'share':>6} {'CPU-ms/1k':>9} {'client CPU':>10} {'lag p50':>8} {'lag p99':>8} {'TTFT p50':>8} "
             f"{'TTFT p99':>8} {'p50-hold':>8} {'server CPU':>10} {'errors':>6}  saturated")


def _h2_fmt(row: dict[str, Any]) -> str:
    hold = row.get("true_hold") or {}
    over = f"{row['ttft_p50_ms'] - hold['p50_ms']:>+6.1f}ms" if hold.get("n") else f"{'-':>8}"
    h2 = row.get("http") == "2"
    return (f"{row['streams']:>7} {row['connections'] if h2 else row['streams']:>5} "
            f"{row['streams_per_connection'] if h2 else 1:>8} {'h2' if h2 else 'h1.1':>7} "
            f"{row['offered_per_s']:>9.0f} {row['events_per_s']:>9.0f} {row['share_of_offered']:>6.0%} "
            f"{row['cpu_ms_per_1k_events']:>9.1f} {row['client_cpu_util']:>10.0%} {row['lag_p50_ms']:>6.2f}ms "
            f"{row['lag_p99_ms']:>6.1f}ms {row['ttft_p50_ms']:>6.1f}ms {row['ttft_p99_ms']:>6.1f}ms {over} "
            f"{row['server_cpu_util']:>10.0%} {row['errors']:>6}  {row['saturated']}"
            + (f"  ({row['connects']} connections opened)" if h2 else "")
            + (f"  true hold p50/p99 {hold['p50_ms']:.1f}/{hold['p99_ms']:.1f}ms" if hold.get("n") else ""))


def orchestrate_h2(args: argparse.Namespace) -> None:
    """``--http 2``: per (streams, connections), ``ours`` over HTTP/2 (the streams spread over the connections)
    and ``ours`` over HTTP/1.1 (a connection per stream, as the default rounds run it), each in its own process,
    in turn against one server that speaks both (``--h2c``), and the ratio h2 / h1.1. The two go in alternate
    order from one round to the next, so that a drift of the shared host does not always favour the same one."""
    server = subprocess.Popen([sys.executable, __file__, "--serve", "--h2c", "--tick", str(args.tick),
                               "--first-hold", str(args.first_hold)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    rows: list[dict[str, Any]] = []
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline().split()[1])}/v1"
        from chaos.load.loop import loop_name

        if not args.json:
            print(f"server: h2c (prior knowledge) and HTTP/1.1, {1 / args.tick:g} events/s per stream, {args.tokens} "
                  f"tokens per request (turnover); h2 stream window {args.stream_window} bytes; {args.seconds:g}s "
                  f"window after {args.warmup:g}s warm-up; loop {loop_name()}; lag threshold "
                  f"{LAG_THRESHOLD_S * 1e3:g}ms; first hold {args.first_hold * 1e3:g}ms; load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            print(H2_HEADER, flush=True)
        turn = 0
        for streams in (int(s) for s in args.streams.split(",")):
            for connections in (int(c) for c in args.connections.split(",")):
                if connections > streams:
                    continue
                h2 = ("--http", "2", "--connections", str(connections), "--stream-window", str(args.stream_window))
                got: dict[str, dict[str, Any]] = {}
                for label, extra in (("h2", h2), ("h1.1", ()))[::1 if turn % 2 == 0 else -1]:
                    row = _client_process(args, "ours", streams, 1, url, server.pid, extra)
                    if row is None:
                        continue
                    row["true_hold"] = _fetch_holds(url) if args.first_hold > 0 else None
                    row.setdefault("http", "1.1")
                    got[label] = row
                    if not args.json:
                        print(_h2_fmt(row), flush=True)
                turn += 1
                if "h2" in got and "h1.1" in got:
                    x, y = got["h2"], got["h1.1"]
                    x["h2_over_h1_events_per_s"] = x["events_per_s"] / max(1e-9, y["events_per_s"])
                    x["h2_over_h1_cpu_per_event"] = x["cpu_ms_per_1k_events"] / max(1e-9, y["cpu_ms_per_1k_events"])
                    if not args.json:
                        print(f"{'':>7} {'':>5} {'':>8} {'h2/h1.1':>7} {'':>9} {x['h2_over_h1_events_per_s']:>9.2f} "
                              f"{'':>6} {x['h2_over_h1_cpu_per_event']:>9.2f} {'':>10} {'':>8} {'':>8} "
                              f"{x['ttft_p50_ms'] - y['ttft_p50_ms']:>+6.1f}ms", flush=True)
                rows += got.values()
    finally:
        server.terminate()  # our own child
        server.wait(10)
    if args.json:
        print(json.dumps(rows, indent=1))
    elif rows:
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", default="64,256,512,1024")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--http", choices=("1.1", "2"), default="1.1",
                        help="2: the bare generator over HTTP/2 (h2c) beside it over HTTP/1.1, at each --streams and "
                             "--connections, one process each (no --workers; see this file's docstring); 1.1: the "
                             "rounds as without it")
    parser.add_argument("--connections", default="1,8,64",
                        help="--http 2: the connections the streams are spread over (streams per connection: "
                             "streams / connections, rounded up)")
    parser.add_argument("--stream-window", type=int, default=16 << 20,
                        help="--http 2: the client's receive window per stream in bytes, large enough that the "
                             "server never waits on flow control (it does not implement it)")
    parser.add_argument("--tokens", type=int, default=64, help="content events per request (turnover)")
    parser.add_argument("--tick", type=float, default=0.02, help="seconds between a stream's events")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured window per row")
    parser.add_argument("--warmup", type=float, default=1.5,
                        help="seconds before the window (connects, first requests)")
    parser.add_argument("--clients", default=None,
                        help="which clients to run (default ours,run,aiohttp): ours (the bare generator), run "
                             "(the same load through `streamchaos run`), aiohttp (the anchor), and the peer tools "
                             "aiperf, guidellm, inference-perf (each in its own virtualenv: see this file's docstring)")
    parser.add_argument("--through-run", action="store_true",
                        help="the same shape through a real experiment beside the bare generator: the clients "
                             "ours and run, with any others --clients names")
    parser.add_argument("--pairs", type=int, default=1,
                        help="with ours and run: run the two in turn this many times and print the median of "
                             "their ratios (one pair cannot settle a 10%% bound on a shared VM)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--first-hold", type=float, default=0.0,
                        help="the server holds each stream's first event this many seconds and records the true hold: "
                             "TTFT p50/p99 are then shown beside the hold the server really made")
    parser.add_argument("--gzip", action="store_true",
                        help="the server gzips each stream (sync flush per event) for clients that send "
                             "Accept-Encoding")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--h2c", action="store_true", help=argparse.SUPPRESS)  # the server: HTTP/2 too
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=("ours", "aiohttp", "run", *PEERS), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.http == "2" and not args.client and (args.clients not in (None, "ours") or args.gzip or args.through_run):
        raise SystemExit("--http 2 runs the client `ours` over HTTP/2 and over HTTP/1.1: no other --clients, no "
                         "--gzip, no --through-run")
    named = args.clients.split(",") if args.clients else ([] if args.through_run else ["ours", "run", "aiohttp"])
    args.clients = ",".join(dict.fromkeys((["ours", "run"] if args.through_run else []) + named))
    if args.serve:
        serve(args.port, args.tick, args.gzip, args.first_hold, args.h2c)
        return
    if args.client:
        args.streams, args.workers = int(args.streams), int(args.workers)
        args.connections = int(args.connections) if args.http == "2" else 0
        from chaos.load.loop import run

        if args.client == "run":
            row = run_through(args)
        elif args.client in PEERS:
            row = run_peer(args)
        else:
            row = run(run_ours(args) if args.client == "ours" else run_aiohttp(args))
        print(json.dumps(row), flush=True)
        return
    if args.http == "2":
        orchestrate_h2(args)
        return
    orchestrate(args)


if __name__ == "__main__":
    main()
