"""Every stream.* fault kind against a real stream hop process in front of a real builtin stack: for each,
a streaming request through the hop shows the fault at the client and in the hop's taps file, and its
disarmed form (share 0, a hold of 0s, after_events beyond the stream) passes the stream through clean.
The faults act as the runner drives them: activate, plan, inject (the rule as the hop lists it), revert
(what the hop says it did); rollback deletes a rule from the plan alone.

One stack and one hop for the module (started with the hop's own command line, the token in its
environment); each request carries its own X-Request-Id, which finds its tap record."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

import faults  # noqa: F401  (registers every kind)
from chaos.host.children import first_line, spawn
from chaos.model.context import HopInfo, RunContext, TargetInfo
from chaos.model.experiment import HopSpec
from chaos.model.observations import TapRecord, from_json
from chaos.stack.process import StackProcess
from faults.base import REGISTRY
from faults.stream import HOP_TOKEN_ENV

pytestmark = pytest.mark.timeout(60)

READY = "streamhop ready "
NS = 1_000_000_000


@dataclass
class Hop:
    proc: subprocess.Popen[bytes]
    info: HopInfo
    taps: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://{self.info.listen}/v1/completions"


@pytest.fixture(scope="module")
def stack() -> Iterator[StackProcess]:
    with StackProcess.start("--port", "0", timeout=60.0) as served:
        yield served


def start_hop(upstream: str, directory: Path) -> Hop:
    """A stream hop as its command line starts it, tapping into a file, in front of ``upstream``."""
    taps, log = directory / "taps.jsonl", directory / "hop.log"
    token = secrets.token_urlsafe(24)
    with log.open("ab") as stderr:
        proc = spawn([sys.executable, "-m", "chaos.hops.streamhop", "--name", "stream", "--listen", "127.0.0.1:0",
                      "--upstream", upstream, "--control", "127.0.0.1:0", "--taps", str(taps)],
                     stdout=subprocess.PIPE, stderr=stderr, env={**os.environ, HOP_TOKEN_ENV: token})
    line = first_line(proc, 20.0)
    assert line.startswith(READY), (line, log.read_text(errors="replace"))
    ready = json.loads(line[len(READY):])
    info = HopInfo(name="stream", kind="stream", listen=ready["listen"], upstream=upstream,
                   base_url=f"http://{ready['listen']}/v1", control_url=f"http://{ready['control']}",
                   control_token=token, pid=ready["pid"], version=ready["version"], taps=True)
    return Hop(proc, info, taps, log)


def stop_hop(hop: Hop) -> None:
    hop.proc.terminate()
    hop.proc.wait(5)
    assert hop.proc.stdout is not None
    hop.proc.stdout.close()


@pytest.fixture(scope="module")
def hop(stack: StackProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hop]:
    started = start_hop(stack.url, tmp_path_factory.mktemp("hop"))
    try:
        yield started
    finally:
        stop_hop(started)


@dataclass
class Seen:
    """One streaming request as the client saw it: the head, each read with its stamp, how it ended."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    t_head: int = 0
    reads: list[tuple[int, bytes]] = field(default_factory=list)  # (monotonic ns, the bytes of one read)
    error: str | None = None  # the exception class that ended the body, None: it ended cleanly
    t_start: int = 0

    @property
    def body(self) -> bytes:
        return b"".join(chunk for _, chunk in self.reads)

    def events(self, body: bytes | None = None) -> list[bytes]:
        """Every whole SSE event (comments included), in order, without its blank-line end: a cut's partial
        last event is not one."""
        text = self.body if body is None else body
        return [e for e in text.replace(b"\r\n", b"\n").split(b"\n\n")[:-1] if e.strip()]  # whole ones only

    def data(self, body: bytes | None = None) -> list[bytes]:
        return [e for e in self.events(body) if e.startswith(b"data:")]

    def comments(self) -> list[bytes]:
        return [e for e in self.events() if e.startswith(b":")]

    def done(self, body: bytes | None = None) -> bool:
        return any(e.strip() == b"data: [DONE]" for e in self.events(body))

    def finished(self, body: bytes | None = None) -> bool:
        """A finish_reason that is not null in some event: the engine's own end of the answer."""
        return any(b'"finish_reason":"' in e or b'"finish_reason": "' in e for e in self.data(body))

    def first_data_s(self) -> float:
        """Seconds from the request to the first data event's read."""
        seen = b""
        for t, chunk in self.reads:
            seen += chunk
            if self.data(seen):
                return (t - self.t_start) / NS
        raise AssertionError("no data event arrived")


async def request(hop: Hop, rid: str, max_tokens: int = 16) -> Seen:
    """One streaming completion through the hop, read as it comes, never raising for how it ended."""
    seen = Seen(t_start=time.monotonic_ns())
    body = {"model": "tiny", "prompt": "ünïcödé ✓ 漢字", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=20.0, trust_env=False) as client:
        try:
            async with client.stream("POST", hop.url, json=body, headers={"X-Request-Id": rid}) as response:
                seen.t_head = time.monotonic_ns()
                seen.status, seen.headers = response.status_code, dict(response.headers)
                async for chunk in response.aiter_raw():
                    seen.reads.append((time.monotonic_ns(), chunk))
        except httpx.HTTPError as exc:
            seen.error = type(exc).__name__
    return seen


async def tap(hop: Hop, rid: str) -> TapRecord:
    """The hop's tap record of request ``rid`` (written when the request ends at the hop)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if hop.taps.exists():
            for line in hop.taps.read_text(encoding="utf-8").splitlines():
                record = from_json(json.loads(line))
                if isinstance(record, TapRecord) and record.request_id == rid:
                    return record
        await asyncio.sleep(0.02)
    raise AssertionError(f"no tap record for {rid} in {hop.taps}")


def kinds(events: list[list[Any]]) -> list[str]:
    return [e[1] for e in events]


@dataclass
class Applied:
    inject: dict[str, Any]
    plan: dict[str, Any]
    revert: dict[str, Any] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def fault(hop: Hop, kind: str, name: str | None = None, **raw: Any) -> AsyncIterator[Applied]:
    """``kind`` with ``raw`` parameters as the runner drives it: checked, activated, planned, injected,
    and reverted on the way out."""
    cls = REGISTRY[kind]
    values, problems = cls.schema.parse(raw)
    assert problems == [], problems
    spec = cls.from_params(name or kind.replace(".", "-"), values)
    assert spec.problems(_experiment()) == []
    ctx = RunContext(seed=7, target=TargetInfo(kind="builtin", base_url=hop.info.upstream + "/v1"),
                     run_dir=hop.taps.parent, hops=(hop.info,))
    injection = spec.activate(ctx)
    applied = Applied(plan=injection.plan(), inject=await injection.inject())
    try:
        yield applied
    finally:
        applied.revert = await injection.revert()


def _experiment() -> Any:
    from dataclasses import replace

    from chaos.experiment import experiment_from_dict

    base = experiment_from_dict({"name": "n", "phases": [{"name": "a", "duration": "1s"}]})
    return replace(base, path=(HopSpec(kind="stream", name="stream"),))


def rid() -> str:
    return f"req-{secrets.token_hex(4)}"


def assert_clean(seen: Seen, record: TapRecord) -> None:
    """A whole stream, relayed as it came: 200, every event, a finish_reason and [DONE], taps equal."""
    assert seen.status == 200 and seen.error is None
    assert seen.finished() and seen.done() and seen.comments() == []
    assert record.faults == [] and record.down_end == "done" and record.up_end == "done"
    assert [e[2] for e in record.down] == [e[2] for e in record.up]


# ---- hold ----

async def test_hold_delays_the_first_event_with_keepalive_comments(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.hold", seconds="800ms", keepalive="200ms") as applied:
        seen = await request(hop, r)
    assert applied.inject["rule"]["kind"] == "hold" and applied.inject["t_active"]
    assert seen.first_data_s() >= 0.8
    assert len(seen.comments()) >= 3 and all(c.startswith(b": keep-alive") for c in seen.comments())
    assert (seen.t_head - seen.t_start) / NS < 0.6  # headers: send: the head passed at once
    assert seen.finished() and seen.done()
    record = await tap(hop, r)
    assert record.faults == ["stream-hold"] and "comment" in kinds(record.down)
    first_up = next(e[0] for e in record.up if e[1] != "comment")
    first_down = next(e[0] for e in record.down if e[1] != "comment")
    assert (first_down - first_up) / NS >= 0.75
    assert applied.revert["removed"] and applied.revert["acted_on"] == 1 and r in applied.revert["request_ids"]


async def test_hold_of_the_head_too(hop: Hop) -> None:
    async with fault(hop, "stream.hold", seconds="600ms", headers="hold"):
        seen = await request(hop, rid())
    assert (seen.t_head - seen.t_start) / NS >= 0.6 and seen.comments() == []


async def test_a_hold_of_0s_passes_clean(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.hold", seconds="0s"):
        seen = await request(hop, r)
    assert seen.first_data_s() < 0.5
    record = await tap(hop, r)
    assert seen.status == 200 and seen.finished() and seen.done() and seen.comments() == []
    assert [e[2] for e in record.down] == [e[2] for e in record.up]


# ---- silence ----

def gaps(seen: Seen) -> list[float]:
    """Seconds between consecutive data events' arrivals."""
    stamps, body = [], b""
    for t, chunk in seen.reads:
        before = len(seen.data(body))
        body += chunk
        stamps += [t] * (len(seen.data(body)) - before)
    return [(b - a) / NS for a, b in zip(stamps, stamps[1:], strict=False)]


async def test_silence_after_n_events_with_keepalive_comments(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.silence", after_events=3, seconds="700ms", keepalive="200ms"):
        seen = await request(hop, r)
    pauses = gaps(seen)
    assert pauses[2] >= 0.65 and max(pauses[:2]) < 0.3  # the 4th event waits, the first three do not
    assert len(seen.comments()) >= 2 and seen.finished() and seen.done()
    record = await tap(hop, r)
    assert record.faults == ["stream-silence"] and "comment" in kinds(record.down)
    assert [e[2] for e in record.down if e[1] != "comment"] == [e[2] for e in record.up]  # nothing lost


async def test_silence_beyond_the_stream_passes_clean(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.silence", after_events=10_000, seconds="2s"):
        seen = await request(hop, r)
    assert max(gaps(seen)) < 0.3
    assert_clean(seen, await tap(hop, r))


# ---- cut ----

@pytest.mark.parametrize("how, error, down_end", [
    ("bare_eof", "RemoteProtocolError", "bare_eof"),
    ("reset", "ReadError", "reset"),
    ("error_event", None, "error_event"),
    ("fake_done", None, "done"),
])
async def test_cut_after_n_events(hop: Hop, how: str, error: str | None, down_end: str) -> None:
    r = rid()
    async with fault(hop, "stream.cut", after_events=3, how=how) as applied:
        seen = await request(hop, r, max_tokens=32)
    assert seen.status == 200 and seen.error == error
    assert not seen.finished()  # no finish_reason reached the client, whatever the end looked like
    payloads = seen.data()
    assert payloads[:3] and all(b"[DONE]" not in p and b'"error"' not in p for p in payloads[:3])
    if how == "error_event":
        assert b"stream cut by streamchaos" in payloads[3] and payloads[4:] == [b"data: [DONE]"]
    elif how == "fake_done":
        assert payloads[3:] == [b"data: [DONE]"]
    else:
        assert len(payloads) == 3 and not seen.done()
    record = await tap(hop, r)
    assert record.down_end == down_end and record.up_end == "cut" and record.t_upstream_closed is not None
    assert applied.revert["acted_on"] == 1


async def test_cut_beyond_the_stream_passes_clean(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.cut", after_events=10_000, how="reset"):
        seen = await request(hop, r)
    assert_clean(seen, await tap(hop, r))


# ---- status ----

async def test_status_answers_instead_of_forwarding(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.status", code=429, retry_after="2s") as applied:
        seen = await request(hop, r)
    assert seen.status == 429 and seen.headers.get("retry-after") == "2"
    assert "error" in json.loads(seen.body)
    record = await tap(hop, r)
    assert record.status_down == 429 and record.down_end == "status" and record.t_upstream_open is None
    assert applied.revert["acted_on"] == 1 and applied.revert["request_ids"] == [r]


async def test_a_status_storm_only_above_k_in_flight(hop: Hop) -> None:
    async with fault(hop, "stream.status", code=503, storm_above=1) as applied:
        alone = await request(hop, rid())
        crowd = await asyncio.gather(*(request(hop, rid(), max_tokens=160) for _ in range(4)))
    assert alone.status == 200 and alone.done()  # one in flight is not more than 1
    statuses = sorted(s.status for s in crowd)
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1, statuses
    assert applied.revert["acted_on"] == statuses.count(503)


async def test_status_with_share_0_passes_clean(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.status", code=503, share=0) as applied:
        seen = await request(hop, r)
    assert_clean(seen, await tap(hop, r))
    assert applied.revert["acted_on"] == 0


# ---- drop / duplicate ----

async def test_drop_loses_events_but_never_done(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.drop", share_events=1.0, skip_first=2):
        seen = await request(hop, r)
    record = await tap(hop, r)
    up_data = [e for e in record.up if e[1] != "done"]
    assert len(up_data) >= 10
    assert len(seen.data()) == 3 and seen.done() and not seen.finished()  # two events, then only [DONE]
    assert [e[2] for e in record.down] == [e[2] for e in record.up[:2]] + [record.up[-1][2]]


async def test_duplicate_writes_events_twice(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.duplicate", share_events=1.0):
        seen = await request(hop, r)
    record = await tap(hop, r)
    payloads = seen.data()
    assert payloads[-1] == b"data: [DONE]" and payloads[:-1:2] == payloads[1:-1:2]  # each data event twice
    assert len(payloads) - 1 == 2 * (len(record.up) - 1)
    assert [e[2] for e in record.down[::2]][:-1] == [e[2] for e in record.up][:-1]


@pytest.mark.parametrize("kind", ["stream.drop", "stream.duplicate"])
async def test_drop_and_duplicate_at_share_events_0_pass_clean(hop: Hop, kind: str) -> None:
    r = rid()
    async with fault(hop, kind, share_events=0):
        seen = await request(hop, r)
    assert_clean(seen, await tap(hop, r))


# ---- split ----

def torn(seen: Seen) -> list[bytes]:
    """The reads that end inside a multibyte UTF-8 character."""
    out = []
    for _, chunk in seen.reads:
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.reason == "unexpected end of data":
                out.append(chunk)
    return out


async def test_split_inside_utf8_arrives_in_pieces(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.split", share_events=1.0, inside_utf8=True):
        seen = await request(hop, r)
    record = await tap(hop, r)
    assert len(seen.reads) > len(seen.events())  # events arrive in more reads than there are events
    assert torn(seen), "no read ended inside a UTF-8 character"
    assert seen.finished() and seen.done()
    assert [e[2] for e in record.down] == [e[2] for e in record.up]  # the bytes themselves are unchanged


async def test_split_at_share_events_0_passes_clean(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.split", share_events=0, inside_utf8=True):
        seen = await request(hop, r)
    assert torn(seen) == []
    assert_clean(seen, await tap(hop, r))


# ---- rewrite ----

async def test_rewrite_gzips_and_buffers_the_stream(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.rewrite", gzip=True, gzip_buffer="64KiB", x_accel_buffering="yes",
                     remove=["cache-control"]):
        seen = await request(hop, r, max_tokens=32)
    assert seen.headers.get("content-encoding") == "gzip" and seen.headers.get("x-accel-buffering") == "yes"
    assert "cache-control" not in seen.headers
    plain = gzip.decompress(seen.body)
    assert seen.finished(plain) and seen.done(plain)
    first_data = seen.reads[0][0]  # nothing came before the buffer's only flush, at the end: one bunch
    assert (seen.reads[-1][0] - first_data) / NS < 0.05
    record = await tap(hop, r)
    assert record.headers_down.get("content-encoding") == "gzip" and record.faults == ["stream-rewrite"]


async def test_rewrite_at_share_0_passes_clean(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.rewrite", gzip=True, share=0):
        seen = await request(hop, r)
    assert "content-encoding" not in seen.headers and seen.headers.get("x-accel-buffering") == "no"
    assert_clean(seen, await tap(hop, r))


# ---- deadline ----

@pytest.mark.parametrize("how, error", [("clean", None), ("bare_eof", "RemoteProtocolError")])
async def test_deadline_ends_a_long_stream(hop: Hop, how: str, error: str | None) -> None:
    r = rid()
    async with fault(hop, "stream.deadline", seconds="300ms", how=how):
        seen = await request(hop, r, max_tokens=1000)
    assert seen.status == 200 and seen.error == error
    assert not seen.finished() and not seen.done()
    assert 0.25 <= (seen.reads[-1][0] - seen.t_start) / NS < 0.8
    record = await tap(hop, r)
    assert record.down_end == "deadline" and record.faults == ["stream-deadline"]


async def test_a_deadline_beyond_the_stream_passes_clean(hop: Hop) -> None:
    r = rid()
    async with fault(hop, "stream.deadline", seconds="30s"):
        seen = await request(hop, r)
    assert_clean(seen, await tap(hop, r))


# ---- rollback ----

async def test_rollback_deletes_the_rule_from_the_plan_alone(hop: Hop, monkeypatch: pytest.MonkeyPatch) -> None:
    cls = REGISTRY["stream.cut"]
    async with fault(hop, "stream.cut", name="left-behind", after_events=0) as applied:
        monkeypatch.setenv(HOP_TOKEN_ENV, hop.info.control_token or "")
        done = await asyncio.to_thread(cls.rollback, applied.plan)  # a crash: another process, the plan only
        assert done["removed"] is True
        seen = await request(hop, rid())  # the rule is gone: a clean stream again
        assert seen.done() and seen.finished()
    assert applied.revert["removed"] is False  # the revert after it finds nothing: idempotent


async def test_a_hop_that_died_took_its_rule_with_it(stack: StackProcess, tmp_path: Path) -> None:
    doomed = start_hop(stack.url, tmp_path)
    try:
        async with fault(doomed, "stream.hold", seconds="5s") as applied:
            doomed.proc.kill()  # the hop ends (as it does with a killed runner): its rules end with it
            doomed.proc.wait(5)
        assert "died with it" in applied.revert["skipped"] and applied.revert["removed"] is False
        assert "died with it" in REGISTRY["stream.hold"].rollback(applied.plan)["skipped"]
    finally:
        stop_hop(doomed)
