"""One direction of one proxied connection, and the per-connection toxic stages on it.

A :class:`Link` moves bytes from a source transport to a destination transport. With no toxic on
its direction it forwards each read straight to ``dst.write`` (no task, no queue). With toxics it
runs a pipeline like Toxiproxy's: one :class:`Stage` (a task with an input deque) per toxic, in
creation order, the last one feeding the sink. Live changes:

* add: a stage is appended; the previous last stage is interrupted (re-rolls its toxicity and
  releases a chunk it was delaying), as in Go.
* update: every stage of that toxic is interrupted and restarted with the new attributes.
* remove: the stage turns into a pass-through, runs the toxic's cleanup (``timeout`` closes the
  connection), forwards what it still holds, and unlinks itself once empty, so order is kept.

Backpressure: the source is paused while the destination transport is over its write high-water
mark, or while more than ``HIGH_WATER`` chunks wait in the stage queues (toxics that consume
their input, ``timeout`` and ``buffer``, therefore never block the sender, like Go's).
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .proxy import Connection
    from .toxics import ToxicSpec

CHUNK = 32 * 1024  # Go's copy buffer: toxics see chunks of at most this size
HIGH_WATER = 256  # queued chunks before the source is paused
LOW_WATER = 64


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:  # pragma: no cover
        return self.name


EOF = _Sentinel("EOF")  # end of the source: travels down the chain, closes the connection at the sink
INTERRUPT = _Sentinel("INTERRUPT")  # returned by Stage.recv when the stage must restart
TIMEOUT = _Sentinel("TIMEOUT")  # returned by Stage.recv(timeout) when nothing arrived in time
DONE = _Sentinel("DONE")  # returned by a pipe once it has passed EOF on


class Chunk:
    __slots__ = ("data", "ts")

    def __init__(self, data: bytes, ts: float) -> None:
        self.data = data
        self.ts = ts


class Stage:
    """The per-connection instance ("stub") of one toxic on one link."""

    def __init__(self, link: Link, spec: ToxicSpec, rng: random.Random) -> None:
        self.link = link
        self.spec = spec
        self.rng = rng
        self.loop = link.loop
        self.q: deque[Any] = deque()
        self.state: dict[str, Any] = {}  # per-connection toxic state (limit_data's count)
        self.interrupted = False
        self.removing = False
        self.finished = False
        self._recv_fut: asyncio.Future[None] | None = None
        self._sleep_fut: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = self.loop.create_task(self._run())

    # -- plumbing used by the toxics -------------------------------------------------------
    def push(self, item: Any) -> None:
        self.q.append(item)
        self.link.queued += 1
        fut = self._recv_fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _pop(self) -> Any:
        item = self.q.popleft()
        link = self.link
        link.queued -= 1
        if link.queue_paused and link.queued <= LOW_WATER:
            link.queue_paused = False
            link.update_reading()
        return item

    def unrecv(self, item: Any) -> None:
        self.q.appendleft(item)
        self.link.queued += 1

    async def recv(self, timeout: float | None = None) -> Any:
        """Next item, or INTERRUPT, or TIMEOUT (only when ``timeout`` seconds pass first)."""
        if self.interrupted:
            return INTERRUPT
        if self.q:
            return self._pop()
        if timeout is not None and timeout <= 0:
            return TIMEOUT
        fut = self.loop.create_future()
        self._recv_fut = fut
        handle = None
        if timeout is not None:
            handle = self.loop.call_later(timeout, _resolve, fut)
        try:
            await fut
        finally:
            self._recv_fut = None
            if handle is not None:
                handle.cancel()
        if self.interrupted:
            return INTERRUPT
        if self.q:
            return self._pop()
        return TIMEOUT

    async def sleep(self, seconds: float) -> bool:
        """Sleep; False when interrupted first (or already interrupted)."""
        if self.interrupted:
            return False
        if seconds <= 0:
            return True
        fut = self.loop.create_future()
        self._sleep_fut = fut
        handle = self.loop.call_later(seconds, _resolve, fut)
        try:
            await fut
        finally:
            self._sleep_fut = None
            handle.cancel()
        return not self.interrupted

    def emit(self, item: Any) -> None:
        self.link.forward_from(self, item)

    def interrupt(self) -> None:
        self.interrupted = True
        for fut in (self._recv_fut, self._sleep_fut):
            if fut is not None and not fut.done():
                fut.set_result(None)

    # -- the stage's life ----------------------------------------------------------------
    async def _run(self) -> None:
        try:
            while True:
                self.interrupted = False
                if self.removing:
                    self._drain_and_unlink()
                    return
                tox = self.spec.toxicity
                active = tox >= 1 or (tox > 0 and self.rng.random() < tox)
                if active:
                    res = await self.spec.impl.pipe(self)
                else:
                    res = await _passthrough(self)
                if res is DONE:
                    self.finished = True
                    if self.removing:
                        self._drain_and_unlink()
                    return
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a toxic bug must not take the server down: close this connection
            self.link.conn.close()

    def _drain_and_unlink(self) -> None:
        self.spec.impl.cleanup(self)
        while self.q:
            self.emit(self._pop())
        self.link.unlink(self)

    def remove(self) -> None:
        self.removing = True
        if self.task is None or self.task.done():
            self.spec.impl.cleanup(self)
            self.link.unlink(self)
        else:
            self.interrupt()

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _passthrough(st: Stage) -> Any:
    while True:
        item = await st.recv()
        if item is INTERRUPT:
            return None
        st.emit(item)
        if item is EOF:
            return DONE


class Link:
    """Bytes from ``src`` to ``dst`` through this direction's toxic stages."""

    def __init__(self, conn: Connection, direction: str, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.direction = direction
        self.loop = loop
        self.src: asyncio.Transport | None = None
        self.dst: asyncio.Transport | None = None
        self.stages: list[Stage] = []
        self.queued = 0
        self.queue_paused = False
        self.dst_paused = False
        self.src_reading = True
        self.eof = False

    # -- source side -------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if not self.stages:
            self.dst.write(data)  # type: ignore[union-attr]  # set before reading starts (Conn.side_made)
            return
        ts = self.loop.time()
        first = self.stages[0]
        if len(data) <= CHUNK:
            first.push(Chunk(data, ts))
        else:
            mv = memoryview(data)
            for i in range(0, len(data), CHUNK):
                first.push(Chunk(bytes(mv[i : i + CHUNK]), ts))
        if self.queued > HIGH_WATER and not self.queue_paused:
            self.queue_paused = True
            self.update_reading()

    def feed_eof(self) -> None:
        if self.eof:
            return
        self.eof = True
        if not self.stages:
            self.conn.close()
        else:
            self.stages[0].push(EOF)

    def update_reading(self) -> None:
        src = self.src
        if src is None or src.is_closing():
            return
        want = not (self.queue_paused or self.dst_paused)
        if want != self.src_reading:
            self.src_reading = want
            if want:
                src.resume_reading()
            else:
                src.pause_reading()

    # -- chain ---------------------------------------------------------------------------------
    def forward_from(self, stage: Stage, item: Any) -> None:
        stages = self.stages
        try:
            i = stages.index(stage)
        except ValueError:  # already unlinked: deliver to the sink
            i = len(stages) - 1
        if i + 1 < len(stages):
            stages[i + 1].push(item)
        else:
            self.sink(item)

    def sink(self, item: Any) -> None:
        if item is EOF:
            self.conn.close()
        elif self.dst is not None and not self.dst.is_closing():
            self.dst.write(item.data)

    def add(self, spec: ToxicSpec, rng: random.Random) -> Stage:
        st = Stage(self, spec, rng)
        if self.stages:
            prev = self.stages[-1]
            self.stages.append(st)
            prev.interrupt()
        else:
            self.stages.append(st)
        st.start()
        return st

    def unlink(self, stage: Stage) -> None:
        try:
            self.stages.remove(stage)
        except ValueError:
            pass

    def find(self, spec: ToxicSpec) -> Stage | None:
        for st in self.stages:
            if st.spec is spec and not st.removing:
                return st
        return None

    def close(self) -> None:
        for st in self.stages:
            st.cancel()
        self.stages.clear()
