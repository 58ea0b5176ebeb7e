"""The stream hop as a real process (``python -m chaos.hops.streamhop``) between a real client and real
upstreams on 127.0.0.1: this file's own SSE server (run as a process: ``python test_streamhop.py
--upstream LOG``; its event timing is ours to set) and the builtin stack. No socket is mocked.

What it shows: a clean relay is faithful (byte for byte, event by event on time, bodies, keep-alive,
error statuses); every rule kind is seen by the client as the contract says, and deleting the rule
restores a clean relay; taps read back as ``TapRecord`` and show what each side saw; the control API
guards its token; the hop stays on loopback, stops within 2 s, and keeps its memory bounded against a
hostile upstream.
"""

from __future__ import annotations

import asyncio
import bisect
import gzip as gzip_module
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from chaos.hops.client import StreamHopAPI
from chaos.host.children import first_line, spawn
from chaos.model.errors import FaultError
from chaos.model.observations import TapRecord, from_json

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "hop-test-token-0123456789"


# -- the upstream: a small SSE server whose timing the tests set (runs as its own process) ----------------
def _event(i: int) -> bytes:
    body = {"id": "cmpl-up", "choices": [{"index": 0, "text": f"tok{i} é日本", "finish_reason": None}]}
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


FINISH = b'data: {"id": "cmpl-up", "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}\n\n'
USAGE = b'data: {"id": "cmpl-up", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}\n\n'
DONE = b"data: [DONE]\n\n"


def sse_body(n: int) -> bytes:
    """What ``/sse?n=N`` writes: N token events, a finish event, a usage event, [DONE]."""
    return b"".join([_event(i) for i in range(n)] + [FINISH, USAGE, DONE])


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve_sse(writer: asyncio.StreamWriter, q: dict[str, str]) -> bool:
    n, gap, first = int(q.get("n", "5")), float(q.get("gap", "0")), float(q.get("first", "0"))
    await asyncio.sleep(float(q.get("delay", "0")))  # before the head
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    encode = q.get("gzip") == "1"
    z = zlib.compressobj(6, zlib.DEFLATED, 31) if encode else None
    writer.write(head + (b"content-encoding: gzip\r\n" if encode else b"") + b"transfer-encoding: chunked\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(first)
    events = [_event(i) for i in range(n)] + [FINISH, USAGE, DONE]
    for k, ev in enumerate(events):
        data = z.compress(ev) + z.flush(zlib.Z_SYNC_FLUSH) if z is not None else ev
        writer.write(_chunk(data))
        await writer.drain()
        if gap and k < len(events) - 1:
            await asyncio.sleep(gap)
    if q.get("bare") == "1":  # the upstream itself breaks off: no terminator
        return False
    writer.write((_chunk(z.flush()) if z is not None else b"") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def _serve_fixed(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: bytes) -> bool:
    head = b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (status, ctype, len(body))
    writer.write(head + body)
    await writer.drain()
    return True


async def _serve_endless(writer: asyncio.StreamWriter, events: bool) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    block = (_event(0) * 300) if events else (b"data: " + b"x" * 65000)  # no blank line: one endless event
    while True:
        writer.write(_chunk(block if events else block.replace(b"data: ", b"x")))
        await writer.drain()


async def _serve_huge_head(writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nx-big: ")
    while True:
        writer.write(b"a" * 65536)
        await writer.drain()


async def _route(writer: asyncio.StreamWriter, method: str, target: str, headers: dict[str, str],
                 body: bytes) -> bool:
    parts = urlsplit(target)
    q = {k: v[0] for k, v in parse_qs(parts.query).items()}
    if parts.path == "/sse":
        return await _serve_sse(writer, q)
    if parts.path == "/json":
        return await _serve_fixed(writer, 200, json.dumps({"ok": True, "text": "é"}).encode(), b"application/json")
    if parts.path == "/echo":
        seen = {"method": method, "host": headers.get("host"), "body": body.decode(), "target": target,
                "request_id": headers.get("x-request-id")}
        return await _serve_fixed(writer, 200, json.dumps(seen).encode(), b"application/json")
    if parts.path == "/status":
        return await _serve_fixed(writer, int(q["code"]), b'{"error": {"message": "upstream says no"}}',
                                  b"application/json")
    if parts.path in ("/endless", "/endless_events"):
        return await _serve_endless(writer, parts.path == "/endless_events")
    if parts.path == "/hugehead":
        return await _serve_huge_head(writer)
    return await _serve_fixed(writer, 404, b"{}", b"application/json")


async def _read_head(reader: asyncio.StreamReader, prefix: bytes) -> tuple[str, str, dict[str, str], bytes]:
    head = prefix + await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = b""
        while (size := int((await reader.readuntil(b"\r\n")).strip(), 16)) > 0:
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    else:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    return method, target, headers, body


async def _upstream_main(log_path: str) -> None:
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - the process's lifetime

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")[1]
        log.write(f"open {peer} {time.monotonic_ns()}\n")
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        prefix = b""
        try:
            while True:
                method, target, headers, body = await _read_head(reader, prefix)
                log.write(f"request {peer} {target}\n")
                route = asyncio.ensure_future(_route(writer, method, target, headers, body))
                watch = asyncio.ensure_future(reader.read(1))  # the hop closing on us, while we stream
                done, _ = await asyncio.wait({route, watch}, return_when=asyncio.FIRST_COMPLETED)
                if watch in done and not watch.result() and not route.done():
                    route.cancel()
                    log.write(f"eof {peer} {target} {time.monotonic_ns()}\n")
                    return
                keep = await route
                if watch.done():
                    prefix = watch.result()
                else:
                    watch.cancel()
                    await asyncio.gather(watch, return_exceptions=True)
                    prefix = b""
                if not keep:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            log.write(f"close {peer} {time.monotonic_ns()}\n")
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


# -- processes --------------------------------------------------------------------------------------------
@dataclass
class Upstream:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def lines(self, word: str) -> list[list[str]]:
        return [line.split() for line in self.log.read_text().splitlines() if line.startswith(word + " ")]


@dataclass
class Hop:
    proc: subprocess.Popen[bytes]
    ready: dict[str, Any]
    taps: Path | None
    stderr: Path

    @property
    def port(self) -> int:
        return int(self.ready["listen"].rsplit(":", 1)[1])

    @property
    def control_url(self) -> str:
        return f"http://{self.ready['control']}"

    @property
    def api(self) -> StreamHopAPI:
        return StreamHopAPI(self.control_url, TOKEN)

    def put(self, rule: str, kind: str, params: dict[str, Any], seed: int = 1, share: float = 1.0) -> dict[str, Any]:
        return asyncio.run(self.api.put_rule(rule, kind, params, seed=seed, share=share))

    def delete(self, rule: str) -> dict[str, Any]:
        return asyncio.run(self.api.delete_rule(rule))

    def tap_records(self) -> list[TapRecord]:
        assert self.taps is not None
        out = []
        for line in self.taps.read_text().splitlines():
            record = from_json(line)
            assert isinstance(record, TapRecord)
            out.append(record)
        return out

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_upstream(directory: Path) -> Upstream:
    log = directory / "upstream.log"
    proc = spawn([sys.executable, __file__, "--upstream", str(log)], stdout=subprocess.PIPE, cwd=ROOT)
    line = first_line(proc, 20)
    assert line.isdigit(), f"upstream did not start: {line!r}"
    return Upstream(proc, int(line), log)


def start_hop(upstream: str, directory: Path, *extra: str, token: str | None = TOKEN, taps: bool = True,
              timeout: float = 20) -> Hop:
    taps_path = directory / "taps.jsonl" if taps else None
    stderr = directory / "hop.log"
    args = [sys.executable, "-m", "chaos.hops.streamhop", "--name", "h1", "--listen", "127.0.0.1:0",
            "--upstream", upstream, "--control", "127.0.0.1:0", *extra]
    if taps_path is not None:
        args += ["--taps", str(taps_path)]
    env = {k: v for k, v in os.environ.items() if k != "STREAMCHAOS_HOP_TOKEN"}
    if token is not None:
        env["STREAMCHAOS_HOP_TOKEN"] = token
    with open(stderr, "ab") as err:
        proc = spawn(args, stdout=subprocess.PIPE, stderr=err, cwd=ROOT, env=env)
    line = first_line(proc, timeout)
    assert line.startswith("streamhop ready "), f"no ready line: {line!r}; {stderr.read_text()}"
    return Hop(proc, json.loads(line[len("streamhop ready "):]), taps_path, stderr)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("streamhop")


@pytest.fixture(scope="module")
def upstream(workdir: Path) -> Iterator[Upstream]:
    up = start_upstream(workdir)
    yield up
    up.proc.terminate()
    up.proc.wait(5)


@pytest.fixture(scope="module")
def hop(upstream: Upstream, workdir: Path) -> Iterator[Hop]:
    h = start_hop(upstream.url, workdir)
    yield h
    h.stop()


@pytest.fixture(autouse=True)
def _no_rules_left(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "hop" in request.fixturenames:
        h: Hop = request.getfixturevalue("hop")
        for rule in asyncio.run(h.api.rules()):
            h.delete(rule["name"])


# -- a client that stamps every read ----------------------------------------------------------------------
@dataclass
class Got:
    """One response as the client's socket delivered it."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    reads: list[tuple[int, bytes]] = field(default_factory=list)  # (t_ns, bytes) of every recv, head included
    body: bytes = b""  # the body, de-chunked
    complete: bool = False  # the body's end arrived (the chunked terminator or the whole Content-Length)
    end: str = "open"  # how the socket ended: open (kept alive), eof, reset, timeout
    body_reads: list[bytes] = field(default_factory=list)  # the body bytes each read carried (de-chunked)
    received: int = 0  # bytes the socket delivered, all told
    t_closed: int = 0  # when this client closed its socket (monotonic ns)
    t_head: int = 0
    _stamps: list[tuple[int, int]] = field(default_factory=list)  # (body offset at a read's end, t_ns)

    def events(self) -> list[tuple[int, bytes]]:
        """(t_ns of the read that completed it, event bytes)."""
        out, start = [], 0
        ends = [offset for offset, _ in self._stamps]
        while (at := self.body.find(b"\n\n", start)) != -1:
            end = at + 2
            out.append((self._stamps[bisect.bisect_left(ends, end)][1], self.body[start:end]))
            start = end
        return out

    def data(self) -> list[bytes]:
        return [ev for _, ev in self.events() if not ev.startswith(b":")]


def _parse(got: Got, raw: bytes, read_ends: list[tuple[int, int]]) -> None:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return
    lines = head.decode("latin-1").split("\r\n")
    got.status = int(lines[0].split()[1])
    got.headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    base = len(head) + 4
    got.t_head = next(t for end, t in read_ends if end >= base)
    if "content-length" in got.headers:
        size = int(got.headers["content-length"])
        segments = [(base, rest[:size])]
        got.complete = len(rest) >= size
    else:
        segments, got.complete = _dechunk(rest, base)
    raw_ends = [end for end, _ in read_ends]
    body, stamps, per_read = bytearray(), [], {}
    for raw_start, piece in segments:
        at = 0
        while at < len(piece):  # the piece, cut where the reads that carried it ended
            index = bisect.bisect_right(raw_ends, raw_start + at)
            take = min(len(piece) - at, raw_ends[index] - (raw_start + at))
            per_read.setdefault(index, bytearray()).extend(piece[at:at + take])
            at += take
        body += piece
        end_index = bisect.bisect_right(raw_ends, raw_start + len(piece) - 1)
        stamps.append((len(body), read_ends[min(end_index, len(read_ends) - 1)][1]))
    got.body = bytes(body)
    got._stamps = stamps
    got.body_reads = [bytes(per_read[k]) for k in sorted(per_read)]


def _maybe_complete(raw: bytearray) -> bool:
    """Cheap: could the response in ``raw`` be complete (then it is parsed to know)?"""
    head_end = raw.find(b"\r\n\r\n")
    if head_end == -1:
        return False
    head = bytes(raw[:head_end]).lower()
    if b"content-length:" in head:
        size = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        return len(raw) - head_end - 4 >= size
    return raw.endswith(b"0\r\n\r\n")


def _dechunk(data: bytes, base: int) -> tuple[list[tuple[int, bytes]], bool]:
    segments, at = [], 0
    while True:
        line_end = data.find(b"\r\n", at)
        if line_end == -1:
            return segments, False
        size = int(data[at:line_end].split(b";")[0], 16)
        if size == 0:
            return segments, data.find(b"\r\n", line_end + 2) != -1
        start = line_end + 2
        piece = data[start:start + size]
        if piece:
            segments.append((base + start, piece))
        if len(piece) < size or len(data) < start + size + 2:
            return segments, False
        at = start + size + 2


def fetch(port: int, path: str, *, method: str = "GET", body: bytes = b"", headers: dict[str, str] | None = None,
          timeout: float = 15.0, sock: socket.socket | None = None, hang_up_after: float | None = None,
          count_only: bool = False) -> Got:
    """Send one request and read the response until it is complete, the socket ends, ``timeout``, or
    ``hang_up_after`` seconds (then the client closes). ``count_only``: keep only the head and a count."""
    s = sock or socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lines = [f"{method} {path} HTTP/1.1", "Host: hop.test", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    got, raw, read_ends = Got(), bytearray(), []
    t_start = time.monotonic()
    stop_at = t_start + (timeout if hang_up_after is None else min(timeout, hang_up_after))
    while True:
        left = stop_at - time.monotonic()
        if left <= 0:
            got.end = "timeout" if hang_up_after is None else "hung_up"
            break
        s.settimeout(left)
        try:
            chunk = s.recv(262144)
        except TimeoutError:
            continue
        except ConnectionResetError:
            got.end = "reset"
            break
        now = time.monotonic_ns()
        if not chunk:
            got.end = "eof"
            break
        got.received += len(chunk)
        if count_only and len(raw) > 65536:
            continue
        raw += chunk
        got.reads.append((now, chunk))
        read_ends.append((len(raw), now))
        if _maybe_complete(raw):
            _parse(got, bytes(raw), read_ends)
            if got.complete:
                break
    _parse(got, bytes(raw), read_ends)
    if sock is None:
        got.t_closed = time.monotonic_ns()
        s.close()
    return got


def events_of(body: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in body.split(b"\n\n")[:-1]]


def _stream(hop: Hop, path: str = "/sse?n=5", **kw: Any) -> Got:
    return fetch(hop.port, path, **kw)


# -- relay fidelity ----------------------------------------------------------------------------------------
def test_a_clean_relay_is_byte_for_byte_and_each_event_leaves_when_it_is_whole(hop: Hop, upstream: Upstream) -> None:
    direct = fetch(upstream.port, "/sse?n=4&gap=0.2")
    through = _stream(hop, "/sse?n=4&gap=0.2")
    assert direct.complete and through.complete and through.status == 200
    assert through.body == direct.body == sse_body(4)
    assert through.headers["content-type"] == "text/event-stream"
    stamps = [t for t, _ in through.events()]
    gaps = [(b - a) / 1e9 for a, b in zip(stamps, stamps[1:], strict=False)]
    assert len(gaps) == 6
    assert all(0.12 <= g <= 0.35 for g in gaps), gaps  # ~200 ms apart, as written: not bunched


def test_a_non_sse_body_a_post_body_and_error_statuses_pass_unchanged(hop: Hop, upstream: Upstream) -> None:
    got = _stream(hop, "/json")
    assert got.status == 200 and got.complete and json.loads(got.body) == {"ok": True, "text": "é"}
    assert got.headers["content-length"] == str(len(got.body))
    payload = json.dumps({"prompt": "日本語 " * 4000, "n": 1}, ensure_ascii=False).encode()
    echo = fetch(hop.port, "/echo", method="POST", body=payload,
                 headers={"Content-Type": "application/json", "X-Request-Id": "post-1"})
    seen = json.loads(echo.body)
    assert seen["body"].encode() == payload and seen["method"] == "POST" and seen["request_id"] == "post-1"
    assert seen["host"] == f"127.0.0.1:{upstream.port}"  # Host names the upstream, not the hop
    for code in (404, 503):
        got = _stream(hop, f"/status?code={code}")
        assert got.status == code and got.complete and b"upstream says no" in got.body


def test_a_client_waiting_for_100_continue_is_answered_by_the_hop(hop: Hop) -> None:
    with socket.create_connection(("127.0.0.1", hop.port), timeout=5) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nExpect: 100-continue\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 100")
        s.sendall(b'{"a":1}')
        answer = b""
        while b'"body"' not in answer:
            answer += s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200") and b'{\\"a\\":1}' in answer


def test_keep_alive_connections_are_reused_on_both_sides(hop: Hop, upstream: Upstream) -> None:
    opened_before = len(upstream.lines("open"))
    with socket.create_connection(("127.0.0.1", hop.port)) as s:
        first = fetch(hop.port, "/sse?n=2", sock=s)
        second = fetch(hop.port, "/json", sock=s)
        third = fetch(hop.port, "/sse?n=3", sock=s)
    assert first.complete and second.complete and third.complete
    assert first.end == second.end == third.end == "open"
    assert third.body == sse_body(3)
    assert len(upstream.lines("open")) - opened_before == 1  # one upstream connection served all three


def test_the_builtin_stack_through_the_hop_reads_the_same_events_the_hop_tapped(workdir: Path) -> None:
    from chaos.stack.process import StackProcess

    stack = StackProcess.start("--port", "0", timeout=60.0)
    directory = workdir / "stack"
    directory.mkdir()
    hop = start_hop(stack.url, directory)
    try:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 12, "stream": True,
                "stream_options": {"include_usage": True}}
        got = fetch(hop.port, "/v1/completions", method="POST", body=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json", "X-Request-Id": "stack-1"})
    finally:
        hop.stop()
        stack.stop()
    assert got.status == 200 and got.complete
    (tap,) = hop.tap_records()
    events = got.data()
    assert events[-1] == DONE
    assert [d for _, _, d in tap.up] == [d for _, _, d in tap.down]
    assert [k for _, k, _ in tap.up][-2:] == ["usage", "done"]
    client = [hashlib.sha256(ev.strip(b"\n")[6:]).hexdigest()[:16] for ev in events]
    assert client == [d for _, _, d in tap.down]
    assert tap.request_id == "stack-1" and tap.up_end == "done" and tap.down_end == "done"
    assert tap.bytes_up == tap.bytes_down == len(got.body)


def test_an_encoded_stream_passes_unchanged_and_the_tap_reads_its_events(hop: Hop, upstream: Upstream) -> None:
    direct = fetch(upstream.port, "/sse?n=3&gzip=1")
    got = fetch(hop.port, "/sse?n=3&gzip=1", headers={"X-Request-Id": "gz"})
    assert got.complete and got.headers["content-encoding"] == "gzip"
    assert got.body == direct.body and gzip_module.decompress(got.body) == sse_body(3)
    time.sleep(0.1)
    (tap,) = [t for t in hop.tap_records() if t.request_id == "gz"]
    assert [k for _, k, _ in tap.up] == ["data", "data", "data", "finish", "usage", "done"]
    assert [d for _, _, d in tap.up] == [d for _, _, d in tap.down]
    assert tap.bytes_up == tap.bytes_down == len(direct.body) and tap.up_end == "done"


def test_a_broken_upstream_body_reaches_the_client_broken(hop: Hop) -> None:
    got = fetch(hop.port, "/sse?n=3&bare=1", headers={"X-Request-Id": "broken"})
    assert got.status == 200 and not got.complete and got.end == "eof"
    assert got.body == sse_body(3)  # every byte it sent, and no clean end it did not send
    time.sleep(0.1)
    (tap,) = [t for t in hop.tap_records() if t.request_id == "broken"]
    assert (tap.up_end, tap.down_end) == ("bare_eof", "bare_eof")


def test_an_unreachable_upstream_is_a_502(workdir: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    directory = workdir / "unreachable"
    directory.mkdir()
    hop = start_hop(f"http://127.0.0.1:{port}", directory)
    try:
        got = fetch(hop.port, "/v1/completions", method="POST", body=b"{}")
    finally:
        hop.stop()
    assert got.status == 502 and "cannot connect" in json.loads(got.body)["error"]["message"]
    (tap,) = hop.tap_records()
    assert tap.status_down == 502 and tap.up_end == "none"


# -- the rules, as the client sees them --------------------------------------------------------------------
def _first_data_after_head(got: Got) -> float:
    t_first = next(t for t, ev in got.events() if ev.startswith(b"data:"))
    return (t_first - got.t_head) / 1e9


def test_hold_delays_the_first_event_and_its_removal_restores_the_relay(hop: Hop) -> None:
    clean = _stream(hop)
    assert _first_data_after_head(clean) < 0.3
    hop.put("hold", "hold", {"seconds": 1.0})
    held = _stream(hop)
    assert held.body == sse_body(5) and held.complete
    assert _first_data_after_head(held) >= 0.95
    evidence = hop.delete("hold")
    assert evidence["removed"] and evidence["acted_on"] == 1 and evidence["details"]["held"] == 1
    assert _first_data_after_head(_stream(hop)) < 0.3


def test_hold_with_keepalives_writes_a_comment_every_k_seconds(hop: Hop) -> None:
    hop.put("hold", "hold", {"seconds": 1.0, "keepalive_s": 0.3})
    got = _stream(hop)
    comments = [t for t, ev in got.events() if ev == b": keep-alive\n\n"]
    assert 2 <= len(comments) <= 3  # at 0.3, 0.6 and 0.9 s (a wake-up late past the hold's end skips one)
    gaps = [(b - a) / 1e9 for a, b in zip([got.t_head, *comments], comments, strict=False)]
    assert all(0.2 <= g <= 0.6 for g in gaps), gaps
    assert [ev for ev in got.data()] == events_of(sse_body(5))
    hop.delete("hold")
    assert b": keep-alive" not in _stream(hop).body


def test_hold_with_headers_holds_the_head_too(hop: Hop) -> None:
    hop.put("hold", "hold", {"seconds": 0.8, "headers": "hold"})
    t0 = time.monotonic_ns()
    got = _stream(hop)
    assert (got.t_head - t0) / 1e9 >= 0.75 and got.body == sse_body(5)
    hop.delete("hold")
    t0 = time.monotonic_ns()
    assert (_stream(hop).t_head - t0) / 1e9 < 0.3


def test_silence_stops_the_bytes_after_n_events_then_they_flow(hop: Hop) -> None:
    hop.put("quiet", "silence", {"after_events": 2, "seconds": 1.0, "keepalive_s": 0.4})
    got = _stream(hop, "/sse?n=5&gap=0.05")
    assert got.body.replace(b": keep-alive\n\n", b"") == sse_body(5)
    stamps = [t for t, ev in got.events() if ev.startswith(b"data:")]
    assert (stamps[2] - stamps[1]) / 1e9 >= 0.95
    assert max((b - a) / 1e9 for a, b in zip(stamps[2:], stamps[3:], strict=False)) < 0.5  # then they flow
    assert 1 <= got.body.count(b": keep-alive\n\n") <= 2  # at 0.4 and 0.8 s into the silence
    hop.delete("quiet")
    plain = _stream(hop, "/sse?n=5&gap=0.05")
    stamps = [t for t, ev in plain.events()]
    assert max((b - a) / 1e9 for a, b in zip(stamps, stamps[1:], strict=False)) < 0.5


def _upstream_eof_after(upstream: Upstream, target: str, since: int) -> float | None:
    """Seconds from ``since`` (monotonic ns) until the upstream saw the hop close its request ``target``."""
    hits = [int(parts[-1]) for parts in upstream.lines("eof") if parts[2] == target and int(parts[-1]) >= since]
    return (hits[0] - since) / 1e9 if hits else None


def test_cut_bare_eof_closes_mid_chunk(hop: Hop, upstream: Upstream) -> None:
    hop.put("cut", "cut", {"after_events": 2, "how": "bare_eof"})
    target = "/sse?n=6&gap=0.1&tag=bare"
    got = _stream(hop, target)
    assert got.status == 200 and got.end == "eof" and not got.complete
    assert got.body.startswith(sse_body(6)[:len(_event(0)) + len(_event(1))])
    assert got.body.endswith(_event(2)[:len(_event(2)) // 2])  # half of the third event: a chunk cut short
    time.sleep(0.3)
    assert any(parts[2] == target for parts in upstream.lines("eof"))  # the hop closed the upstream at once
    hop.delete("cut")
    assert _stream(hop, "/sse?n=6").complete


def test_cut_reset_is_a_tcp_reset(hop: Hop) -> None:
    hop.put("cut", "cut", {"after_events": 1, "how": "reset"})
    got = _stream(hop, "/sse?n=4&gap=0.05")
    assert got.end == "reset" and not got.complete
    hop.delete("cut")
    assert _stream(hop, "/sse?n=4&gap=0.05").complete


def test_cut_error_event_ends_cleanly_with_an_error_then_done(hop: Hop) -> None:
    hop.put("cut", "cut", {"after_events": 2, "how": "error_event"})
    got = _stream(hop)
    assert got.complete and got.status == 200
    data = got.data()
    assert data[:2] == [_event(0), _event(1)]
    assert json.loads(data[2][6:])["error"]["type"] == "stream_cut"
    assert data[3:] == [DONE]
    hop.delete("cut")
    assert b"stream_cut" not in _stream(hop).body


def test_cut_fake_done_ends_cleanly_without_a_finish_reason(hop: Hop) -> None:
    hop.put("cut", "cut", {"after_events": 3, "how": "fake_done"})
    got = _stream(hop)
    assert got.complete and got.data() == [_event(0), _event(1), _event(2), DONE]
    assert b'"finish_reason": "stop"' not in got.body
    hop.delete("cut")
    assert _stream(hop).body == sse_body(5)


def test_status_answers_with_retry_after_instead_of_forwarding(hop: Hop, upstream: Upstream) -> None:
    requests_before = len(upstream.lines("request"))
    hop.put("busy", "status", {"code": 429, "retry_after_s": 2.5})
    got = fetch(hop.port, "/echo", method="POST", body=b'{"x": 1}')
    assert got.status == 429 and got.headers["retry-after"] == "3" and got.complete
    assert json.loads(got.body)["error"]["code"] == 429
    assert len(upstream.lines("request")) == requests_before  # never forwarded
    hop.delete("busy")
    assert fetch(hop.port, "/json").status == 200


def test_a_status_storm_acts_only_while_more_than_k_are_in_flight(hop: Hop) -> None:
    hop.put("storm", "status", {"code": 503, "storm_above": 1})
    assert _stream(hop, "/sse?n=2").status == 200  # alone: 1 in flight, not more than 1
    with socket.create_connection(("127.0.0.1", hop.port)) as long:
        long.sendall(b"GET /sse?n=3&gap=0.5 HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        crowded = _stream(hop, "/json")
        assert crowded.status == 503
        assert long.recv(100).startswith(b"HTTP/1.1 200")


def test_drop_and_duplicate_change_data_events_only(hop: Hop) -> None:
    hop.put("drop", "drop", {"share_events": 1.0, "skip_first": 2})
    dropped = _stream(hop)
    assert dropped.complete and dropped.data() == [_event(0), _event(1), DONE]
    hop.delete("drop")
    hop.put("dup", "duplicate", {"share_events": 1.0, "skip_first": 4})
    doubled = _stream(hop)
    expected = [_event(i) for i in range(4)] + [_event(4)] * 2 + [FINISH, FINISH, USAGE, USAGE, DONE]
    assert doubled.data() == expected
    hop.delete("dup")
    assert _stream(hop).data() == events_of(sse_body(5))


def test_split_inside_a_utf8_character_arrives_as_two_reads(hop: Hop) -> None:
    hop.put("split", "split", {"share_events": 1.0, "inside_utf8": True})
    got = _stream(hop, "/sse?n=8&gap=0.02")
    assert got.body == sse_body(8)
    broken = 0
    for piece in got.body_reads:
        try:
            piece.decode()
        except UnicodeDecodeError:
            broken += 1
    assert broken >= 4, got.body_reads  # reads that end or begin inside a character
    hop.delete("split")
    clean = _stream(hop, "/sse?n=8&gap=0.02")
    for piece in clean.body_reads:
        piece.decode()


def test_rewrite_changes_headers_and_gzip_buffers_the_stream(hop: Hop) -> None:
    hop.put("rw", "rewrite", {"content_type": "text/plain", "x_accel_buffering": "yes", "remove": ["cache-control"]})
    got = _stream(hop)
    assert got.headers["content-type"] == "text/plain" and got.headers["x-accel-buffering"] == "yes"
    assert "cache-control" not in got.headers and got.body == sse_body(5)
    hop.put("rw", "rewrite", {"gzip": True, "gzip_buffer_bytes": 8192})
    zipped = _stream(hop, "/sse?n=5&gap=0.1")
    assert zipped.headers["content-encoding"] == "gzip"
    assert gzip_module.decompress(zipped.body) == sse_body(5)
    assert len(zipped.body_reads) <= 2  # one blob at the end, not an event a read
    # nothing came until the body had ended: its 8 events 0.1 s apart end 0.7 s after the head, an event before
    # the last at 0.6 s at most. 0.65, not 0.7: a starved client stamped the head 1.4 ms late (0.6986 s)
    assert (zipped.reads[-1][0] - zipped.t_head) / 1e9 >= 0.65
    hop.delete("rw")
    plain = _stream(hop)
    assert "content-encoding" not in plain.headers and plain.headers["cache-control"] == "no-cache"


def test_deadline_ends_the_response_at_s_from_the_accept(hop: Hop, upstream: Upstream) -> None:
    hop.put("dl", "deadline", {"seconds": 0.5, "how": "clean"})
    t0 = time.monotonic_ns()
    got = _stream(hop, "/sse?n=10&gap=0.1")
    assert got.complete and got.status == 200 and DONE not in got.data()  # ends "whole", truncated
    assert 0.45 <= (got.reads[-1][0] - t0) / 1e9 <= 0.8
    hop.put("dl", "deadline", {"seconds": 0.4, "how": "status"})
    slow = _stream(hop, "/sse?n=3&delay=1.0")
    assert slow.status == 504
    hop.put("dl", "deadline", {"seconds": 0.4, "how": "reset"})
    assert _stream(hop, "/sse?n=10&gap=0.1").end == "reset"
    hop.delete("dl")
    assert _stream(hop, "/sse?n=10&gap=0.1").body == sse_body(10)


def test_a_rule_deleted_mid_request_finishes_its_hold_but_a_deadline_stops(hop: Hop) -> None:
    import threading

    def in_background(path: str) -> tuple[threading.Thread, list[Got]]:
        box: list[Got] = []
        thread = threading.Thread(target=lambda: box.append(_stream(hop, path)))
        thread.start()
        time.sleep(0.4)
        return thread, box

    hop.put("hold", "hold", {"seconds": 1.2})
    thread, box = in_background("/sse?n=3")
    evidence = hop.delete("hold")
    thread.join(10)
    assert evidence["running"] == 1  # the evidence says a hold is still being served
    assert _first_data_after_head(box[0]) >= 1.1 and box[0].body == sse_body(3)
    hop.put("dl", "deadline", {"seconds": 0.8, "how": "reset"})
    thread, box = in_background("/sse?n=6&gap=0.2")
    hop.delete("dl")
    thread.join(10)
    assert box[0].complete and box[0].body == sse_body(6)  # the deadline went with its rule


def test_share_acts_on_about_half_and_replays_for_the_same_seed(hop: Hop) -> None:
    def cut_ids(seed: int) -> set[str]:
        hop.put("half", "cut", {"after_events": 0, "how": "fake_done"}, seed=seed, share=0.5)
        with socket.create_connection(("127.0.0.1", hop.port)) as s:
            for i in range(40):
                fetch(hop.port, "/sse?n=1", sock=s, headers={"X-Request-Id": f"req-{i}"})
        evidence = hop.delete("half")
        return set(evidence["request_ids"])

    first = cut_ids(7)
    assert 10 <= len(first) <= 30
    assert cut_ids(7) == first
    assert cut_ids(8) != first


# -- taps ---------------------------------------------------------------------------------------------------
def test_taps_read_back_and_show_what_each_side_saw(hop: Hop) -> None:
    hop.put("drop", "drop", {"share_events": 1.0, "skip_first": 1})
    fetch(hop.port, "/sse?n=3", headers={"X-Request-Id": "tap-drop"})
    hop.delete("drop")
    fetch(hop.port, "/sse?n=3", headers={"X-Request-Id": "tap-clean"})
    time.sleep(0.1)
    taps = {t.request_id: t for t in hop.tap_records()}
    dropped, clean = taps["tap-drop"], taps["tap-clean"]
    assert len(dropped.up) == 6 and [k for _, k, _ in dropped.down] == ["data", "done"]
    assert dropped.up[1][2] not in {d for _, _, d in dropped.down}  # in up, not in down
    assert dropped.faults == ["drop"] and clean.faults == []
    assert [d for _, _, d in clean.up] == [d for _, _, d in clean.down]
    assert all(down[0] >= up[0] for up, down in zip(clean.up, clean.down, strict=True))
    assert (clean.status_up, clean.status_down, clean.up_end, clean.down_end) == (200, 200, "done", "done")
    assert clean.headers_up["content-type"] == "text/event-stream"
    assert clean.t_accept <= clean.t_upstream_open <= clean.t_upstream_head <= clean.t_end
    mode = os.stat(hop.taps).st_mode & 0o777 if hop.taps else 0
    assert mode == 0o600


def test_a_client_hang_up_is_stamped_and_the_upstream_closed_at_once(hop: Hop, upstream: Upstream) -> None:
    target = "/sse?n=50&gap=0.1&tag=hangup"
    got = fetch(hop.port, target, headers={"X-Request-Id": "hangup"}, hang_up_after=0.35)
    assert got.end == "hung_up" and len(got.data()) >= 3
    time.sleep(0.4)
    held = _upstream_eof_after(upstream, target, got.t_closed)
    assert held is not None and held < 0.05, held  # the upstream saw the hop let go within 50 ms (~1 ms here)
    (tap,) = [t for t in hop.tap_records() if t.request_id == "hangup"]
    assert tap.t_client_gone is not None and tap.t_upstream_closed is not None
    assert got.t_closed <= tap.t_client_gone <= tap.t_upstream_closed
    assert tap.t_upstream_closed - tap.t_client_gone < 5_000_000  # the hop's own view: under 5 ms
    assert tap.down_end == "client_gone" and tap.up_end == "closed"
    assert _stream(hop, "/sse?n=2").complete  # and the hop goes on serving


def test_tap_event_lists_are_capped(upstream: Upstream, workdir: Path) -> None:
    directory = workdir / "capped"
    directory.mkdir()
    hop = start_hop(upstream.url, directory, "--max-events", "5")
    try:
        fetch(hop.port, "/sse?n=20")
        time.sleep(0.1)
    finally:
        hop.stop()
    (tap,) = hop.tap_records()
    assert len(tap.up) == len(tap.down) == 5
    assert tap.dropped_up == tap.dropped_down == 18


# -- the control API and the process -----------------------------------------------------------------------
def test_the_control_api_wants_its_token_and_says_why_a_rule_is_bad(hop: Hop) -> None:
    body = {"kind": "cut", "params": {}, "seed": 1, "share": 1.0}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        answer = httpx.put(hop.control_url + "/rules/x", json=body, headers=headers, trust_env=False)
        assert answer.status_code == 401
    assert asyncio.run(hop.api.rules()) == []  # nothing changed
    with pytest.raises(FaultError, match="refused the token"):
        asyncio.run(StreamHopAPI(hop.control_url, "wrong").status())
    bad = httpx.put(hop.control_url + "/rules/x", json={"kind": "hold", "params": {"seconds": -2}},
                    headers={"Authorization": f"Bearer {TOKEN}"}, trust_env=False)
    assert bad.status_code == 400 and bad.json() == {"error": "hold.seconds must be between 0 and 86400 seconds, "
                                                              "got -2"}
    with pytest.raises(FaultError, match=r"→ 400: cut.how must be one of") as caught:
        hop.put("x", "cut", {"how": "nope"})
    assert "\n" not in str(caught.value)
    status = asyncio.run(hop.api.status())
    assert status["name"] == "h1" and status["listen"] == hop.ready["listen"] and status["rules"] == []
    assert hop.api.delete_rule_sync("never-put")["removed"] is False


def test_an_unreachable_hop_is_a_one_line_fault_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(FaultError, match="did not answer"):
        asyncio.run(StreamHopAPI(f"http://127.0.0.1:{port}", TOKEN, timeout=1).status())
    with pytest.raises(FaultError, match="did not answer"):
        StreamHopAPI(f"http://127.0.0.1:{port}", TOKEN, timeout=1).delete_rule_sync("x")


def test_the_hop_listens_on_loopback_only_and_needs_its_token(hop: Hop, upstream: Upstream, workdir: Path) -> None:
    assert hop.ready["listen"].startswith("127.0.0.1:") and hop.ready["control"].startswith("127.0.0.1:")
    assert hop.ready["pid"] == hop.proc.pid and hop.ready["version"]
    base = [sys.executable, "-m", "chaos.hops.streamhop", "--name", "x", "--upstream", upstream.url]
    env = {**os.environ, "STREAMCHAOS_HOP_TOKEN": TOKEN}
    for extra in (["--listen", "0.0.0.0:0"], ["--control", "192.0.2.1:0"]):
        done = subprocess.run(base + extra, env=env, capture_output=True, text=True, timeout=30, cwd=ROOT)
        assert done.returncode == 2 and "loopback" in done.stderr and done.stdout == ""
    link = workdir / "taps-link.jsonl"
    link.symlink_to(workdir / "elsewhere.jsonl")
    done = subprocess.run(base + ["--taps", str(link)], env=env, capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 2 and not (workdir / "elsewhere.jsonl").exists()  # a taps file is never a link
    env.pop("STREAMCHAOS_HOP_TOKEN")
    done = subprocess.run(base, env=env, capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert done.returncode == 2 and "STREAMCHAOS_HOP_TOKEN" in done.stderr


def test_sigterm_ends_the_hop_within_two_seconds_with_its_taps_written(upstream: Upstream, workdir: Path) -> None:
    directory = workdir / "sigterm"
    directory.mkdir()
    hop = start_hop(upstream.url, directory)
    with socket.create_connection(("127.0.0.1", hop.port)) as s:
        s.sendall(b"GET /sse?n=100&gap=0.1 HTTP/1.1\r\nHost: x\r\nX-Request-Id: running\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 200")
        children = Path(f"/proc/{hop.proc.pid}/task/{hop.proc.pid}/children").read_text().split()
        t0 = time.monotonic()
        hop.proc.send_signal(signal.SIGTERM)
        code = hop.proc.wait(5)
        took = time.monotonic() - t0
    assert code == 0 and took < 2.0, took
    assert children == []  # it never had a child to leave behind
    (tap,) = hop.tap_records()
    assert tap.request_id == "running" and tap.down_end == "bare_eof" and tap.t_upstream_closed is not None


def test_a_hostile_upstream_cannot_grow_the_hops_memory(upstream: Upstream, workdir: Path) -> None:
    directory = workdir / "hostile"
    directory.mkdir()
    hop = start_hop(upstream.url, directory)
    try:
        fetch(hop.port, "/sse?n=3")
        base = hop.rss_kib()
        huge = fetch(hop.port, "/hugehead", timeout=10)
        assert huge.status == 502 and "no valid response head" in json.loads(huge.body)["error"]["message"]
        # an endless event at full speed, read by the client for 2 s: hundreds of MB pass, none stays
        endless = fetch(hop.port, "/endless", hang_up_after=2.0, count_only=True)
        assert endless.status == 200
        flowed = endless.received
        # endless small events to a client that does not read: the hop stops reading upstream
        with socket.create_connection(("127.0.0.1", hop.port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            s.sendall(b"GET /endless_events HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(2.0)
            stalled = hop.rss_kib()
        grown = max(hop.rss_kib(), stalled) - base
    finally:
        hop.stop()
    assert flowed > 50e6, flowed
    assert grown < 16 * 1024, f"RSS grew {grown} KiB"  # ~3 MiB here, with 800 MB relayed


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--upstream":
    asyncio.run(_upstream_main(sys.argv[2]))
