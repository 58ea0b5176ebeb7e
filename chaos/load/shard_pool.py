"""``load.shards: K``: a run's load split across K generator shards, coordinated over TCP, judged as one run.

The coordinator (this module, inside the runner) listens on ``load.shard_listen``; each shard
(``chaos.load.shard_process``: a local process it starts, or a pod of a Kubernetes Indexed Job started
elsewhere) connects, proves it holds the run's shard token, and gets its share of the load: the
concurrency, rate, ``max_requests`` and background streams divided as evenly as integers allow,
and its own request ids and seeds (its shard index). The coordinator then measures each shard's
clock offset with NTP-style round trips (``chaos.load.clock``), and drives the shards through the
``LoadDriver`` interface the runner already uses for local workers: phase changes and client-rule
changes are broadcast, run/drain/start/stop are calls every shard answers.

Records come back two ways. Each is sent as it is made and enters the run's event stream at once,
moved onto the coordinator's clock by the shard's offset, so the journal, live progress and halt
conditions see the load as it happens; and each shard appends it to its journal shard
``journal.shard-K.jsonl``. When the pool closes, every journal shard the coordinator can read (local
shards write into the run directory; pods can share a volume) is merged: records the connection
lost are added, moved by the same offset, so the verifiers see one observation set. A note
``shards`` records each shard's offset, its error bound, the offset measured again at the end (the
drift) and how many records came live, from the file, or are missing.

Nothing a peer does can hold the coordinator. Before it has proved it holds the token a peer is
nobody: its hello is read with a 16 KiB limit within ``HELLO_TIMEOUT_S``, and at most
``UNAUTHENTICATED_MAX`` such connections are open at once (the next is closed unread). Every call
has a deadline (a run's: until its end and ``call_grace_s``; a quick one or one at teardown:
``call_grace_s``), and a shard that misses it is lost: recorded with why, its connection cut (a
shard whose coordinator goes away stops its load), the run going on without it or failing as a
lost shard fails it. A shard is lost too when its reader ends for any reason, and every message is
parsed by a bounded decoder and every record checked field by field (``chaos.load.shard_records``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.host.children import spawn
from chaos.host.runfiles import open_append
from chaos.load.clock import ClockOffset, Exchange, estimate, shift_record
from chaos.load.lag import merged_lag, merged_send_delay, summed_stats
from chaos.load.shard_process import API_KEY_ENV, TOKEN_ENV, shard_journal_name
from chaos.load.shard_records import figures, ints, numbers, stream_record
from chaos.load.wire import (
    HELLO_MAX_BYTES,
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    ProtocolError,
    decode,
    encode,
    read_message,
    rule_to_json,
    settings_to_json,
)
from chaos.load.workload import LoadSettings, LoadSpecLike, LoadTarget
from chaos.model.context import ClientPolicy, ClientRule
from chaos.model.errors import SetupFailed
from chaos.model.observations import Note, StreamRecord

__all__ = ["JournalShard", "ShardPool", "merge_journal_shard", "read_journal_shard", "shard_shares"]

SYNC_EXCHANGES = 16  # round trips at connection; the least delayed one sets the offset
END_EXCHANGES = 8  # again at close: how far the clocks drifted during the run
HELLO_TIMEOUT_S = 5.0  # a shard says hello as soon as it connects; a nobody is not kept waiting on
UNAUTHENTICATED_MAX = 64  # connections open before their hello: K shards connect in milliseconds each
SYNC_TIMEOUT_S = 20.0  # the 16 round trips at connection, together
CALL_GRACE_S = 10.0  # a quick call's whole deadline; a timed one's (run, drain) beyond its own time
END_CLOCK_S = 10.0  # the closing round trips, all shards at once
CLOSE_TIMEOUT_S = 15.0
HANG_UP_S = 5.0  # for every connection's reader to end once it is closed
LIFETIME_MARGIN_S = 120.0  # a shard stops on its own this long after the run's hard stop
OFFSET_BOUND = 2**61  # ns (73 years): a clock offset this large is made up; stamps ± it stay within 2^62


def shard_shares(spec: LoadSpecLike, count: int) -> list[LoadSettings]:
    """Each shard's part of the load: concurrency, rate and max_requests split as evenly as integers allow."""
    from chaos.load.workload import split_evenly

    conc = split_evenly(spec.concurrency, count) if spec.concurrency is not None else [None] * count
    reqs = split_evenly(spec.max_requests, count) if spec.max_requests is not None else [None] * count
    return [
        LoadSettings.of(spec, concurrency=conc[i], rate=(spec.rate / count) if spec.rate is not None else None,
                        max_requests=reqs[i], workers=count)
        for i in range(count)
    ]


@dataclass
class JournalShard:
    """What one journal shard holds for the run: its stream records not already seen, on the
    coordinator's clock, and what could not be taken from it."""

    records: list[StreamRecord] = field(default_factory=list)
    refused: str | None = None  # the whole file: not this run's shard
    dropped: int = 0  # lines that were not a valid record (a killed writer's half line, wrong field types)
    dropped_why: str | None = None  # the first of them


def read_journal_shard(path: Path, offset_ns: int, seen: set[str], run_id: str) -> JournalShard:
    """The stream records of one journal shard not already ``seen``, moved onto the coordinator's clock;
    every line decoded with the protocol's bounds and every record checked as a live one is."""
    out = JournalShard()
    with open(path, "rb") as f:
        while line := f.readline(MAX_LINE_BYTES + 1):
            if not line.strip():
                continue
            try:
                if len(line) > MAX_LINE_BYTES:
                    while line and not line.endswith(b"\n"):  # the rest of an overlong line, in bounded reads
                        line = f.readline(MAX_LINE_BYTES + 1)
                    raise ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes")
                body = decode(line)
                kind = body.get("type") if isinstance(body, dict) else None
                if kind == "shard" and body.get("run_id") != run_id:
                    return JournalShard(refused=f"{path.name} belongs to run {body.get('run_id')!r}, not {run_id!r}")
                if kind == "stream" and body.get("id") not in seen:
                    out.records.append(shift_record(stream_record(body), -offset_ns))
            except (ProtocolError, TypeError) as exc:  # TypeError: an id that cannot be looked up (a list)
                out.dropped += 1
                out.dropped_why = out.dropped_why or str(exc)
    return out


def merge_journal_shard(path: Path, offset_ns: int, seen: set[str],
                        run_id: str) -> tuple[list[StreamRecord], str | None]:
    """``(records, None)`` of ``read_journal_shard``, or ``([], why)`` when the file is not this run's shard."""
    shard = read_journal_shard(path, offset_ns, seen, run_id)
    return shard.records, shard.refused


def _dial_address(listen_host: str, port: int) -> str:
    """Where a shard on this host reaches a coordinator listening on ``listen_host``: the loopback for a
    wildcard (or no host), else that very address (one bound to 10.0.0.5 or 127.0.0.2 only is not on 127.0.0.1)."""
    host = listen_host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        return f"127.0.0.1:{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class _Peer:
    """One connected shard, as the coordinator sees it."""

    index: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pid: int | None
    host: str
    clock: ClockOffset | None = None
    clock_end: ClockOffset | None = None
    live: set[str] = field(default_factory=set)
    written: int | None = None  # records in its journal shard, as it said when closed
    activity: list[int] = field(default_factory=list)  # its in-flight streams' last-byte stamps, on our clock
    pongs: dict[int, asyncio.Future[Exchange]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(encode(message))


class ShardPool:
    """K load shards behind the ``LoadGenerator`` interface (``chaos.load.driver.LoadDriver``)."""

    def __init__(
        self,
        spec: LoadSpecLike,
        target: LoadTarget,
        *,
        policy: ClientPolicy,
        sink: Callable[[StreamRecord], None],
        run_dir: Path,
        notes: Callable[[Note], None] | None = None,
        run_id: str = "",
        lifetime_s: float = 3600.0,
    ) -> None:
        self.count = int(getattr(spec, "shards", 1))
        self.launch = str(getattr(spec, "shard_launch", "local"))
        self.listen = str(getattr(spec, "shard_listen", "127.0.0.1:0"))
        self.connect_timeout = float(getattr(spec, "shard_connect_timeout", 60.0))
        self.shares = shard_shares(spec, self.count)
        self.target = target
        self.sink, self.notes = sink, notes
        self.run_dir = run_dir
        self.run_id = run_id or secrets.token_hex(8)
        self.lifetime_s = lifetime_s + LIFETIME_MARGIN_S
        self.lag_threshold = spec.lag_threshold
        self.token = os.environ.get(TOKEN_ENV, "").strip() if self.launch == "external" else secrets.token_urlsafe(32)
        self._policy = policy
        self._phase = ""
        self._seq = itertools.count()
        self._peers: dict[int, _Peer] = {}
        self._pending: dict[int, tuple[asyncio.Future[list[Any]], list[Any], set[int]]] = {}
        self._lag: dict[int, list[float]] = {}
        self._send_delay: dict[int, dict[str, list[float]]] = {}
        self._stats: dict[int, dict[str, Any]] = {}
        self._dead: dict[int, str] = {}
        self._server: asyncio.Server | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._all_here: asyncio.Event | None = None
        self._closed = False
        self._closing = False
        self._unauthenticated = 0  # connections open that have not said a valid hello yet
        self._accept_failed = False  # whether a hello has failed with an error of ours (said once on stderr)
        self._load_until_ns: int | None = None  # the load's deadline as it stands (run, move_deadline)
        self.call_grace_s = CALL_GRACE_S  # tests shorten it; a run keeps the default
        self.address = ""
        policy.on_change.append(self._rules_changed)

    # ---- bring-up ----------------------------------------------------------------------------

    async def open(self) -> None:
        """Listen, start local shards (or wait for external ones), and measure every shard's clock."""
        if self.launch == "external" and not self.token:
            raise SetupFailed(f"load.shard_launch external: set {TOKEN_ENV} here and in every shard (a random secret)")
        self._all_here = asyncio.Event()
        host, _, port = self.listen.rpartition(":")
        # every connection starts at the hello's limit: raised to MAX_LINE_BYTES once its token checks out
        self._server = await asyncio.start_server(self._accept, host.strip("[]") or None, int(port),
                                                  limit=HELLO_MAX_BYTES)
        bound = self._server.sockets[0].getsockname()
        self.address = f"{host or '0.0.0.0'}:{bound[1]}"
        if self.launch == "local":
            self._spawn_local(_dial_address(host, bound[1]))
        try:
            await asyncio.wait_for(self._wait_all(), self.connect_timeout)
        except asyncio.TimeoutError:
            here = sorted(i for i, p in self._peers.items() if p.clock is not None)
            raise SetupFailed(f"only {len(here)} of {self.count} load shards connected to {self.address} within "
                              f"{self.connect_timeout:g}s (load.shard_connect_timeout); connected: {here or 'none'}"
                              + self._local_failures()) from None

    async def _wait_all(self) -> None:
        assert self._all_here is not None
        while not self._all_here.is_set():
            if self.launch == "local" and any(p.poll() is not None for p in self._procs):
                raise SetupFailed("a local load shard exited before it connected" + self._local_failures())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._all_here.wait(), 0.2)

    def _spawn_local(self, address: str) -> None:
        env = dict(os.environ, **{TOKEN_ENV: self.token})
        if self.target.api_key:
            env[API_KEY_ENV] = self.target.api_key  # by environment: never on a command line anyone can read
        for i in range(self.count):
            log = open_append(self.run_dir / f"shard-{i}.log")  # the child holds it; closed below
            try:
                self._procs.append(spawn(
                    [sys.executable, "-m", "chaos", "shard", "--coordinator", address, "--index", str(i), "--count",
                     str(self.count), "--journal-dir", str(self.run_dir), "--connect-timeout",
                     f"{self.connect_timeout:g}"],
                    stdout=log, stderr=log, env=env, start_new_session=True,
                ))
            finally:
                log.close()

    def _local_failures(self) -> str:
        out = []
        for i, proc in enumerate(self._procs):
            if proc.poll() is not None:
                tail = ((self.run_dir / f"shard-{i}.log").read_text(encoding="utf-8", errors="replace")
                        .strip().splitlines()[-3:])
                out.append(f"shard {i} exited with {proc.returncode}: {' | '.join(tail) or 'no output'}")
        return ("; " + "; ".join(out)) if out else ""

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: a nobody until its hello proves the token, then a shard until it is lost or closed."""
        if self._unauthenticated >= UNAUTHENTICATED_MAX or self._closed:
            writer.close()  # too many nobodies at once: closed unread (a shard retries)
            return
        self._unauthenticated += 1
        try:
            peer = await self._hello(reader, writer)
        except Exception as exc:  # noqa: BLE001 - a bug of ours a nobody found: one line, never a traceback per peer
            writer.close()
            if not self._accept_failed:
                self._accept_failed = True  # the first only: a peer repeating it cannot fill the runner's stderr
                print(f"load shard coordinator: a connection's hello failed: {type(exc).__name__}: {exc}"[:300],
                      file=sys.stderr, flush=True)
            return
        finally:
            self._unauthenticated -= 1
        if peer is not None:
            await self._serve(peer)

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Peer | None:
        """The peer once its hello (within ``HELLO_MAX_BYTES`` and ``HELLO_TIMEOUT_S``) is this run's, else None."""
        try:
            hello = await asyncio.wait_for(read_message(reader), HELLO_TIMEOUT_S)
        except (ProtocolError, asyncio.TimeoutError, OSError):
            writer.close()  # not a shard of this run: nothing to say to it
            return None
        peer = self._admit(hello, reader, writer)
        if peer is not None:
            # it holds the token: a record may now be as long as the protocol allows. StreamReader has no
            # public setter; its limit is read at each readuntil (and sets when reading pauses)
            vars(reader)["_limit"] = MAX_LINE_BYTES
        return peer

    async def _serve(self, peer: _Peer) -> None:
        """Welcome the shard, measure its clock, then read it until it ends; however it ends, it is recorded."""
        peer.send({"op": "welcome", "config": self._config(peer.index)})
        peer.task = asyncio.current_task()
        self._peers[peer.index] = peer
        reading = asyncio.ensure_future(self._reader(peer))
        try:
            try:
                peer.clock = await asyncio.wait_for(self._sync(peer, SYNC_EXCHANGES), SYNC_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise ProtocolError("it did not answer the clock round trips") from None
            peer.send({"op": "offset", "offset_ns": peer.clock.offset_ns, "bound_ns": peer.clock.bound_ns})
            peer.send({"op": "phase", "name": self._phase})
            if (len([p for p in self._peers.values() if p.clock is not None]) == self.count
                    and self._all_here is not None):
                self._all_here.set()
            await reading
        except Exception as exc:  # noqa: BLE001 - whatever ends a shard's connection, it is lost, with why
            self._lost(peer, f"{self._who(peer)}: {exc}")
        finally:
            reading.cancel()
            peer.writer.close()

    def _admit(self, hello: dict[str, Any] | None, reader: asyncio.StreamReader,
               writer: asyncio.StreamWriter) -> _Peer | None:
        """The peer if its hello is this run's (token, index, count, version), else refuse it with why."""
        why = None
        if hello is None or hello.get("op") != "hello":
            why = "expected a hello"
        elif not hmac.compare_digest(str(hello.get("token", "")).encode("utf-8", "surrogatepass"),
                                     self.token.encode("utf-8", "surrogatepass")):
            why = "wrong shard token"
        elif hello.get("version") != PROTOCOL_VERSION:
            why = f"protocol version {hello.get('version')!r}, this coordinator speaks {PROTOCOL_VERSION}"
        elif hello.get("count") != self.count:
            why = f"this run has {self.count} shards, the shard was started with --count {hello.get('count')}"
        elif type(hello.get("index")) is not int or not 0 <= hello["index"] < self.count:
            why = f"shard index {hello.get('index')!r} is not in 0..{self.count - 1}"
        elif hello["index"] in self._peers or self._closed:
            why = f"shard {hello['index']} is already connected" if not self._closed else "the run is over"
        if why is not None:
            writer.write(encode({"op": "refused", "why": why}))
            writer.close()
            return None
        assert hello is not None
        pid = hello.get("pid")
        return _Peer(int(hello["index"]), reader, writer, pid if type(pid) is int else None,
                     str(hello.get("host", "?"))[:255])

    def _config(self, index: int) -> dict[str, Any]:
        return {
            "settings": settings_to_json(self.shares[index]), "base_url": self.target.base_url,
            "model": self.target.model,
            "seed": self.target.seed, "run_id": self.run_id, "lifetime_s": self.lifetime_s,
            "run_tag": self.target.run_tag,  # every shard's request ids carry the same run's tag
            "trace_id": self.target.trace_id,  # and the same run's traceparent (None: none sent)
            # the CA certificates themselves: a shard on another host cannot read the runner's files
            "ca_pems": list(self.target.ca_pems),
            "rules": [rule_to_json(r) for r in self._policy.rules.values()],
        }

    async def _sync(self, peer: _Peer, exchanges: int) -> ClockOffset:
        """``exchanges`` round trips, one at a time (each waits for its pong), then the estimate."""
        assert self._loop is not None
        done = []
        for _ in range(exchanges):
            seq = next(self._seq)
            fut: asyncio.Future[Exchange] = self._loop.create_future()
            peer.pongs[seq] = fut
            peer.send({"op": "ping", "seq": seq, "t0": time.monotonic_ns()})
            await peer.writer.drain()
            try:
                done.append(await asyncio.wait_for(fut, 5.0))
            finally:
                peer.pongs.pop(seq, None)
        clock = estimate(done)
        if abs(clock.offset_ns) >= OFFSET_BOUND:  # no two monotonic clocks are 73 years apart: stamps made up
            raise ProtocolError(f"{self._who(peer)} answered with a clock {clock.offset_ns / 1e9:.3g} s away")
        return clock

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    @staticmethod
    def _who(peer: _Peer) -> str:
        return f"load shard {peer.index} ({peer.host}, pid {peer.pid})"

    async def _reader(self, peer: _Peer) -> None:
        """``_read``, and the peer lost however it ends: an error of any kind (an ``OverflowError`` or a
        ``RecursionError`` once ended the reader and left the shard counted alive, every call then
        waiting on it), or the connection closed before the run closed it."""
        try:
            await self._read(peer)
        except asyncio.CancelledError:
            if not self._closing:
                self._lost(peer, f"{self._who(peer)}: its connection was cut")
            raise
        except Exception as exc:  # noqa: BLE001 - any end of the reader is the end of the shard, recorded
            why = str(exc) if isinstance(exc, ProtocolError) else f"its reader failed: {type(exc).__name__}: {exc}"
            self._lost(peer, f"{self._who(peer)}: {why}"[:1000])
        else:
            if not self._closing:  # at close a shard hanging up is the end of the run, not a loss
                self._lost(peer, f"{self._who(peer)} closed its connection")

    async def _read(self, peer: _Peer) -> None:
        while True:
            message = await read_message(peer.reader)
            if message is None:
                return
            try:
                self._message(peer, message)
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                raise ProtocolError(f"shard {peer.index} sent a malformed {str(message.get('op'))[:40]!r} "
                                    f"message: {exc!r}"[:500]) from None

    def _message(self, peer: _Peer, message: dict[str, Any]) -> None:
        op = message["op"]
        if op == "record":
            if peer.clock is None:
                raise ProtocolError(f"shard {peer.index} sent a record before its clock was measured")
            record = stream_record(message["record"])
            peer.live.add(record.id)
            self.sink(shift_record(record, -peer.clock.offset_ns))
        elif op == "pong":
            t3 = time.monotonic_ns()
            stamps = [message["t0"], message["t1"], message["t2"]]
            if not ints(stamps):  # a 400-digit stamp made an offset no float holds: OverflowError in the report
                raise ProtocolError(f"shard {peer.index} sent pong stamps that are not ints within ±2^62 ns")
            fut = peer.pongs.get(int(message["seq"]))
            if fut is not None and not fut.done():
                fut.set_result(Exchange(stamps[0], stamps[1], stamps[2], t3))
        elif op == "activity":
            if peer.clock is not None:  # before its clock is measured it has no stream in flight yet
                peer.activity = [int(t) - peer.clock.offset_ns for t in numbers(message["stamps"], "activity")]
        elif op == "reply":
            self._reply(peer.index, message)
        else:
            raise ProtocolError(f"unexpected message {str(op)[:40]!r} from shard {peer.index}")

    def _reply(self, i: int, message: dict[str, Any]) -> None:
        entry = self._pending.get(int(message["seq"]))
        if entry is None:
            return
        fut, results, waiting = entry
        if not message.get("ok"):
            if not fut.done():
                fut.set_exception(SetupFailed(f"load shard {i}: {str(message.get('value'))[:500]}"))
            self._pending.pop(int(message["seq"]), None)
            return
        delays = message.get("send_delay", {})
        if type(delays) is not dict:
            raise ProtocolError(f"send_delay: expected an object, got {str(delays)[:40]!r}")
        self._lag[i] = numbers(message.get("lag", []), "lag")
        self._send_delay[i] = {str(k)[:200]: numbers(v, "send_delay") for k, v in delays.items()}
        self._stats[i] = figures(message.get("stats", {}))
        results[i] = message.get("value")
        waiting.discard(i)
        if not waiting:
            self._pending.pop(int(message["seq"]), None)
            if not fut.done():
                fut.set_result(results)

    def _lost(self, peer: _Peer, why: str) -> None:
        """The shard is gone (the first reason is kept): its calls and round trips fail now, and its
        connection is cut, so a shard still there notices and stops its load."""
        if peer.index in self._dead:
            return
        self._dead[peer.index] = why
        for pong in peer.pongs.values():
            if not pong.done():
                pong.set_exception(ProtocolError(why))
        for seq, (fut, _results, waiting) in list(self._pending.items()):
            if peer.index in waiting and not fut.done():
                fut.set_exception(SetupFailed(why + "; its journal shard keeps what it recorded"))
                del self._pending[seq]
        peer.writer.transport.abort()  # not close(): that would wait for a peer that reads nothing

    # ---- commands ------------------------------------------------------------------------------

    def _alive(self) -> list[_Peer]:
        return [p for i, p in sorted(self._peers.items()) if i not in self._dead and p.clock is not None]

    def _broadcast(self, message: dict[str, Any]) -> None:
        for peer in self._alive():
            peer.send(message)

    async def _call(self, cmd: str, args: list[list[Any]] | list[Any], *,
                    until: Callable[[], int] | None = None) -> list[Any]:
        """``cmd`` to every live shard, and every answer, each by ``until()`` (monotonic ns; re-read each
        second, as a run's end moves; default ``call_grace_s`` from now): a shard that has not answered
        by then is lost, and the call fails as a lost shard's does."""
        peers = self._alive()
        if not peers:
            raise SetupFailed("every load shard is gone: " + "; ".join(self._dead.values()))
        if until is None:
            end_ns = time.monotonic_ns() + int(self.call_grace_s * 1e9)
            until = lambda: end_ns  # noqa: E731 - one deadline, read as a moving one is
        seq = next(self._seq)
        fut: asyncio.Future[list[Any]] = self._loop.create_future()
        self._pending[seq] = (fut, [None] * self.count, {p.index for p in peers})
        per_shard = bool(args) and isinstance(args[0], list)
        for peer in peers:
            peer.send({"op": "call", "seq": seq, "cmd": cmd, "args": args[peer.index] if per_shard else args})
        started = time.monotonic()
        try:
            while not fut.done():
                remaining = (until() - time.monotonic_ns()) / 1e9
                if remaining <= 0:
                    self._missed(seq, f"did not answer {cmd!r} within {time.monotonic() - started:.1f}s")
                    break
                await asyncio.wait({fut}, timeout=min(remaining, 1.0))
            return await fut
        finally:
            if not fut.done():  # cancelled: nobody waits for the answers any more
                fut.cancel()
                self._pending.pop(seq, None)

    def _missed(self, seq: int, why: str) -> None:
        """Every shard that has not answered call ``seq`` is lost."""
        entry = self._pending.get(seq)
        for index in sorted(entry[2]) if entry is not None else ():
            self._lost(self._peers[index], f"{self._who(self._peers[index])} {why}")

    def last_activity(self) -> list[int]:
        """Every live shard's in-flight streams' last-byte stamps, as it last reported them, moved onto
        this host's clock by the shard's measured offset (what ``target_down`` reads)."""
        return [t for peer in self._alive() for t in peer.activity]

    def _rules_changed(self, rules: dict[str, ClientRule]) -> None:
        self._broadcast({"op": "rules", "rules": [rule_to_json(r) for r in rules.values()]})

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        self._phase = name
        self._broadcast({"op": "phase", "name": name})

    def _within(self, seconds: float) -> Callable[[], int]:
        """A call's deadline: ``seconds`` of its own from now, and the grace beyond them."""
        end_ns = time.monotonic_ns() + int((max(0.0, seconds) + self.call_grace_s) * 1e9)
        return lambda: end_ns

    async def ready(self) -> None:
        """Every shard connected and its clock measured (``open`` waited for that already), and answering."""
        await self._call("lag", [])

    async def run(self, deadline_ns: int) -> None:
        """The load until ``deadline_ns`` (on this clock; each shard moves it onto its own); a shard must
        answer by that deadline, as it stands then (``move_deadline``), and the grace."""
        self._load_until_ns = deadline_ns
        grace_ns = int(self.call_grace_s * 1e9)
        await self._call("run", [deadline_ns],
                         until=lambda: (self._load_until_ns or deadline_ns) + grace_ns)

    async def move_deadline(self, deadline_ns: int) -> None:
        self._load_until_ns = deadline_ns
        await self._call("deadline", [deadline_ns])  # as run's: each shard moves it onto its own clock

    async def drain(self, timeout: float) -> int:
        return _count(await self._call("drain", [timeout], until=self._within(timeout)))

    async def start(self, fault: str, streams: int, prompt_chars: int, max_tokens: int,
                    settle_s: float = 0.0) -> int:
        from chaos.load.workload import split_evenly

        shares = split_evenly(streams, self.count)
        return _count(await self._call(
            "start", [[fault, shares[i], prompt_chars, max_tokens, settle_s] for i in range(self.count)],
            until=self._within(settle_s)))

    async def stop(self, fault: str) -> int:
        return _count(await self._call("stop", [fault]))

    def lag_stats(self) -> dict[str, Any]:
        return merged_lag(self._lag, self.lag_threshold)

    def send_delay_stats(self) -> dict[str, dict[str, Any]]:
        """Per phase, the shards' open-loop send delay merged, as of their last reply."""
        return merged_send_delay(self._send_delay)

    def stats(self) -> dict[str, Any]:
        return summed_stats(self._stats) | {"shards": self.count}

    # ---- close and merge ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Measure the clocks once more, close every shard, stop local ones, merge the journal shards."""
        if self._closed:
            return
        if self._rules_changed in self._policy.on_change:
            self._policy.on_change.remove(self._rules_changed)
        await self._end_clocks()
        self._closing = True  # from here a shard hanging up is the end of the run, not a loss
        await self._close_shards()
        self._closed = True
        await self._hang_up()
        await asyncio.to_thread(self._stop_local)
        self._merge()

    async def _end_clocks(self) -> None:
        """Each live shard's clock measured once more, all at once, to see how far it drifted over the
        run; one that does not answer within ``END_CLOCK_S`` is lost."""
        peers = self._alive()
        ends = await asyncio.gather(*(asyncio.wait_for(self._sync(p, END_EXCHANGES), END_CLOCK_S) for p in peers),
                                    return_exceptions=True)
        for peer, end in zip(peers, ends, strict=True):
            if isinstance(end, ClockOffset):
                peer.clock_end = end
            else:
                self._lost(peer, f"{self._who(peer)} did not answer the closing clock round trips within "
                                 f"{END_CLOCK_S:g}s ({type(end).__name__}: {end})")

    async def _close_shards(self) -> None:
        """Ask the live shards to close; note how many records each says it wrote."""
        try:
            if self._alive():
                replies = await self._call("close", [], until=self._within(CLOSE_TIMEOUT_S - self.call_grace_s))
                for peer in self._peers.values():
                    value = replies[peer.index]
                    if isinstance(value, dict) and type(value.get("records")) is int:
                        peer.written = value["records"]
        except SetupFailed:
            pass  # the shards that did not answer are lost, and their journal shards are merged below

    async def _hang_up(self) -> None:
        """Close every connection and the server; wait a little for each connection's reader to end, then
        cut what is left (a peer that reads nothing keeps a closing connection open forever)."""
        for peer in self._peers.values():
            peer.writer.close()
        if self._server is not None:
            self._server.close()
        tasks = [p.task for p in self._peers.values() if p.task is not None and p.task is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=HANG_UP_S)
        for peer in self._peers.values():
            peer.writer.transport.abort()

    def _stop_local(self) -> None:
        """Our own shard processes: a closed one exits by itself; one that never joined or closed is stopped.
        All are waited for together: ``CLOSE_TIMEOUT_S`` in all, then killed."""
        closed = {p.pid for p in self._peers.values() if p.written is not None}
        for proc in self._procs:
            if proc.pid not in closed and proc.poll() is None:
                proc.terminate()  # still dialling, or cut off: by its pid, never by name
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def _merge_file(self, path: Path, peer: _Peer, entry: dict[str, Any]) -> None:
        """The records only ``path`` holds, to the sink; what was taken and dropped, to ``entry``."""
        assert peer.clock is not None
        try:
            shard = read_journal_shard(path, peer.clock.offset_ns, peer.live, self.run_id)
        except OSError as exc:
            shard = JournalShard(refused=f"{path.name}: {exc.strerror or exc}")
        for record in shard.records:
            self.sink(record)
        entry.update(journal=path.name, records_from_journal=len(shard.records), refused=shard.refused)
        if shard.dropped:  # a line that was not a valid record: counted and named, never judged
            entry.update(records_dropped=shard.dropped, dropped_why=shard.dropped_why)

    def _merge(self) -> None:
        """Add what only the journal shards hold; say per shard what came how, and the clocks."""
        shards: dict[str, dict[str, Any]] = {}  # by index (a mapping: the report shows one table per shard)
        for i in range(self.count):
            peer = self._peers.get(i)
            entry: dict[str, Any] = {"index": i, "connected": peer is not None}
            shards[str(i)] = entry
            if peer is not None and peer.clock is None and i in self._dead:
                entry["lost"] = self._dead[i]  # connected, and lost before its clock was measured
            if peer is None or peer.clock is None:
                continue
            entry.update(host=peer.host, pid=peer.pid, clock=asdict(peer.clock), records_live=len(peer.live),
                         records_written=peer.written, lost=self._dead.get(i))
            if peer.clock_end is not None:
                entry["clock_end"] = asdict(peer.clock_end)
                entry["drift_ns"] = peer.clock_end.offset_ns - peer.clock.offset_ns
            path = self.run_dir / shard_journal_name(i)
            if path.is_file():
                self._merge_file(path, peer, entry)
            else:
                entry["journal"] = None  # elsewhere (a pod without a shared volume): the live records are all there is
            known = len(peer.live) + entry.get("records_from_journal", 0)
            if peer.written is not None and known < peer.written:
                entry["records_missing"] = peer.written - known
        if self.notes is not None:
            self.notes(Note(topic="shards", t=time.monotonic_ns(), data={
                "count": self.count, "launch": self.launch, "address": self.address, "shards": shards,
                "clock": "shard stamps moved by -offset_ns onto the coordinator's monotonic clock; error within "
                         "±bound_ns",
            }))


def _count(values: list[Any]) -> int:
    """The streams several shards counted (drain, start, stop): what is not a count is not added."""
    return sum(n for n in values if type(n) is int and 0 <= n < 2**31)
