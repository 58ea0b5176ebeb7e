"""Records from a load process to the runner: batched, framed, and never a blocking write in the
load's event loop.

A load worker stamps every byte on entry to ``data_received``; a blocking pipe write there (the
runner busy writing its journal, the pipe's 64 KiB full) would hold the next stamp for as long as
the runner takes. So the worker writes through an asyncio pipe transport: a write only appends to
the transport's buffer, the loop flushes it as the pipe drains. Records are held until the next
tick of ``FLUSH_EVERY_S`` on the run's shared grid (``chaos.host.cadence``) and sent then, in frames
of at most ``FRAME_RECORDS`` (one per loop turn), so the runner wakes for them when it wakes for its
own periodic work (its halt check, its host sample, this worker's activity report), not once per
loop turn of the load. Each wake-up of the idle runner starts cold and each pipe write wakes it:
at 256 streams the runner used 7% of the load process's CPU with a frame per loop turn and 5% with
one per tick, while the load process itself went from 1.9–2.2 s of CPU per 8 s to 1.3–1.5 s.
Replies and activity send the pending records first, so the runner sees every message in the order
the worker produced it. A record reaches the journal at most ``FLUSH_EVERY_S`` after its stream
ended.

Frames are ``4-byte big-endian length`` + a pickle; the reader (``FrameReader``) is an asyncio
protocol on the runner's loop. The buffer is bounded by ``HIGH_WATER_BYTES`` in normal running:
above it the worker keeps buffering (a stall would distort every stamp) and counts the time it
spent above, which the run reports (``uplink_over_high_water_s``): a runner that cannot keep up is
flagged, never silently stalling the load. Memory stays bounded even then: past ``SPILL_AT_BYTES``
every frame goes to an unlinked temporary file instead (an append to the page cache, not a wait on
the runner), in order, and is fed back into the pipe as it drains; the run reports the bytes that
took that way (``uplink_spilled_bytes``). The file lies in ``TMPDIR``: where that is a tmpfs (or a
pod's in-memory emptyDir) the spill is memory again, so point ``TMPDIR`` at a disk for runs whose
runner may fall hundreds of megabytes behind.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from chaos.host.cadence import seconds_to_next_tick

__all__ = ["FLUSH_EVERY_S", "FRAME_RECORDS", "HIGH_WATER_BYTES", "SPILL_AT_BYTES", "FrameReader", "Uplink"]

FLUSH_EVERY_S = 0.5  # a record waits at most this long for its frame (see above)
# The most records pickled in one loop turn: a tick's records at 2,048 streams (800) are cut into
# frames of this many, one per turn, so no pickle holds the load's loop long (64: about 0.3 ms)
FRAME_RECORDS = 64
HIGH_WATER_BYTES = 64 * 1024 * 1024
SPILL_AT_BYTES = 256 * 1024 * 1024  # the most frames held in memory; past it they go to a file
SPILL_CHUNK_BYTES = 4 * 1024 * 1024  # fed back from the file into the pipe at a time
_HEADER = struct.Struct("!I")


class _WriteSide(asyncio.Protocol):
    """Flow control of the worker's pipe transport: when it went above and came back below the high water."""

    def __init__(self) -> None:
        self.paused_at: float | None = None
        self.paused_s = 0.0
        self.lost = asyncio.get_running_loop().create_future()
        self.on_resume: Callable[[], None] = lambda: None

    def pause_writing(self) -> None:
        self.paused_at = time.monotonic()

    def resume_writing(self) -> None:
        if self.paused_at is not None:
            self.paused_s += time.monotonic() - self.paused_at
            self.paused_at = None
        self.on_resume()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


class Uplink:
    """The worker's writer to the runner. ``record`` is what the generator's sink calls."""

    def __init__(self, transport: asyncio.WriteTransport, side: _WriteSide) -> None:
        self.transport, self.side = transport, side
        self.loop = asyncio.get_running_loop()
        self.pending: list[Any] = []
        self.frames = 0
        self.spill: IO[bytes] | None = None  # frames past SPILL_AT_BYTES, in order, not yet in the pipe
        self.spill_read_at = 0
        self.spilled_bytes = 0
        side.on_resume = self._refill

    @classmethod
    async def open(cls, fileno: int) -> Uplink:
        """An uplink on the write end ``fileno`` of a pipe (the transport owns a duplicate of it)."""
        import os

        pipe = os.fdopen(os.dup(fileno), "wb", buffering=0)
        transport, side = await asyncio.get_running_loop().connect_write_pipe(_WriteSide, pipe)
        transport.set_write_buffer_limits(high=HIGH_WATER_BYTES)
        return cls(transport, side)

    def record(self, record: Any) -> None:
        if not self.pending:  # one frame per tick, whatever the load produced meanwhile
            self.loop.call_later(seconds_to_next_tick(FLUSH_EVERY_S), self.flush)
        self.pending.append(record)

    def send(self, message: tuple[Any, ...]) -> None:
        """A reply or a report: after the records produced before it."""
        self.flush_all()
        self._write(message)

    def flush_all(self) -> None:
        """Every pending record, now."""
        while self.pending:
            self._write_slice()

    def flush(self) -> None:
        """The pending records, ``FRAME_RECORDS`` per loop turn."""
        if self.pending:
            self._write_slice()
        if self.pending:
            self.loop.call_soon(self.flush)

    def _write_slice(self) -> None:
        batch, self.pending = self.pending[:FRAME_RECORDS], self.pending[FRAME_RECORDS:]
        self._write(("records", batch))

    def _write(self, message: tuple[Any, ...]) -> None:
        if self.transport.is_closing():
            return
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        frame = _HEADER.pack(len(data)) + data
        if self.spill is None and self.transport.get_write_buffer_size() + len(frame) > SPILL_AT_BYTES:
            self.spill = tempfile.TemporaryFile()  # unlinked already: a killed worker leaves nothing behind
            self.spill_read_at = 0
        if self.spill is not None:  # once spilling, every frame queues behind the spilled ones: order holds
            self.spill.seek(0, 2)
            self.spill.write(frame)
            self.spilled_bytes += len(frame)
            if self.side.paused_at is None:  # the pipe is not full (one huge frame started the spill): no
                self._refill()               # resume_writing will come to feed it, so feed it now
        else:
            self.transport.write(frame)
        self.frames += 1

    def _refill(self) -> None:
        """The pipe drained below its low-water mark: feed it from the spill file past the high water."""
        spill = self.spill
        # until the transport pauses us (above its high water, strictly): a resume is then bound to come
        # and feed the rest; stopping at the mark itself would leave it neither paused nor fed
        while spill is not None and not self.transport.is_closing() and self.side.paused_at is None:
            spill.seek(self.spill_read_at)
            chunk = spill.read(SPILL_CHUNK_BYTES)
            if not chunk:  # all of it is in the pipe's buffer now: frames go straight there again
                spill.close()
                self.spill = spill = None
                break
            self.spill_read_at += len(chunk)
            self.transport.write(chunk)

    def stats(self) -> dict[str, Any]:
        over = self.side.paused_s + (time.monotonic() - self.side.paused_at if self.side.paused_at is not None else 0.0)
        return {"uplink_buffered_bytes": self.transport.get_write_buffer_size(),
                "uplink_over_high_water_s": round(over, 3), "uplink_spilled_bytes": self.spilled_bytes}

    async def aclose(self, timeout: float = 10.0) -> None:
        """Flush what is buffered and spilled (up to ``timeout``), then close."""
        self.flush_all()
        deadline = time.monotonic() + timeout
        while (self.transport.get_write_buffer_size() or self.spill is not None) and time.monotonic() < deadline \
                and not self.side.lost.done():
            if self.spill is not None and self.side.paused_at is None:
                self._refill()
            await asyncio.sleep(0.01)
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        self.transport.close()


class FrameReader(asyncio.Protocol):
    """The runner's side of one uplink: each frame unpickled and handed to ``deliver``; ``lost``
    when the worker's end closes (it exited)."""

    def __init__(self, deliver: Callable[[tuple[Any, ...]], None], lost: Callable[[], None]) -> None:
        self.deliver, self.on_lost = deliver, lost
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        view, at = self.buffer, 0
        while len(view) - at >= _HEADER.size:
            (size,) = _HEADER.unpack_from(view, at)
            end = at + _HEADER.size + size
            if len(view) < end:
                break
            message = pickle.loads(bytes(view[at + _HEADER.size:end]))  # noqa: S301 - our own child process
            at = end
            self.deliver(message)
        if at:
            del self.buffer[:at]

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost()
