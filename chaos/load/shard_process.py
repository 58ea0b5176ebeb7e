"""One load shard: a process that drives its share of a run's load for a coordinator on another host.

``streamchaos shard --coordinator HOST:PORT --index K --count N`` (the index defaults to
``JOB_COMPLETION_INDEX``, so a pod of a Kubernetes Indexed Job needs no per-pod arguments) connects
to the coordinator (retrying until ``--connect-timeout``: a pod may start before the coordinator
listens), proves it holds the run's shard token, receives its share of the load (settings, target
URL, seed, client rules), answers clock round trips, and then follows the coordinator's commands —
phase changes, client-rule changes, run, drain, background streams, close — exactly as a local load
worker does (``chaos.load.workers``).

Every record it makes is appended to its journal shard ``journal.shard-K.jsonl`` (stamped on its
own clock, beside the offset the coordinator measured) and sent to the coordinator as it is made.
Safety: when the coordinator goes away — it was stopped, halted, killed, or the network broke —
the shard cancels its load and exits, and it never runs longer than the lifetime the coordinator
gave it. A shard never imports a fault family.

``STREAMCHAOS_SHARD_CLOCK_SKEW_NS`` (tests) makes the shard's clock read that much off, as a host
whose monotonic clock counts from another boot would: every stamp it sends and writes, and every
clock reading it answers with, is moved by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from chaos.host.journal_file import JournalFile
from chaos.host.redact import redact, register_secret
from chaos.load.clock import shift_record
from chaos.load.generator import LoadGenerator
from chaos.load.wire import (
    ACTIVITY_EVERY_S,
    PROTOCOL_VERSION,
    ProtocolError,
    encode,
    read_message,
    rules_from_json,
    settings_from_json,
)
from chaos.load.workload import LoadTarget
from chaos.model.context import ClientPolicy
from chaos.model.errors import ChaosError, SetupFailed
from chaos.model.observations import StreamRecord, to_json

__all__ = ["SKEW_ENV", "TOKEN_ENV", "ShardLost", "run_shard", "shard_journal_name"]

TOKEN_ENV = "STREAMCHAOS_SHARD_TOKEN"
API_KEY_ENV = "STREAMCHAOS_API_KEY"
SKEW_ENV = "STREAMCHAOS_SHARD_CLOCK_SKEW_NS"
CONNECT_RETRY_S = 0.5
WELCOME_TIMEOUT_S = 30.0


def shard_journal_name(index: int) -> str:
    return f"journal.shard-{index}.jsonl"


class ShardLost(ChaosError):
    """The coordinator went away (or refused this shard); the shard's load was stopped."""

    exit_code = 4


class _Shard:
    """The shard's side of one connection: its generator, its journal shard, its clock."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int, count: int,
                 journal_dir: Path, skew_ns: int) -> None:
        self.reader, self.writer = reader, writer
        self.index, self.count = index, count
        self.journal_dir = journal_dir
        self.skew_ns = skew_ns
        self.offset_ns = 0  # shard − coordinator, as the coordinator measured it
        self.gen: LoadGenerator | None = None
        self.policy = ClientPolicy()
        self.journal: JournalFile | None = None
        self.written = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def now(self) -> int:
        return time.monotonic_ns() + self.skew_ns

    def send(self, message: dict[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(encode(message))

    def sink(self, record: StreamRecord) -> None:
        """Every record: to the journal shard first (it survives a broken connection), then to the coordinator;
        redacted before either (a target that echoes the API key must not have it written or sent on)."""
        record = shift_record(record, self.skew_ns)
        line = redact(to_json(record))
        if self.journal is not None:
            self.journal.write(line)
            self.written += 1
        if not self.writer.is_closing():
            self.writer.write(b'{"op":"record","record":' + line.encode("utf-8") + b"}\n")

    def setup(self, config: dict[str, Any], target_url: str | None, api_key: str | None) -> None:
        from chaos.host.fd_limit import ensure_open_files, open_files_needed
        from chaos.host.tls import trust_data
        from chaos.load.generator import DEFAULT_INFLIGHT_CAP
        from chaos.load.workload import streams_at_most

        settings = settings_from_json(config["settings"])
        # a shard on another host or in a pod inherits no limit the runner raised: it raises its own to
        # what its share of the streams needs, one socket each (SetupFailed, one line, when the hard
        # limit is too low)
        open_files = ensure_open_files(open_files_needed(streams_at_most(settings, DEFAULT_INFLIGHT_CAP), 1))
        self.policy.rules = rules_from_json(config.get("rules", []))
        path = self.journal_dir / shard_journal_name(self.index)
        self.journal_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.journal = JournalFile(path, create=True)
        self.journal.write({"type": "shard", "index": self.index, "count": self.count, "run_id": config.get("run_id"),
                            "pid": os.getpid(), "host": socket.gethostname(), "skew_ns": self.skew_ns,
                            "open_files": open_files.to_dict()}, durable=True)
        target = LoadTarget(base_url=target_url or str(config["base_url"]), model=str(config["model"]),
                            seed=int(config["seed"]), api_key=api_key, run_tag=_run_tag(config.get("run_tag")),
                            trace_id=_trace_id(config.get("trace_id")))
        for pem in config.get("ca_pems", ()):  # what the runner trusts beyond the host (its own TLS servers)
            trust_data(str(pem))
        self.gen = LoadGenerator(settings, target, policy=self.policy, sink=self.sink, worker_index=self.index,
                                 workers=self.count)

    async def reply(self, seq: int, call: Awaitable[Any]) -> None:
        gen = self.gen
        assert gen is not None
        try:
            value = await call
            self.send({"op": "reply", "seq": seq, "ok": True, "value": value, "lag": list(gen.lag.samples),
                       "stats": gen.stats(),
                       "send_delay": _send_delays(gen)})
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the coordinator, never lost
            self.send({"op": "reply", "seq": seq, "ok": False, "value": f"{type(exc).__name__}: {exc}"})

    def call(self, seq: int, cmd: str, args: list[Any]) -> None:
        gen = self.gen
        assert gen is not None
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            # the coordinator's deadline, on its clock → this shard's clock → the real monotonic clock here
            "run": lambda: gen.run(int(args[0]) + self.offset_ns - self.skew_ns),
            "deadline": lambda: gen.move_deadline(int(args[0]) + self.offset_ns - self.skew_ns),
            "drain": lambda: gen.drain(float(args[0])),
            "start": lambda: gen.start(str(args[0]), int(args[1]), int(args[2]), int(args[3]),
                                       float(args[4]) if len(args) > 4 else 0.0),
            "stop": lambda: gen.stop(str(args[0])),
            "lag": lambda: asyncio.sleep(0),
        }
        if cmd not in calls:
            self.send({"op": "reply", "seq": seq, "ok": False, "value": f"unknown command {cmd!r}"})
            return
        task = asyncio.get_running_loop().create_task(self.reply(seq, calls[cmd]()))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def report_activity(self) -> None:
        """Every ACTIVITY_EVERY_S, when this shard's in-flight streams last got a byte (on the shard's
        clock, as its records are): what the coordinator's ``target_down`` halt reads, as it reads a
        local worker's."""
        sent_empty = False
        while True:
            await asyncio.sleep(ACTIVITY_EVERY_S)
            stamps = [t + self.skew_ns for t in self.gen.last_activity()] if self.gen is not None else []
            if stamps or not sent_empty:  # an idle shard says so once, then keeps quiet
                self.send({"op": "activity", "stamps": stamps})
            sent_empty = not stamps

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.gen is not None:
            await self.gen.aclose()  # open streams are cancelled and recorded (to the journal shard)

    async def serve(self) -> str:
        """Follow the coordinator until it says close (``"closed"``) or goes away (why)."""
        while True:
            message = await read_message(self.reader)
            if message is None:
                return "the coordinator closed the connection"
            op = message["op"]
            if op == "ping":
                t1 = self.now()
                self.send({"op": "pong", "seq": message.get("seq"), "t0": message.get("t0"), "t1": t1,
                           "t2": self.now()})
            elif op == "offset":
                self.offset_ns = int(message["offset_ns"])
                if self.journal is not None:
                    self.journal.write({"type": "clock", "offset_ns": self.offset_ns,
                                        "bound_ns": message.get("bound_ns"),
                                        "t": self.now()}, durable=True)
            elif op == "phase" and self.gen is not None:
                self.gen.phase = str(message["name"])
            elif op == "rules":
                self.policy.rules = rules_from_json(message["rules"])
            elif op == "call" and message.get("cmd") == "close":
                await self.stop()
                gen = self.gen
                self.send({"op": "reply", "seq": message["seq"], "ok": True, "value": {"records": self.written},
                           "lag": list(gen.lag.samples) if gen else [], "stats": gen.stats() if gen else {},
                           "send_delay": _send_delays(gen) if gen else {}})
                return "closed"
            elif op == "call":
                self.call(int(message["seq"]), str(message["cmd"]), list(message.get("args", [])))
            else:
                raise ProtocolError(f"unexpected message {op!r} from the coordinator")
            await self.writer.drain()


async def _connect(host: str, port: int, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            from chaos.load.wire import MAX_LINE_BYTES

            return await asyncio.wait_for(asyncio.open_connection(host, port, limit=MAX_LINE_BYTES), 10.0)
        except (OSError, asyncio.TimeoutError) as exc:
            if time.monotonic() + CONNECT_RETRY_S > deadline:
                raise SetupFailed(f"the coordinator at {host}:{port} did not accept a connection within {timeout:g}s: "
                                  f"{exc}") from None
            await asyncio.sleep(CONNECT_RETRY_S)


async def _introduce(shard_args: tuple[str, int, int, Path, int], token: str, connect_timeout: float,
                     ) -> tuple[_Shard, dict[str, Any]]:
    """Connect and say hello until the coordinator answers (a coordinator with too many unproven
    connections open closes a new one unread: the shard dials again, within ``connect_timeout``);
    the shard and its welcome, or ``ShardLost`` when refused."""
    coordinator, index, count, journal_dir, skew_ns = shard_args
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + connect_timeout
    while True:
        reader, writer = await _connect(host.strip("[]"), int(port), max(0.0, deadline - time.monotonic()))
        shard = _Shard(reader, writer, index, count, journal_dir, skew_ns)
        try:
            shard.send({"op": "hello", "token": token, "index": index, "count": count, "version": PROTOCOL_VERSION,
                        "pid": os.getpid(), "host": socket.gethostname()})
            await writer.drain()
            welcome = await asyncio.wait_for(read_message(reader), WELCOME_TIMEOUT_S)
        except (ConnectionError, ProtocolError):
            welcome = None
        except BaseException:
            writer.close()
            raise
        if welcome is not None and welcome["op"] == "welcome":
            return shard, welcome
        writer.close()
        if welcome is not None or time.monotonic() + CONNECT_RETRY_S > deadline:
            why = (welcome or {}).get("why", "it closed the connection")
            raise ShardLost(f"the coordinator at {coordinator} refused shard {index}: {why}")
        await asyncio.sleep(CONNECT_RETRY_S)  # closed unanswered: busy, not refused


async def run_shard(coordinator: str, *, index: int, count: int, token: str, journal_dir: Path,
                    target_url: str | None = None, api_key: str | None = None, connect_timeout: float = 300.0,
                    skew_ns: int = 0) -> str:
    """Be shard ``index`` of ``count`` for the coordinator at ``coordinator`` (host:port); return how it ended."""
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise SetupFailed(f"--coordinator {coordinator!r}: expected HOST:PORT")
    register_secret(api_key)  # the journal shard, its records and what it prints are redacted as the runner's are
    register_secret(token)
    shard, welcome = await _introduce((coordinator, index, count, journal_dir, skew_ns), token, connect_timeout)
    try:
        shard.setup(welcome["config"], target_url, api_key)
        lifetime = float(welcome["config"].get("lifetime_s", 3600.0))
        serving = asyncio.ensure_future(asyncio.wait_for(shard.serve(), lifetime))
        stopped_by = _on_signals(serving)
        reporting = asyncio.ensure_future(shard.report_activity())
        try:
            ended = await serving
        except asyncio.TimeoutError:
            ended = f"the run outlived this shard's lifetime ({lifetime:g}s)"
        except (ProtocolError, ConnectionError) as exc:
            ended = f"the connection to the coordinator broke: {exc}"
        except (KeyError, TypeError, ValueError) as exc:  # a message with the wrong fields: not our coordinator
            ended = f"the coordinator sent a malformed message: {exc!r}"
        except asyncio.CancelledError:
            if not stopped_by:
                raise
            ended = f"stopped by {stopped_by[0]}"
        finally:
            reporting.cancel()
        if ended != "closed":
            await shard.stop()  # no coordinator, no load: a shard never drives load on its own
            raise ShardLost(f"shard {index}: {ended}; its load was stopped ({shard.written} records in its journal "
                            "shard)")
        return ended
    finally:
        if shard.journal is not None:
            shard.journal.write({"type": "shard-end", "records": shard.written}, durable=True)
            shard.journal.close()
        shard.writer.close()
        with contextlib.suppress(Exception):
            await shard.writer.wait_closed()


def _run_tag(value: object) -> int | None:
    """The run's tag the coordinator sent (None from one that sends none: a tag from the seed alone)."""
    return value if type(value) is int and 0 <= value < 2**32 else None


def _trace_id(value: object) -> str | None:
    """The run's trace id the coordinator sent: 32 lower-case hex digits, else None (no traceparent)."""
    ok = isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value)
    return value if ok and isinstance(value, str) else None


def _on_signals(task: asyncio.Future[str]) -> list[str]:
    """SIGTERM/SIGINT (a pod deleted, Ctrl-C) stop the shard's load in order; the list names the signal."""
    import signal

    got: list[str] = []
    loop = asyncio.get_running_loop()

    def stop(sig: signal.Signals) -> None:
        got.append(sig.name)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            loop.add_signal_handler(sig, stop, sig)
    return got


def shard_main(args: Any) -> int:
    """The ``streamchaos shard`` command (args parsed by ``chaos.cli``)."""
    index = args.index if args.index is not None else os.environ.get("JOB_COMPLETION_INDEX")
    if index is None or not str(index).isdigit():
        raise SetupFailed("shard: give --index K, or run as a pod of an Indexed Job (JOB_COMPLETION_INDEX)")
    token = _secret(args.token_file, TOKEN_ENV)
    if not token:
        raise SetupFailed(f"shard: the run's shard token is needed: set {TOKEN_ENV} or --token-file")
    skew = int(os.environ.get(SKEW_ENV, "0") or 0)
    ended = asyncio.run(run_shard(
        args.coordinator, index=int(index), count=args.count, token=token, journal_dir=Path(args.journal_dir),
        target_url=args.target_url, api_key=_secret(args.api_key_file, API_KEY_ENV),
        connect_timeout=args.connect_timeout,
        skew_ns=skew,
    ))
    print(f"shard {index}: {ended}", file=sys.stderr)
    return 0


def _secret(path: str | None, env: str) -> str | None:
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise SetupFailed(f"cannot read {path}: {exc.strerror}") from None
    return os.environ.get(env, "").strip() or None


def _send_delays(gen: LoadGenerator) -> dict[str, list[float]]:
    """The generator's open-loop send delays per phase (seconds), for the coordinator to merge."""
    return {phase: list(samples) for phase, samples in gen.send_delays.items()}
