"""The stream hop's HTTP/2 side (``--http 2``, chaos/hops/streamhop/h2front.py) as a real process between
real HTTP/2 clients and test_streamhop.py's SSE upstream (a process; its event timing is ours to set).

Clients: httpx over h2c (prior knowledge) and over TLS (ALPN h2, the run's kind of certificate and CA),
and a frame-level client on h2's state machine (``RawH2``) where a test needs the frames themselves:
one DATA frame per event, RST_STREAM codes, SETTINGS, GOAWAY, or a client that ignores the server's
stream limit.

What it shows: the relay over h2 and h2+TLS is faithful, one event per DATA frame, and HTTP/1.1 still
works on the same port; an HTTP/1.1 rule (cut) acts on an h2 stream and only on it; a client's
RST_STREAM reaches the upstream as a disconnect at once; each h2 fault is seen by the client
(stream.h2_rst_stream, stream.h2_goaway, stream.h2_max_streams, stream.h2_window, stream.h2_header_leak)
and, its rule deleted, the same requests go through clean.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import httpx
import pytest
from h2.connection import ConnectionInputs
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from chaos.hops.streamhop.rules import Rule
from chaos.host.certs import CertPair, make_local_certs
from chaos.host.tls import tls_context, trust
from chaos.model.context import HopInfo, RunContext, TargetInfo
from tests.hops.runs.test_streamhop import (
    TOKEN,
    Hop,
    Upstream,
    _event,
    events_of,
    sse_body,
    start_hop,
    start_upstream,
)

pytestmark = pytest.mark.timeout(60)

SSE = "text/event-stream"


# -- a frame-level HTTP/2 client ------------------------------------------------------------------------
@dataclass
class Stream:
    """One stream as the client got it, frame by frame."""

    headers: dict[str, str] = field(default_factory=dict)
    frames: list[bytes] = field(default_factory=list)  # each non-empty DATA frame's data, in order
    t_frames: list[float] = field(default_factory=list)
    ended: bool = False  # END_STREAM arrived
    reset: int | None = None  # RST_STREAM's error code

    @property
    def body(self) -> bytes:
        return b"".join(self.frames)

    @property
    def over(self) -> bool:
        return self.ended or self.reset is not None


class RawH2:
    """An HTTP/2 client on h2's state machine over a socket of its own: every frame it gets is kept.

    One liberty: h2 closes its whole connection state on a GOAWAY (python-hyper/h2#1181); RFC 9113 6.8
    lets the streams at or below its last stream id complete, so this client keeps reading them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.grants = True  # False: a reader that never gives window back (no WINDOW_UPDATE)
        self.received = 0  # DATA bytes, all streams
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        machine, process = self.h2.state_machine, self.h2.state_machine.process_input
        # see the class's docstring: a GOAWAY leaves the connection open for the streams it lets finish
        machine.process_input = lambda i: [] if i is ConnectionInputs.RECV_GOAWAY else process(i)  # type: ignore
        self.streams: dict[int, Stream] = {}
        self.settings: list[dict[int, int]] = []  # each SETTINGS frame's changes, as they came
        self.goaway: tuple[int, int] | None = None  # (last stream id, error code)
        self.closed = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, port: int, context: ssl.SSLContext | None = None, *, read: bool = True) -> RawH2:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                       server_hostname="127.0.0.1" if context else None)
        client = cls(reader, writer)
        client.h2.initiate_connection()
        client.flush()
        if read:
            client.start()
        return client

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._read())

    def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.writer.write(data)

    def request(self, path: str, rid: str | None = None, method: str = "GET", *, flush: bool = True) -> int:
        sid = self.h2.get_next_available_stream_id()
        headers = [(b":method", method.encode()), (b":scheme", b"http"), (b":authority", b"127.0.0.1"),
                   (b":path", path.encode())]
        if rid is not None:
            headers.append((b"x-request-id", rid.encode()))
        self.h2.send_headers(sid, headers, end_stream=True)
        self.streams[sid] = Stream()
        if flush:  # else with the next flush: requests meant to arrive together
            self.flush()
        return sid

    def reset(self, sid: int, code: ErrorCodes = ErrorCodes.CANCEL) -> None:
        self.h2.reset_stream(sid, code)
        self.flush()

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                for event in self.h2.receive_data(data):
                    self._event(event)
                self.flush()
                self._changed.set()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed = True
            self._changed.set()

    def _event(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", None)
        stream = self.streams.get(sid) if sid else None
        if isinstance(event, h2.events.ResponseReceived) and stream is not None:
            stream.headers = {k.decode(): v.decode() for k, v in event.headers or []}
        elif isinstance(event, h2.events.DataReceived):
            if stream is not None and event.data:  # not the empty one that may carry END_STREAM alone
                stream.frames.append(bytes(event.data))
                stream.t_frames.append(time.monotonic())
            self.received += len(event.data or b"")
            if self.grants:
                self.h2.acknowledge_received_data(event.flow_controlled_length or 0, sid or 0)
        elif isinstance(event, h2.events.StreamEnded) and stream is not None:
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset) and stream is not None:
            stream.reset = int(event.error_code or 0)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.settings.append({int(k): v.new_value for k, v in event.changed_settings.items()})
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = (int(event.last_stream_id or 0), int(event.error_code or 0))

    async def until(self, done: Any, timeout: float = 8.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not done():
            self._changed.clear()
            if done():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what or done}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def close(self) -> None:
        self.writer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@contextlib.asynccontextmanager
async def raw(port: int, context: ssl.SSLContext | None = None, *, read: bool = True) -> AsyncIterator[RawH2]:
    client = await RawH2.open(port, context, read=read)
    try:
        yield client
    finally:
        await client.close()


# -- processes --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("streamhop-h2")


@pytest.fixture(scope="module")
def upstream(workdir: Path) -> Iterator[Upstream]:
    up = start_upstream(workdir)
    yield up
    up.proc.terminate()
    up.proc.wait(5)


@pytest.fixture(scope="module")
def hop(upstream: Upstream, workdir: Path) -> Iterator[Hop]:
    directory = workdir / "h2c"
    directory.mkdir()
    h = start_hop(upstream.url, directory, "--http", "2")
    yield h
    h.stop()


@pytest.fixture(scope="module")
def certs(workdir: Path) -> CertPair:
    pair = make_local_certs(workdir / "tls")
    trust(pair.ca)
    return pair


@pytest.fixture(scope="module")
def tls_hop(upstream: Upstream, workdir: Path, certs: CertPair) -> Iterator[Hop]:
    directory = workdir / "h2tls"
    directory.mkdir()
    h = start_hop(upstream.url, directory, "--http", "2", "--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
    yield h
    h.stop()


@pytest.fixture(autouse=True)
async def _no_rules_left(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    yield
    for name in ("hop", "tls_hop"):
        if name in request.fixturenames:
            h: Hop = request.getfixturevalue(name)
            for rule in await h.api.rules():
                await h.api.delete_rule(rule["name"])


async def put(hop: Hop, name: str, kind: str, params: dict[str, Any], *, seed: int = 1,
              share: float = 1.0) -> dict[str, Any]:
    return await hop.api.put_rule(name, kind, params, seed=seed, share=share)


def chosen(rule: str, share: float, n: int = 40, seed: int = 1) -> tuple[list[str], list[str]]:
    """Request ids a rule of ``share`` (seeded as the hop seeds it) acts on, and ids it leaves alone."""
    probe = Rule(rule, "probe", {}, seed=seed, share=share)
    ids = [f"{rule}-{i}" for i in range(n)]
    return [i for i in ids if probe.selects(i)], [i for i in ids if not probe.selects(i)]


def tap_of(hop: Hop, rid: str) -> Any:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        found = [t for t in (hop.tap_records() if hop.taps and hop.taps.exists() else []) if t.request_id == rid]
        if found:
            return found[-1]
        time.sleep(0.02)
    raise AssertionError(f"no tap for {rid}")


async def eventually(found: Any, timeout: float = 3.0) -> Any:
    """``found()`` once it is truthy (polled: the upstream's log and the taps file are another process's)."""
    deadline = time.monotonic() + timeout
    while not (value := found()) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return value


def eof_seen(upstream: Upstream, marker: str) -> list[int]:
    """When (monotonic ns) the upstream saw the hop close a request whose target carries ``marker``."""
    return [int(parts[-1]) for parts in upstream.lines("eof") if marker in parts[2]]


async def h2_get(client: httpx.AsyncClient, url: str, rid: str | None = None) -> tuple[httpx.Response, list[bytes]]:
    headers = {"x-request-id": rid} if rid else {}
    async with client.stream("GET", url, headers=headers) as response:
        chunks = [chunk async for chunk in response.aiter_raw()]
    return response, chunks


# -- the relay ----------------------------------------------------------------------------------------------
async def test_h2c_relays_one_event_per_data_frame_and_http1_still_works_on_the_port(hop: Hop) -> None:
    async with raw(hop.port) as client:
        sid = client.request("/sse?n=5&gap=0.02", rid="plain-1")
        await client.until(lambda: client.streams[sid].over, what="the stream's end")
    got = client.streams[sid]
    assert got.ended and got.reset is None and got.headers[":status"] == "200"
    assert got.headers["content-type"] == SSE
    assert not {"transfer-encoding", "connection", "keep-alive"} & set(got.headers)  # HTTP/2 has none of them
    assert got.frames == events_of(sse_body(5))  # one SSE event per DATA frame, byte for byte
    record = tap_of(hop, "plain-1")
    assert record.down_end == "done" and "transfer-encoding" not in record.headers_down
    assert len(record.down) == len(got.frames)

    async with httpx.AsyncClient(http2=True, http1=False, timeout=10, trust_env=False) as h2c:
        response, chunks = await h2_get(h2c, f"http://127.0.0.1:{hop.port}/sse?n=3")
    assert response.http_version == "HTTP/2" and chunks == events_of(sse_body(3))
    async with httpx.AsyncClient(timeout=10, trust_env=False) as h1:  # the same port, HTTP/1.1
        plain = await h1.get(f"http://127.0.0.1:{hop.port}/sse?n=3")
    assert plain.http_version == "HTTP/1.1" and plain.content == sse_body(3)


async def test_h2_over_tls_by_alpn_relays_event_per_frame_and_https_11_by_alpn_too(tls_hop: Hop) -> None:
    assert tls_hop.ready["tls"] is True and tls_hop.ready["http"] == "2"
    url = f"https://127.0.0.1:{tls_hop.port}/sse?n=4&gap=0.01"
    async with httpx.AsyncClient(http2=True, verify=tls_context(("h2", "http/1.1")), timeout=10,
                                 trust_env=False) as client:
        response, chunks = await h2_get(client, url)
        posted = await client.post(f"https://127.0.0.1:{tls_hop.port}/echo", content=b"x" * 200_000)
    assert response.http_version == "HTTP/2" and response.headers["content-type"] == SSE
    assert chunks == events_of(sse_body(4))
    assert posted.http_version == "HTTP/2" and json.loads(posted.content)["body"] == "x" * 200_000
    async with httpx.AsyncClient(verify=tls_context(), timeout=10, trust_env=False) as h1:  # ALPN http/1.1
        plain = await h1.get(url)
    assert plain.http_version == "HTTP/1.1" and plain.content == sse_body(4)
    with pytest.raises(httpx.ConnectError):  # a client that does not trust the run's CA is refused
        async with httpx.AsyncClient(http2=True, verify=ssl.create_default_context(), trust_env=False) as stranger:
            await stranger.get(url)


# -- an HTTP/1.1 rule on h2 streams, and the abort path ------------------------------------------------
async def test_a_cut_acts_on_its_h2_stream_alone_and_ends_it_with_rst_stream(hop: Hop, upstream: Upstream) -> None:
    cut, spared = chosen("cut-h2", 0.5)
    await put(hop, "cut-h2", "cut", {"after_events": 2, "how": "bare_eof"}, share=0.5)
    async with raw(hop.port) as client:
        a = client.request(f"/sse?n=6&gap=0.05&id={cut[0]}", rid=cut[0])
        b = client.request(f"/sse?n=6&gap=0.05&id={spared[0]}", rid=spared[0])
        await client.until(lambda: client.streams[a].over and client.streams[b].over)
        got, neighbour = client.streams[a], client.streams[b]
        assert not client.closed  # the connection lives on
    # two whole events, the half of the third the cut writes, then the stream reset as nginx resets it
    assert got.frames[:2] == [_event(0), _event(1)]
    assert got.body == _event(0) + _event(1) + _event(2)[:len(_event(2)) // 2]
    assert got.reset == ErrorCodes.INTERNAL_ERROR and not got.ended
    assert neighbour.ended and neighbour.frames == events_of(sse_body(6))  # same connection, untouched
    assert await eventually(lambda: eof_seen(upstream, cut[0]))  # the hop closed its upstream connection at once
    assert tap_of(hop, cut[0]).faults == ["cut-h2"]
    evidence = await hop.api.delete_rule("cut-h2")
    assert evidence["acted_on"] == 1 and evidence["request_ids"] == [cut[0]]
    async with raw(hop.port) as client:  # disarmed: the same request goes through whole
        again = client.request(f"/sse?n=6&id={cut[0]}-again", rid=cut[0])
        await client.until(lambda: client.streams[again].over)
    assert client.streams[again].ended and client.streams[again].frames == events_of(sse_body(6))


async def test_a_clients_rst_stream_reaches_the_upstream_as_a_disconnect_at_once(hop: Hop, upstream: Upstream) -> None:
    async with raw(hop.port) as client:
        gone = client.request("/sse?n=200&gap=0.05&id=abort-1", rid="abort-1")
        stays = client.request("/sse?n=4&gap=0.1&id=abort-2", rid="abort-2")
        await client.until(lambda: len(client.streams[gone].frames) >= 2)
        t_reset = time.monotonic_ns()
        client.reset(gone, ErrorCodes.CANCEL)
        await client.until(lambda: client.streams[stays].over)
    assert client.streams[stays].ended and client.streams[stays].frames == events_of(sse_body(4))
    seen = await eventually(lambda: eof_seen(upstream, "abort-1"))
    assert seen and (seen[0] - t_reset) / 1e9 < 0.5, seen  # not the 10 s the stream had left
    record = tap_of(hop, "abort-1")
    assert record.down_end == "client_gone" and record.t_client_gone is not None and record.up_end == "closed"


async def test_a_client_that_grants_no_window_stops_the_upstream_and_memory_stays_bounded(
        upstream: Upstream, workdir: Path) -> None:
    directory = workdir / "stalled"
    directory.mkdir()
    hop = start_hop(upstream.url, directory, "--http", "2")
    try:
        async with raw(hop.port) as warm:  # the hop's memory with its code loaded and one stream served
            sid = warm.request("/sse?n=3")
            await warm.until(lambda: warm.streams[sid].over)
        base = hop.rss_kib()
        async with raw(hop.port) as client:
            client.grants = False
            sid = client.request("/endless_events")
            await client.until(lambda: client.received >= 65_535 - 16_384, what="the first window's worth")
            await asyncio.sleep(1.5)  # the upstream writes as fast as it may meanwhile
            stalled, grown = client.received, hop.rss_kib() - base
            assert stalled <= 65_535  # the client's window, and no byte more
            assert grown < 16 * 1024, f"RSS grew {grown} KiB"
            client.grants = True
            client.h2.increment_flow_control_window(1 << 20)
            client.h2.increment_flow_control_window(1 << 20, sid)
            client.flush()
            await client.until(lambda: client.received > stalled + (1 << 20), what="the relay going on")
            client.reset(sid)
    finally:
        hop.stop()


async def test_sigterm_ends_an_h2_hop_with_streams_open_within_two_seconds(upstream: Upstream, workdir: Path) -> None:
    directory = workdir / "sigterm"
    directory.mkdir()
    hop = start_hop(upstream.url, directory, "--http", "2")
    async with raw(hop.port) as client:
        sid = client.request("/sse?n=100&gap=0.1", rid="term-1")
        await client.until(lambda: client.streams[sid].frames)
        t0 = time.monotonic()
        hop.proc.terminate()
        hop.proc.wait(5)
        took = time.monotonic() - t0
        await client.until(lambda: client.closed, what="the connection's end")
    assert hop.proc.returncode == 0 and took < 2.0, took
    assert not client.streams[sid].ended  # cut short, not passed off as whole
    assert [t.request_id for t in hop.tap_records()] == ["term-1"]


# -- the HTTP/2 faults --------------------------------------------------------------------------------------
async def test_h2_rst_stream_resets_the_chosen_streams_after_n_events_and_spares_their_neighbours(hop: Hop) -> None:
    hit, spared = chosen("rst", 0.5)
    await put(hop, "rst", "h2_rst_stream", {"after_events": 3, "error": "cancel"}, share=0.5)
    ids = [hit[0], spared[0], hit[1], spared[1]]
    async with raw(hop.port) as client:
        sids = {rid: client.request(f"/sse?n=6&gap=0.03&id={rid}", rid=rid) for rid in ids}
        await client.until(lambda: all(client.streams[s].over for s in sids.values()))
        later = client.request("/sse?n=2", rid="rst-after")  # the connection lives on
        await client.until(lambda: client.streams[later].over)
        assert client.streams[later].ended and not client.closed
    for rid in hit[:2]:
        got = client.streams[sids[rid]]
        assert got.reset == ErrorCodes.CANCEL and got.frames == events_of(sse_body(6))[:3], rid
        record = tap_of(hop, rid)
        assert record.faults == ["rst"] and record.down_end == "reset" and record.up_end == "cut"
    for rid in spared[:2]:
        assert client.streams[sids[rid]].ended and client.streams[sids[rid]].frames == events_of(sse_body(6))
    evidence = await hop.api.delete_rule("rst")
    assert evidence["acted_on"] == 2 and sorted(evidence["request_ids"]) == sorted(hit[:2])
    async with raw(hop.port) as client:  # disarmed: the same ids go through whole
        sids = {rid: client.request(f"/sse?n=6&id={rid}-2", rid=rid) for rid in ids}
        await client.until(lambda: all(client.streams[s].over for s in sids.values()))
    assert all(client.streams[s].ended and len(client.streams[s].frames) == 9 for s in sids.values())


async def test_h2_goaway_lets_in_flight_streams_finish_refuses_new_ones_and_closes(hop: Hop) -> None:
    async with raw(hop.port) as client:
        a = client.request("/sse?n=10&gap=0.1&id=ga", rid="ga")
        b = client.request("/sse?n=10&gap=0.1&id=gb", rid="gb")
        await client.until(lambda: client.streams[a].frames and client.streams[b].frames)
        await put(hop, "drain", "h2_goaway", {})
        await client.until(lambda: client.goaway is not None, what="GOAWAY")
        assert client.goaway == (b, 0)  # NO_ERROR, the last stream it took
        assert not client.streams[a].over and not client.streams[b].over  # still running when it came
        await client.until(lambda: client.closed, what="the connection closed after its last stream")
    for sid in (a, b):
        assert client.streams[sid].ended and client.streams[sid].frames == events_of(sse_body(10))
    # a connection opened after the rule was put is not told: it serves on
    async with httpx.AsyncClient(http2=True, http1=False, timeout=10, trust_env=False) as h2c:
        before = (await hop.api.status())["h2"]["opened"]
        for _ in range(3):
            response, chunks = await h2_get(h2c, f"http://127.0.0.1:{hop.port}/sse?n=2")
            assert chunks == events_of(sse_body(2))
        assert (await hop.api.status())["h2"]["opened"] == before + 1
        evidence = await hop.api.delete_rule("drain")
        assert evidence["details"] == {"goaway_sent": 1} and evidence["acted_on"] == 1
        # put again: this idle connection is told and closed, and the client's next request opens another
        await put(hop, "drain", "h2_goaway", {})
        response, chunks = await h2_get(h2c, f"http://127.0.0.1:{hop.port}/sse?n=2")
        assert chunks == events_of(sse_body(2))
        assert (await hop.api.status())["h2"]["opened"] == before + 2


async def test_h2_goaway_after_n_streams_refuses_the_next_and_the_client_reconnects(hop: Hop) -> None:
    await put(hop, "every2", "h2_goaway", {"after_streams": 2})
    async with raw(hop.port) as client:
        sids = [client.request(f"/sse?n=3&gap=0.05&id=g{i}", flush=False) for i in range(3)]
        client.flush()
        await client.until(lambda: all(client.streams[s].over for s in sids) and client.closed)
    first, second, third = (client.streams[s] for s in sids)
    assert client.goaway == (sids[1], 0)  # sent as the second stream came: it and the first finish
    assert first.ended and second.ended and second.frames == events_of(sse_body(3))
    assert third.reset == ErrorCodes.REFUSED_STREAM and not third.frames  # never reached the upstream
    assert not any(t.target.endswith("id=g2") for t in hop.tap_records())
    evidence = await hop.api.delete_rule("every2")
    assert evidence["details"] == {"goaway_sent": 1, "streams_refused": 1}
    async with raw(hop.port) as client:  # disarmed: three streams on one connection, no GOAWAY
        sids = [client.request("/sse?n=2") for _ in range(3)]
        await client.until(lambda: all(client.streams[s].over for s in sids))
        assert all(client.streams[s].ended for s in sids) and client.goaway is None and not client.closed


async def test_a_stream_opened_and_cancelled_in_one_read_after_goaway_leaves_its_neighbours_alone(hop: Hop) -> None:
    """A client that sent a stream before it read the GOAWAY cancels it (RST_STREAM) when it does: the hop may
    read the stream's HEADERS and its reset together. Refusing a stream the client already closed must not
    take the connection, and its streams in flight, down (found by experiments/http2-faults.yaml: three
    streams a drained connection lost, the hop's handler dead on h2's StreamClosedError)."""
    async with raw(hop.port) as client:
        a = client.request("/sse?n=8&gap=0.1&id=ca", rid="ca")
        await client.until(lambda: client.streams[a].frames, what="the first stream's first event")
        await put(hop, "drain", "h2_goaway", {})
        await client.until(lambda: client.goaway is not None, what="GOAWAY")
        late = client.request("/sse?n=2&id=cb", flush=False)
        client.h2.reset_stream(late, ErrorCodes.CANCEL)
        client.flush()  # HEADERS and RST_STREAM of the late stream in one write
        await client.until(lambda: client.streams[a].over, what="the first stream's end")
    assert client.streams[a].ended and client.streams[a].frames == events_of(sse_body(8))
    assert not any(t.target.endswith("id=cb") for t in hop.tap_records())
    await hop.api.delete_rule("drain")


async def test_h2_max_streams_is_advertised_refused_beyond_and_restored(hop: Hop) -> None:
    async with raw(hop.port) as before:  # open when the rule is put: told by a new SETTINGS frame
        await before.until(lambda: before.settings, what="the first SETTINGS")
        await put(hop, "two", "h2_max_streams", {"streams": 2})
        await before.until(lambda: before.settings[-1].get(SettingCodes.MAX_CONCURRENT_STREAMS) == 2)
        async with raw(hop.port, read=False) as rude:  # a client that sends four before it reads the limit
            sids = [rude.request(f"/sse?n=3&gap=0.05&id=m{i}", flush=False) for i in range(4)]
            rude.flush()
            rude.start()
            await rude.until(lambda: all(rude.streams[s].over for s in sids))
        assert rude.settings[0][SettingCodes.MAX_CONCURRENT_STREAMS] == 2
        assert [rude.streams[s].ended for s in sids[:2]] == [True, True]
        assert [rude.streams[s].reset for s in sids[2:]] == [ErrorCodes.REFUSED_STREAM] * 2
        async with httpx.AsyncClient(http2=True, http1=False, timeout=10, trust_env=False) as h2c:
            await h2_get(h2c, f"http://127.0.0.1:{hop.port}/sse?n=1")  # its SETTINGS read: the limit known
            results = await asyncio.gather(*(h2_get(h2c, f"http://127.0.0.1:{hop.port}/sse?n=3&gap=0.1")
                                             for _ in range(5)))
        assert all(chunks == events_of(sse_body(3)) for _, chunks in results)  # queued by the client, all served
        evidence = await hop.api.delete_rule("two")
        assert evidence["details"]["most_open"] <= 2 and evidence["details"]["streams_refused"] == 2
        await before.until(lambda: before.settings[-1].get(SettingCodes.MAX_CONCURRENT_STREAMS) == 100)
    async with raw(hop.port, read=False) as rude:  # disarmed: four at once all served
        sids = [rude.request("/sse?n=2") for _ in range(4)]
        rude.start()
        await rude.until(lambda: all(rude.streams[s].over for s in sids))
    assert all(rude.streams[s].ended for s in sids)


async def test_h2_window_starves_a_request_body_for_its_seconds_and_disarmed_it_flows(hop: Hop,
                                                                                   upstream: Upstream) -> None:
    body = b"p" * 20_000  # a long prompt
    url = f"http://127.0.0.1:{hop.port}/echo"
    async with httpx.AsyncClient(http2=True, http1=False, timeout=10, trust_env=False) as h2c:
        t0 = time.monotonic()
        fast = await h2c.post(url, content=body)
        clean_s = time.monotonic() - t0
    assert fast.status_code == 200 and json.loads(fast.content)["body"] == body.decode() and clean_s < 0.5
    await put(hop, "starve", "h2_window", {"bytes": 1024, "seconds": 1.5})
    async with httpx.AsyncClient(http2=True, http1=False, timeout=10, trust_env=False) as h2c:
        # a connection's first request is sent before its client reads the hop's SETTINGS (it may use 64KiB
        # of window meanwhile, RFC 9113 6.9.2): the starved requests come after one that was not
        await h2c.get(f"http://127.0.0.1:{hop.port}/json")
        for rid, size in (("starved", 20_000), ("starved-long", 100_000)):
            t0 = time.monotonic()
            slow = await h2c.post(url, content=b"p" * size, headers={"x-request-id": rid})
            starved_s = time.monotonic() - t0
            assert slow.status_code == 200 and json.loads(slow.content)["body"] == "p" * size
            assert 1.4 <= starved_s < 3.0, (rid, starved_s)
        small = await h2c.post(url, content=b"s" * 1000, headers={"x-request-id": "fits"})  # within the window
        assert small.status_code == 200
    assert tap_of(hop, "starved").faults == ["starve"] and tap_of(hop, "fits").faults == []
    evidence = await hop.api.delete_rule("starve")
    assert evidence["details"]["streams_stalled"] == 2
    assert sorted(evidence["request_ids"]) == ["starved", "starved-long"]
    async with httpx.AsyncClient(http2=True, http1=False, timeout=10, trust_env=False) as h2c:
        t0 = time.monotonic()
        again = await h2c.post(url, content=body)
        assert again.status_code == 200 and time.monotonic() - t0 < 0.5


async def test_h2_header_leak_strips_the_event_stream_type_of_the_share_chosen_among_neighbours(hop: Hop) -> None:
    leaky, spared = chosen("leak", 0.5)
    ids = leaky[:3] + spared[:3]

    async def streams() -> dict[str, Stream]:
        async with raw(hop.port) as client:
            json_sid = client.request("/json", flush=False)  # a neighbour that is not an event stream
            # all in one write: every stream is open before the first head goes out
            sids = {rid: client.request(f"/sse?n=3&delay=0.05&id={rid}", rid=rid, flush=False) for rid in ids}
            client.flush()
            await client.until(lambda: all(client.streams[s].over for s in [json_sid, *sids.values()]))
        assert client.streams[json_sid].headers["content-type"] == "application/json"
        return {rid: client.streams[sid] for rid, sid in sids.items()}

    await put(hop, "leak", "h2_header_leak", {"how": "drop"}, share=0.5)
    got = await streams()
    assert [("content-type" in got[rid].headers) for rid in leaky[:3]] == [False] * 3
    assert all(got[rid].headers["content-type"] == SSE for rid in spared[:3])
    assert all(g.ended and g.frames == events_of(sse_body(3)) for g in got.values()), got  # the body is untouched
    assert "content-type" not in tap_of(hop, leaky[0]).headers_down and tap_of(hop, leaky[0]).faults == ["leak"]
    await put(hop, "leak", "h2_header_leak", {"how": "neighbour"}, share=0.5)
    got = await streams()
    assert all(got[rid].headers["content-type"] == "application/json" for rid in leaky[:3])
    assert all(got[rid].headers["content-type"] == SSE for rid in spared[:3])
    async with raw(hop.port) as alone:  # a stream alone on its connection has no neighbour to mix it up with
        sid = alone.request("/sse?n=1", rid=leaky[0])
        await alone.until(lambda: alone.streams[sid].over)
    assert alone.streams[sid].headers["content-type"] == SSE
    evidence = await hop.api.delete_rule("leak")
    assert evidence["details"]["content_type_replaced"] == 3 and evidence["details"]["alone"] == 1
    got = await streams()  # disarmed: every stream an event stream
    assert all(g.headers["content-type"] == SSE and g.ended for g in got.values())


async def test_the_fault_kinds_drive_the_hop_as_the_runner_does(hop: Hop, upstream: Upstream, workdir: Path) -> None:
    import faults  # noqa: F401  (registers every kind)
    from faults.base import REGISTRY

    info = HopInfo(name="h1", kind="stream", listen=hop.ready["listen"], upstream=upstream.url,
                   base_url=f"http://{hop.ready['listen']}", control_url=hop.control_url, control_token=TOKEN,
                   pid=hop.proc.pid, taps=True)
    ctx = RunContext(seed=7, target=TargetInfo(kind="builtin", base_url=upstream.url + "/v1"), run_dir=workdir,
                     hops=(info,))
    cls = REGISTRY["stream.h2_max_streams"]
    values, problems = cls.schema.parse({"streams": 1})
    assert problems == []
    injection = cls.from_params("one-at-a-time", values).activate(ctx)
    assert injection.plan()["rule_kind"] == "h2_max_streams"
    injected = await injection.inject()
    assert injected["rule"]["kind"] == "h2_max_streams" and injected["rule"]["params"] == {"streams": 1}
    async with raw(hop.port, read=False) as rude:
        sids = [rude.request("/sse?n=2&gap=0.2", flush=False) for _ in range(2)]
        rude.flush()
        rude.start()
        await rude.until(lambda: all(rude.streams[s].over for s in sids))
    assert rude.streams[sids[0]].ended and rude.streams[sids[1]].reset == ErrorCodes.REFUSED_STREAM
    reverted = await injection.revert()
    assert reverted["removed"] and reverted["details"]["streams_refused"] == 1
    assert reverted["request_ids"] and reverted["request_ids"][0].startswith("c")  # the connection it acted on


async def test_h2_rules_are_refused_by_a_hop_that_speaks_http11(upstream: Upstream, workdir: Path) -> None:
    directory = workdir / "h1only"
    directory.mkdir()
    h1 = start_hop(upstream.url, directory)
    try:
        assert h1.ready["http"] == "1.1" and h1.ready["tls"] is False
        with pytest.raises(Exception, match="speaks HTTP/1.1"):
            await put(h1, "x", "h2_max_streams", {"streams": 2})
    finally:
        h1.stop()
