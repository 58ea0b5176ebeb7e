"""``load.workers: N``: the generator in N processes of its own, driven like one ``LoadGenerator``.

Each worker gets its share of the load (concurrency, rate, max_requests and background streams
divided as evenly as integers allow) and its own request ids and seeds (via its worker index).
Records come back over a pipe in batches (``chaos.load.uplink``: a worker never blocks its loop on
the pipe) and go to the parent's sink as they arrive, so the observation set is one merged stream;
the parent forwards phase changes and client-rule changes to every worker.
Monotonic clocks are system-wide on Linux, so stamps from different workers are comparable.

A worker is ``python -P -m chaos.load.worker_process``, an entry point of ours, never the caller's
``__main__``: multiprocessing's spawn re-ran the caller's main module in the child, so a script
calling ``chaos.run()`` without an ``if __name__ == "__main__":`` guard ran its body twice (and the
run failed), and ``python -`` failed on ``<stdin>``. The child gets the parent's ``sys.path`` as
its ``PYTHONPATH`` (it finds chaos where the parent did, as spawn's copy of ``sys.path`` did) and
its settings as the first message down its command pipe.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import multiprocessing
import multiprocessing.connection
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from chaos.host.cadence import sleep_to_next_tick
from chaos.host.children import spawn
from chaos.load.generator import LoadGenerator
from chaos.load.lag import merged_lag, merged_send_delay, summed_stats
from chaos.load.uplink import FrameReader, Uplink
from chaos.load.wire import ACTIVITY_EVERY_S
from chaos.load.workload import LoadSettings, LoadSpecLike, LoadTarget, split_evenly
from chaos.model.context import ClientPolicy, ClientRule
from chaos.model.errors import SetupFailed
from chaos.model.observations import StreamRecord

__all__ = ["WorkerPool"]

_CLOSE_TIMEOUT_S = 10.0
_ENTRY = "chaos.load.worker_process"  # python -m this: the worker's main module, ours


# ---- the worker process ------------------------------------------------------------------------


def _watch(loop: asyncio.AbstractEventLoop, conn: multiprocessing.connection.Connection,
           callback: Callable[[], None]) -> None:
    """``loop.add_reader`` on a pipe's read end, which stays blocking: uvloop makes a watched fd
    non-blocking, and ``Connection.recv`` of a message still being written would then fail midway.
    Each pipe carries one direction only, so the write ends are never made non-blocking (a full
    pipe would otherwise raise BlockingIOError in ``send`` and lose a record)."""
    loop.add_reader(conn.fileno(), callback)
    os.set_blocking(conn.fileno(), True)


def serve_pipes(inbox_fd: int, outbox_fd: int) -> None:
    """A worker process's main (``python -m chaos.load.worker_process INBOX_FD OUTBOX_FD``): commands
    come down ``inbox_fd``, the first of them its settings; records and replies go up ``outbox_fd``."""
    import signal

    from chaos.load.loop import run

    # Ctrl-C on a terminal signals the whole process group, this worker too. The parent stops the load
    # in order (revert, drain, then `close` over the pipe, which flushes this worker's last records);
    # a KeyboardInterrupt here would only cut that short and print a traceback. SIGTERM still ends
    # it, and a parent that dies closes the pipe, which ends `serve`.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inbox = multiprocessing.connection.Connection(inbox_fd, writable=False)
    outbox = multiprocessing.connection.Connection(outbox_fd, readable=False)
    try:
        config = inbox.recv()
    except EOFError:
        return  # the parent went away before it sent the settings: nothing to run
    run(_worker(inbox, outbox, config))  # uvloop when installed: the worker's loop is ours to choose


async def _worker(conn: multiprocessing.connection.Connection, out: multiprocessing.connection.Connection,
                  config: dict[str, Any]) -> None:
    uplink = await Uplink.open(out.fileno())
    out.close()  # the uplink's transport holds its own duplicate of the write end
    await _WorkerSide(conn, uplink, config).serve()


class _WorkerSide:
    """A worker process's half of the pool protocol: commands in on one pipe (phase, rules, calls on
    its ``LoadGenerator``, close), records, activity and replies out on the other (the uplink)."""

    def __init__(self, conn: multiprocessing.connection.Connection, uplink: Uplink, config: dict[str, Any]) -> None:
        self.conn, self.uplink = conn, uplink
        self.loop = asyncio.get_running_loop()
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.policy = ClientPolicy(rules=dict(config.pop("rules")))
        self.gen = LoadGenerator(config.pop("spec"), config.pop("target"), policy=self.policy,
                                 sink=uplink.record, **config)
        self.tasks: set[asyncio.Task[None]] = set()

    async def serve(self) -> None:
        _watch(self.loop, self.conn, self._pump)
        while True:
            seq, cmd, *args = await self.inbox.get()
            if cmd == "close":
                await self._close(seq)
                break
            self._dispatch(seq, cmd, args)
        self.loop.remove_reader(self.conn.fileno())
        self.conn.close()
        await self.uplink.aclose()

    def _pump(self) -> None:
        try:
            while self.conn.poll():
                self.inbox.put_nowait(self.conn.recv())
        except (EOFError, OSError):
            self.loop.remove_reader(self.conn.fileno())
            self.inbox.put_nowait((-1, "close"))  # the parent is gone: stop

    async def _report_activity(self) -> None:  # what a halt condition reads of streams still in flight
        while True:
            await sleep_to_next_tick(ACTIVITY_EVERY_S)  # arrives when the runner wakes for its own ticks
            self.uplink.send(("activity", self.gen.last_activity()))

    def _dispatch(self, seq: int, cmd: str, args: list[Any]) -> None:
        gen = self.gen
        if cmd == "phase":
            gen.phase = args[0]
            return
        if cmd == "rules":
            self.policy.rules = dict(args[0])
            return
        if cmd == "activity":  # a halt condition reads the streams in flight: report them from now on
            if not any(task.get_name() == "activity" for task in self.tasks):
                self.tasks.add(self.loop.create_task(self._report_activity(), name="activity"))
            return
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "run": lambda: gen.run(args[0]),
            "deadline": lambda: gen.move_deadline(args[0]),
            "drain": lambda: gen.drain(args[0]),
            "start": lambda: gen.start(*args),
            "stop": lambda: gen.stop(args[0]),
            "lag": lambda: asyncio.sleep(0),
        }
        task = self.loop.create_task(self._reply(seq, calls[cmd]()))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _snapshot(self, value: Any) -> dict[str, Any]:
        """A reply's value with the generator's lag samples, counters and send delays."""
        gen = self.gen
        return {"value": value, "lag": list(gen.lag.samples), "stats": gen.stats() | self.uplink.stats(),
                "send_delay": {phase: list(samples) for phase, samples in gen.send_delays.items()}}

    async def _reply(self, seq: int, call: Awaitable[Any]) -> None:
        try:
            value = await call
            self.uplink.send(("reply", seq, True, self._snapshot(value)))
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the parent, never lost
            self.uplink.send(("reply", seq, False, f"{type(exc).__name__}: {exc}"))

    async def _close(self, seq: int) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.gen.aclose()
        if seq >= 0:
            self.uplink.send(("reply", seq, True, self._snapshot(None)))


# ---- the parent side ---------------------------------------------------------------------------


class WorkerPool:
    """N worker processes behind the ``LoadGenerator`` interface (run, drain, aclose, lag_stats, start, stop)."""

    def __init__(
        self,
        spec: LoadSpecLike,
        target: LoadTarget,
        *,
        policy: ClientPolicy,
        sink: Callable[[StreamRecord], None],
        workers: int | None = None,
    ) -> None:
        count = max(1, workers if workers is not None else spec.workers)
        if spec.concurrency is not None:
            count = min(count, spec.concurrency)  # every worker needs at least one slot
        self.count = count
        self.sink = sink
        self._phase = ""
        self._seq = itertools.count()
        self._pending: dict[int, tuple[asyncio.Future[list[Any]], list[Any], set[int]]] = {}
        self._lag: dict[int, list[float]] = {}
        self._send_delay: dict[int, dict[str, list[float]]] = {}
        self._stats: dict[int, dict[str, Any]] = {}
        self._activity: dict[int, list[int]] = {}
        self.lag_threshold = spec.lag_threshold
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dead: dict[int, str] = {}
        self._unconfirmed: list[int] = []  # workers whose close reply did not arrive within _CLOSE_TIMEOUT_S
        conc = split_evenly(spec.concurrency, count) if spec.concurrency is not None else [None] * count
        reqs = split_evenly(spec.max_requests, count) if spec.max_requests is not None else [None] * count
        self._conns: list[multiprocessing.connection.Connection] = []  # parent → worker i (commands)
        self._inboxes: list[multiprocessing.connection.Connection] = []  # worker i → parent (records, replies)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._readers: list[asyncio.BaseTransport] = []
        for i in range(count):
            part = LoadSettings.of(
                spec,
                concurrency=conc[i],
                rate=(spec.rate / count) if spec.rate is not None else None,
                max_requests=reqs[i],
                workers=count,
            )
            config = {
                "spec": part, "target": target, "worker_index": i, "workers": count, "rules": dict(policy.rules),
            }
            self._start_worker(config)
        policy.on_change.append(self._rules_changed)
        self._policy = policy

    # ---- plumbing ----

    def _start_worker(self, config: dict[str, Any]) -> None:
        # one pipe per direction (see _watch): commands down, records and replies up
        down_r, down_w = multiprocessing.Pipe(duplex=False)
        up_r, up_w = multiprocessing.Pipe(duplex=False)
        try:
            proc = _start_process(down_r.fileno(), up_w.fileno())
        except BaseException:
            for conn in (down_r, down_w, up_r, up_w):
                conn.close()
            self._kill_started()
            raise
        finally:
            down_r.close()  # the child holds its own copies
            up_w.close()
        self._conns.append(down_w)
        self._inboxes.append(up_r)
        self._procs.append(proc)
        try:
            down_w.send(config)  # blocks only until the child reads, past the pipe's 64 KiB
        except OSError:
            pass  # it died at once: its uplink's end says so (_lost) at the first call

    def _kill_started(self) -> None:
        """A worker failed to start: the ones already started go (our own children, by pid)."""
        for proc in self._procs:
            proc.kill()
            _exited_within(proc, 5)
        for conn in (*self._conns, *self._inboxes):
            conn.close()

    async def _attach(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        for i, inbox in enumerate(self._inboxes):
            pipe = os.fdopen(os.dup(inbox.fileno()), "rb", buffering=0)
            inbox.close()  # the read transport owns the duplicate
            reader = functools.partial(FrameReader, functools.partial(self._message, i),
                                       functools.partial(self._lost, i))
            transport, _ = await loop.connect_read_pipe(reader, pipe)
            self._readers.append(transport)

    def _lost(self, i: int) -> None:
        """Worker ``i``'s uplink closed: it exited (or closed after its last reply)."""
        if i in self._dead:
            return
        code = self._procs[i].poll()
        self._dead[i] = f"load worker {i} (pid {self._procs[i].pid}) exited (code {code})"
        for seq, (fut, _results, waiting) in list(self._pending.items()):
            if i in waiting and not fut.done():
                fut.set_exception(SetupFailed(self._dead[i] + "; see its stderr for the cause"))
                del self._pending[seq]

    def _message(self, i: int, msg: tuple[Any, ...]) -> None:
        if msg[0] == "records":
            for record in msg[1]:
                self.sink(record)
            return
        if msg[0] == "activity":
            self._activity[i] = list(msg[1])
            return
        _tag, seq, ok, value = msg
        entry = self._pending.get(seq)
        if entry is None:
            return
        fut, results, waiting = entry
        if not ok:
            if not fut.done():
                fut.set_exception(SetupFailed(f"load worker {i}: {value}"))
            del self._pending[seq]
            return
        self._lag[i] = value["lag"]
        self._send_delay[i] = value.get("send_delay", {})
        self._stats[i] = value["stats"]
        results[i] = value["value"]
        waiting.discard(i)
        if not waiting:
            del self._pending[seq]
            if not fut.done():
                fut.set_result(results)

    def _send(self, i: int, msg: tuple[Any, ...]) -> None:
        if i not in self._dead:
            try:
                self._conns[i].send(msg)
            except (OSError, BrokenPipeError):
                self._dead[i] = f"load worker {i} is gone"

    def _broadcast(self, cmd: str, *args: Any) -> None:
        for i in range(self.count):
            self._send(i, (-1, cmd, *args))

    async def _call(self, per_worker: list[tuple[Any, ...]] | tuple[Any, ...], cmd: str) -> list[Any]:
        await self._attach()
        assert self._loop is not None
        seq = next(self._seq)
        fut: asyncio.Future[list[Any]] = self._loop.create_future()
        alive = {i for i in range(self.count) if i not in self._dead}
        if not alive:
            raise SetupFailed("every load worker has exited: " + "; ".join(self._dead.values()))
        self._pending[seq] = (fut, [None] * self.count, set(alive))
        for i in alive:
            args = per_worker[i] if isinstance(per_worker, list) else per_worker
            self._send(i, (seq, cmd, *args))
        return await fut

    def report_activity(self) -> None:
        """Have every worker report its in-flight streams' last-byte stamps from now on, each
        ``ACTIVITY_EVERY_S`` (what ``last_activity`` returns). Off unless asked: only a
        ``target_down`` halt condition reads them, and a report woke the runner on every tick."""
        self._broadcast("activity")

    def last_activity(self) -> list[int]:
        """Every worker's in-flight streams' last-byte stamps, as it last reported them (CLOCK_MONOTONIC
        is one clock for all processes of the host); nothing unless ``report_activity`` was called."""
        return [t for i, stamps in self._activity.items() if i not in self._dead for t in stamps]

    def _rules_changed(self, rules: dict[str, ClientRule]) -> None:
        self._broadcast("rules", rules)

    # ---- the LoadGenerator interface ----

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, name: str) -> None:
        self._phase = name
        self._broadcast("phase", name)

    async def ready(self, timeout: float = 30.0) -> None:
        """Wait until every worker process is up and answering (spawning takes a second or so)."""
        try:
            await asyncio.wait_for(self._call((), "lag"), timeout)
        except asyncio.TimeoutError:
            raise SetupFailed(f"load workers did not start within {timeout:g}s") from None

    async def run(self, deadline_ns: int) -> None:
        await self._call((deadline_ns,), "run")

    async def move_deadline(self, deadline_ns: int) -> None:
        await self._call((deadline_ns,), "deadline")

    async def drain(self, timeout: float) -> int:
        return sum(n or 0 for n in await self._call((timeout,), "drain"))

    async def start(self, fault: str, streams: int, prompt_chars: int, max_tokens: int,
                    settle_s: float = 0.0) -> int:
        shares = split_evenly(streams, self.count)
        return sum(n or 0 for n in await self._call(
            [(fault, shares[i], prompt_chars, max_tokens, settle_s) for i in range(self.count)], "start"))

    async def stop(self, fault: str) -> int:
        return sum(n or 0 for n in await self._call((fault,), "stop"))

    async def refresh_lag(self) -> dict[str, Any]:
        """Fetch the workers' latest lag samples, then summarise them."""
        await self._call((), "lag")
        return self.lag_stats()

    def lag_stats(self) -> dict[str, Any]:
        """Merged lag over all workers as of their last reply, plus each worker's own summary."""
        return merged_lag(self._lag, self.lag_threshold)

    def send_delay_stats(self) -> dict[str, dict[str, Any]]:
        """Per phase, the workers' open-loop send delay merged, as of their last reply."""
        return merged_send_delay(self._send_delay)

    def stats(self) -> dict[str, Any]:
        out = summed_stats(self._stats) | {"workers": self.count}
        if self._unconfirmed:  # their last records may be missing from the journal: aclose says why
            out["closed_unconfirmed"] = list(self._unconfirmed)
        return out

    async def aclose(self) -> None:
        if self._policy is not None and self._rules_changed in self._policy.on_change:
            self._policy.on_change.remove(self._rules_changed)
        try:
            if any(i not in self._dead for i in range(self.count)):
                await asyncio.wait_for(self._call((), "close"), _CLOSE_TIMEOUT_S)
        except asyncio.TimeoutError:
            # a worker's close reply comes after every record it made (one uplink, in order): one that
            # did not come in time means records still in its uplink (a backlog, a spill) are lost with
            # it when it is stopped below. The journal's load_process note says which workers.
            self._unconfirmed = sorted({i for _fut, _results, waiting in self._pending.values() for i in waiting
                                        if i not in self._dead})
        except SetupFailed:
            pass
        finally:
            loop = asyncio.get_running_loop()
            for proc in self._procs:
                if not await loop.run_in_executor(None, _exited_within, proc, _CLOSE_TIMEOUT_S):
                    proc.kill()  # our own child, by its pid; it ignored a close request
                    await loop.run_in_executor(None, _exited_within, proc, 5)
            for transport in self._readers:
                transport.close()
            for conn in self._inboxes:
                conn.close()
            for conn in self._conns:
                conn.close()
            self._dead.update({i: "closed" for i in range(self.count)})


def _start_process(inbox_fd: int, outbox_fd: int) -> subprocess.Popen[bytes]:
    """One worker process, from our entry point (see the module's docstring). ``-P``: nothing from the
    working directory comes before the parent's path."""
    if not sys.executable:
        raise SetupFailed("cannot start the load process: sys.executable is empty (an embedded interpreter); "
                          "set load.process: runner to run the load on the runner's loop")
    env = dict(os.environ, PYTHONPATH=_parent_path())
    try:
        return spawn([sys.executable, "-P", "-m", _ENTRY, str(inbox_fd), str(outbox_fd)],
                     pass_fds=(inbox_fd, outbox_fd), stdin=subprocess.DEVNULL, env=env)
    except OSError as exc:
        raise SetupFailed(f"cannot start the load process ({sys.executable}): {exc}") from exc


def _parent_path() -> str:
    """This process's ``sys.path`` as a ``PYTHONPATH``, relative entries (``''`` of ``-c``, stdin, a REPL)
    made absolute; an entry holding the separator cannot be written there and is left out."""
    cwd = os.getcwd()
    entries = [os.path.join(cwd, p) for p in sys.path if isinstance(p, str)]
    return os.pathsep.join(p for p in entries if os.pathsep not in p)


def _exited_within(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True
