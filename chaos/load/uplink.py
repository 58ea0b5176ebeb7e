"""Records from a load process to the runner: batched, framed, and never a blocking write in the
load's event loop.

A load worker stamps every byte on entry to ``data_received``; a blocking pipe write there (the
runner busy writing its journal, the pipe's 64 KiB full) would hold the next stamp for as long as
the runner takes. So the worker writes through an asyncio pipe transport: a write only appends to
the transport's buffer, the loop flushes it as the pipe drains. Records are coalesced per loop
turn into one frame; replies and activity flush the pending records first, so the runner sees
every message in the order the worker produced it.

Frames are ``4-byte big-endian length`` + a pickle; the reader (``FrameReader``) is an asyncio
protocol on the runner's loop. The buffer is bounded by ``HIGH_WATER_BYTES`` in normal running:
above it the worker keeps buffering (a stall would distort every stamp) and counts the time it
spent above, which the run reports (``uplink_over_high_water_s``): a runner that cannot keep up is
flagged, never silently stalling the load.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
import time
from collections.abc import Callable
from typing import Any

__all__ = ["HIGH_WATER_BYTES", "FrameReader", "Uplink"]

HIGH_WATER_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct("!I")


class _WriteSide(asyncio.Protocol):
    """Flow control of the worker's pipe transport: when it went above and came back below the high water."""

    def __init__(self) -> None:
        self.paused_at: float | None = None
        self.paused_s = 0.0
        self.lost = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self.paused_at = time.monotonic()

    def resume_writing(self) -> None:
        if self.paused_at is not None:
            self.paused_s += time.monotonic() - self.paused_at
            self.paused_at = None

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

    @classmethod
    async def open(cls, fileno: int) -> Uplink:
        """An uplink on the write end ``fileno`` of a pipe (the transport owns a duplicate of it)."""
        import os

        pipe = os.fdopen(os.dup(fileno), "wb", buffering=0)
        transport, side = await asyncio.get_running_loop().connect_write_pipe(_WriteSide, pipe)
        transport.set_write_buffer_limits(high=HIGH_WATER_BYTES)
        return cls(transport, side)  # type: ignore[arg-type]

    def record(self, record: Any) -> None:
        if not self.pending:
            self.loop.call_soon(self.flush)  # one frame per loop turn, whatever the turn produced
        self.pending.append(record)

    def send(self, message: tuple[Any, ...]) -> None:
        """A reply or a report: after the records produced before it."""
        self.flush()
        self._write(message)

    def flush(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            self._write(("records", batch))

    def _write(self, message: tuple[Any, ...]) -> None:
        if self.transport.is_closing():
            return
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        self.transport.write(_HEADER.pack(len(data)) + data)
        self.frames += 1

    def stats(self) -> dict[str, Any]:
        over = self.side.paused_s + (time.monotonic() - self.side.paused_at if self.side.paused_at is not None else 0.0)
        return {"uplink_buffered_bytes": self.transport.get_write_buffer_size(),
                "uplink_over_high_water_s": round(over, 3)}

    async def aclose(self, timeout: float = 10.0) -> None:
        """Flush what is buffered (up to ``timeout``), then close."""
        self.flush()
        deadline = time.monotonic() + timeout
        while self.transport.get_write_buffer_size() and time.monotonic() < deadline and not self.side.lost.done():
            await asyncio.sleep(0.01)
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
