"""Benchmark: does the load client add latency to the times it stamps?

Starts the builtin stack (``python -m chaos.stack --port 0``) as a child process and drives it at
several concurrencies, closed loop, with identical completion bodies (stream, max_tokens 64,
ignore_eos, temperature 0) through two clients, in alternating rounds under the same conditions:

* ``ours``: ``chaos.load.client.stream_request`` over ``make_http_client`` (http1 + httptools → StreamRecord);
* ``raw``:  a minimal asyncio-streams HTTP/1.1 client written here: one keep-alive socket per slot,
  the request written by hand, chunked transfer encoding and SSE lines parsed by hand, every stamp
  taken with ``time.monotonic_ns()`` as soon as ``StreamReader.read`` returns.

Per side it prints headers→first-content, sent→first-content (TTFT), first-byte→first-content and
inter-content gaps (p50/p99, ms), plus the ratio ours/raw. A benchmark prints figures; it asserts
nothing. Loopback only, bounded request counts.

    python benchmarks/bench_client_overhead.py [--concurrency 1,16,64] [--rounds 3] [--per-slot 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chaos.load.client import make_http_client, stream_request
from chaos.model.observations import StreamRecord
from chaos.stack.process import StackProcess

MODEL = "tiny"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


def body_for(n: int) -> dict:
    # identical for both sides; the index only varies the prompt a little, the same way on both
    return {"model": MODEL, "prompt": f"{n % 7} {PROMPT}", "stream": True, "max_tokens": 64,
            "temperature": 0, "ignore_eos": True}


@dataclass
class Sample:
    t_sent: int
    t_headers: int | None = None
    t_first_byte: int | None = None
    t_first_content: int | None = None
    t_content: list[int] = field(default_factory=list)
    reads: int = 0
    error: str | None = None


# ---- (a) ours ------------------------------------------------------------------------------------

async def run_ours(url: str, concurrency: int, per_slot: int) -> list[Sample]:
    http = make_http_client(concurrency)
    out: list[Sample] = []

    async def slot(i: int) -> None:
        for k in range(per_slot):
            rec = StreamRecord(id=f"o{i}-{k}", phase="bench")
            await stream_request(http, url, body_for(i * per_slot + k), rec)
            out.append(Sample(rec.t_sent or 0, rec.t_headers, rec.t_first_byte, rec.t_first_content,
                              list(rec.t_content), rec.read_count,
                              None if rec.error is None else rec.error.message))

    try:
        await asyncio.gather(*(slot(i) for i in range(concurrency)))
    finally:
        await http.aclose()
    return out


# ---- (b) raw asyncio streams ---------------------------------------------------------------------

class RawConn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, path: str, body: dict) -> Sample:
        payload = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Accept: */*\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
        # stamped before a connection is opened, as stream_request stamps t_sent before the pool's connect
        s = Sample(time.monotonic_ns())
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.reader, self.writer
        assert reader is not None
        writer.write(head + payload)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("closed before headers")
            buf += data
        t = time.monotonic_ns()
        s.t_headers = t
        header, _, rest = buf.partition(b"\r\n\r\n")
        lines = header.split(b"\r\n")
        if b" 200 " not in lines[0] + b" ":
            s.error = lines[0].decode()
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
        if hdrs.get(b"transfer-encoding", b"").lower() != b"chunked":
            raise ConnectionError(f"expected chunked body, got {hdrs}")
        # chunked decoder + SSE line splitter, fed read by read; stamp t applies to everything in the read
        cbuf = rest
        sse = b""
        done = False
        while True:
            if cbuf and s.t_first_byte is None:
                s.t_first_byte = t
            # decode as many complete chunks as the buffer holds
            while True:
                nl = cbuf.find(b"\r\n")
                if nl < 0:
                    break
                size = int(cbuf[:nl].split(b";")[0], 16)
                if size == 0:
                    if len(cbuf) >= nl + 4:  # "0\r\n\r\n" (no trailers)
                        done = True
                    break
                if len(cbuf) < nl + 2 + size + 2:
                    break
                sse += cbuf[nl + 2 : nl + 2 + size]
                cbuf = cbuf[nl + 2 + size + 2 :]
            if s.t_first_byte is not None or sse:
                s.reads += 1
            *events, sse = sse.split(b"\n\n")
            for ev in events:
                for line in ev.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue
                    obj = json.loads(data)
                    for ch in obj.get("choices") or ():
                        if ch.get("index", 0) == 0 and ch.get("text"):
                            s.t_content.append(t)
                            if s.t_first_content is None:
                                s.t_first_content = t
            if done:
                return s
            data = await reader.read(65536)
            t = time.monotonic_ns()
            if not data:
                raise ConnectionError("closed mid-body")
            cbuf += data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


async def run_raw(url: str, concurrency: int, per_slot: int) -> list[Sample]:
    parts = urlsplit(url)
    out: list[Sample] = []

    async def slot(i: int) -> None:
        conn = RawConn(parts.hostname or "127.0.0.1", parts.port or 80)
        try:
            for k in range(per_slot):
                out.append(await conn.request(parts.path, body_for(i * per_slot + k)))
        finally:
            await conn.close()

    await asyncio.gather(*(slot(i) for i in range(concurrency)))
    return out


# ---- (c) diagnostic: ours, with the request write underneath stamped too --------------------------

async def run_tapped(url: str, concurrency: int, per_slot: int) -> tuple[list[Sample], list[float], list[float]]:
    """Like run_ours, with ``Connection.send`` (the request write) and ``data_received`` wrapped:
    how long after t_sent are the request bytes written on a reused connection (sent→write), and
    how long after a read returns is the record's stamp taken (recv→stamp: 0 by construction,
    since the stamp is the read's own, taken on entry to ``data_received``)?"""
    from chaos.load import http1

    writes: dict[int, int] = {}
    recv_to_stamp: list[float] = []
    orig_send, orig_received = http1.Connection.send, http1.Connection.data_received

    def send(self, payload, sink):  # type: ignore[no-untyped-def]
        writes[id(sink.record)] = time.monotonic_ns()
        return orig_send(self, payload, sink)

    def data_received(self, data):  # type: ignore[no-untyped-def]
        t = time.monotonic_ns()
        orig_received(self, data)
        recv_to_stamp.append((self.t_read - t) / 1e6)

    sent_to_write: list[float] = []
    http1.Connection.send, http1.Connection.data_received = send, data_received  # type: ignore[method-assign]
    try:
        http = make_http_client(concurrency)
        out: list[Sample] = []

        async def slot(i: int) -> None:
            for k in range(per_slot):
                rec = StreamRecord(id=f"t{i}-{k}", phase="bench")
                await stream_request(http, url, body_for(i * per_slot + k), rec)
                w = writes.get(id(rec))
                if w is not None and rec.t_sent is not None and k > 0:  # reused keep-alive connections only
                    sent_to_write.append((w - rec.t_sent) / 1e6)
                out.append(Sample(rec.t_sent or 0, rec.t_headers, rec.t_first_byte, rec.t_first_content,
                                  list(rec.t_content), rec.read_count))

        try:
            await asyncio.gather(*(slot(i) for i in range(concurrency)))
        finally:
            await http.aclose()
    finally:
        http1.Connection.send, http1.Connection.data_received = orig_send, orig_received  # type: ignore[method-assign]
    return out, recv_to_stamp, sent_to_write


# ---- statistics ------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def summarize(samples: list[Sample]) -> dict[str, float]:
    ok = [s for s in samples if s.error is None and s.t_first_content is not None and s.t_headers is not None]
    h2c = [(s.t_first_content - s.t_headers) / 1e6 for s in ok]  # type: ignore[operator]
    ttft = [(s.t_first_content - s.t_sent) / 1e6 for s in ok]  # type: ignore[operator]
    s2h = [(s.t_headers - s.t_sent) / 1e6 for s in ok]  # type: ignore[operator]
    gaps = [(b - a) / 1e6 for s in ok for a, b in zip(s.t_content, s.t_content[1:], strict=False)]
    total = [(s.t_content[-1] - s.t_sent) / 1e6 for s in ok if s.t_content]
    return {
        "n": len(ok), "errors": len(samples) - len(ok),
        "s2h_p50": pct(s2h, 0.5),
        "h2c_p50": pct(h2c, 0.5), "h2c_p99": pct(h2c, 0.99),
        "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
        "gap_p50": pct(gaps, 0.5), "gap_p99": pct(gaps, 0.99),
        "zero_gaps": sum(1 for g in gaps if g < 0.05) / max(1, len(gaps)),
        "content": statistics.mean(len(s.t_content) for s in ok) if ok else float("nan"),
        "reads": statistics.mean(s.reads for s in ok) if ok else float("nan"),
        "total_p50": pct(total, 0.5),
    }


COLS = [("h2c_p50", "hdr→1st p50"), ("h2c_p99", "hdr→1st p99"), ("ttft_p50", "TTFT p50"), ("ttft_p99", "TTFT p99"),
        ("s2h_p50", "sent→hdr p50"), ("gap_p50", "gap p50"), ("gap_p99", "gap p99"), ("total_p50", "e2e p50")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per side and concurrency")
    parser.add_argument("--per-slot", type=int, default=4, help="requests each closed-loop slot sends per round")
    parser.add_argument("--tap", action="store_true", help="also run ours with the request write and each read stamped")
    parser.add_argument("--stack-args", default="", help="extra args for python -m chaos.stack")
    args = parser.parse_args()
    stack = StackProcess.start("--port", "0", *args.stack_args.split())
    try:
        url = stack.base_url + "/completions"
        print(f"stack {stack.url} (pid {stack.pid}); rounds {args.rounds}, {args.per_slot} requests/slot/round; ms")
        asyncio.run(run_raw(url, 2, 2))  # warm-up (engine, allocator), not counted
        asyncio.run(run_ours(url, 2, 2))
        head = (f"{'conc':>4} {'side':>5} {'n':>4} " + " ".join(f"{label:>12}" for _, label in COLS)
                + f" {'reads':>6} {'content':>7} {'cpu/req':>8}")
        print(head)
        for conc in (int(c) for c in args.concurrency.split(",")):
            got: dict[str, list[Sample]] = {"ours": [], "raw": []}
            cpu: dict[str, float] = {"ours": 0.0, "raw": 0.0}
            for r in range(args.rounds):
                order = ("ours", "raw") if r % 2 == 0 else ("raw", "ours")
                for side in order:
                    fn = run_ours if side == "ours" else run_raw
                    c0 = time.process_time()
                    got[side] += asyncio.run(fn(url, conc, args.per_slot))
                    cpu[side] += time.process_time() - c0
            rows = {side: summarize(samples) for side, samples in got.items()}
            for side in ("ours", "raw"):
                row = rows[side]
                print(f"{conc:>4} {side:>5} {row['n']:>4} " + " ".join(f"{row[key]:>12.2f}" for key, _ in COLS)
                      + f" {row['reads']:>6.1f} {row['content']:>7.1f} "
                        f"{1e3 * cpu[side] / max(1, len(got[side])):>8.2f}"
                      + (f"  errors={row['errors']}" if row["errors"] else ""))
            ratio = " ".join(f"{rows['ours'][key] / rows['raw'][key] if rows['raw'][key] else float('nan'):>12.2f}"
                             for key, _ in COLS)
            print(f"{conc:>4} {'o/r':>5} {'':>4} {ratio}", flush=True)
            if args.tap:
                _tapped, r2s, s2w = asyncio.run(run_tapped(url, conc, args.per_slot))
                print(f"{conc:>4}  tap: recv→stamp p50 {pct(r2s, .5):.3f} p99 {pct(r2s, .99):.3f} "
                      f"max {max(r2s):.3f} (n={len(r2s)}); "
                      f"t_sent→first write (reused conn) p50 {pct(s2w, .5):.3f} p99 {pct(s2w, .99):.3f} "
                      f"(n={len(s2w)})", flush=True)
    finally:
        stack.close()
        print(f"stack stopped (exit {stack.proc.returncode})")


if __name__ == "__main__":
    main()
