"""The response as the hop writes it to its client: written at once while nothing waits, queued behind a
pause (a hold, a silence, the millisecond between the writes of a split event) and written in order by
one drain task until the queue is empty again.

Every event written is stamped on the tap's ``down`` side when its last byte leaves the hop (for a gzip
rewrite: when the compressed bytes holding it are flushed). Memory per request is bounded twice: the
queue holds at most ``QUEUE_LIMIT`` bytes (past it ``settle`` stops the upstream side until the queue
drains), and the socket's send buffer at most ``WRITE_HIGH`` (past it ``settle`` waits for the client).
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections import deque
from typing import Any

import h11

from .rules import Acting
from .sse import KEEPALIVE_EVENT, digest
from .taps import Tap, headers_kept
from .upstream import linger_reset

__all__ = ["QUEUE_LIMIT", "WRITE_HIGH", "Down", "GzipOut"]

QUEUE_LIMIT = 1 << 20  # bytes queued behind a pause before the upstream side waits
WRITE_HIGH = 256 * 1024  # bytes in the socket's send buffer before the hop waits for its client
_KEEPALIVE_DIGEST = digest(KEEPALIVE_EVENT.strip(b"\n"))


class GzipOut:
    """``Content-Encoding: gzip`` as a buffering gateway does it: nothing leaves until ``buffer_bytes``
    of the body have gone in (then a sync flush), and the rest at the end."""

    def __init__(self, buffer_bytes: int) -> None:
        self._z = zlib.compressobj(6, zlib.DEFLATED, 31)
        self._out = bytearray()  # compressed, waiting for the next flush
        self.buffer_bytes = buffer_bytes
        self.held = 0  # body bytes in since the last flush
        self.bytes_in = self.bytes_out = 0

    def add(self, data: bytes) -> bytes:
        """What to write now: b"" until ``buffer_bytes`` have gone in since the last flush."""
        self.bytes_in += len(data)
        self._out += self._z.compress(data)
        self.held += len(data)
        if self.held < self.buffer_bytes:
            return b""
        self._out += self._z.flush(zlib.Z_SYNC_FLUSH)
        self.held = 0
        return self._take()

    def finish(self) -> bytes:
        self._out += self._z.flush(zlib.Z_FINISH)
        return self._take()

    def _take(self) -> bytes:
        out = bytes(self._out)
        self._out.clear()
        self.bytes_out += len(out)
        return out


class _Pause:
    __slots__ = ("until", "seconds", "keepalive_s", "acting")

    def __init__(self, until: float | None, seconds: float, keepalive_s: float | None, acting: Acting | None) -> None:
        self.until, self.seconds, self.keepalive_s, self.acting = until, seconds, keepalive_s, acting


class Down:
    """One response downstream (see the module's docstring). ``sse``: keep-alive comments may be written."""

    def __init__(self, writer: asyncio.StreamWriter, conn: h11.Connection, tap: Tap) -> None:
        self.writer, self.transport, self.conn, self.tap = writer, writer.transport, conn, tap
        # how the body is framed, as h11 chose when it wrote the head: "chunked" (framed here, cheaper
        # than h11 per event), "raw" (an HTTP/1.0 client: to the connection's end), "h11" (a Content-Length
        # h11 counts down)
        self.framing = "h11"
        self.sse = False
        self.queue: deque[Any] = deque()
        self.queued = 0
        self.drainer: asyncio.Task[None] | None = None
        self.head_sent = False
        self.closed = False
        self.last_kind = ""
        self.gzip: GzipOut | None = None
        self._gzip_pending: list[tuple[str, str]] = []
        self._room = asyncio.Event()
        self._room.set()

    # -- what the upstream side calls ---------------------------------------------------------
    def head(self, response: h11.Response) -> None:
        self._push(("head", response))

    def write(self, data: bytes, kind: str = "", dg: str = "") -> None:
        """Body bytes; with ``kind`` they complete one event, stamped on the tap's down side."""
        if self.drainer is None and not self.queue:
            if self.framing == "chunked" and self.gzip is None and not self.closed and self.head_sent:
                # the hot path, inlined: one event, framed and written, stamped
                self.tap.bytes_down += len(data)
                if not self.transport.is_closing():
                    self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
                if kind:
                    self.last_kind = kind
                    self.tap.event_down(time.monotonic_ns(), kind, dg)
                return
            self._write(data, kind, dg)
        else:
            self.queued += len(data)
            self._push(("data", data, kind, dg))

    def pause(self, seconds: float, keepalive_s: float | None = None, acting: Acting | None = None,
              until: float | None = None) -> None:
        """Nothing more for ``seconds`` from when the queue reaches it (or until the monotonic time ``until``),
        with a keep-alive comment every ``keepalive_s`` when set and the body is an event stream."""
        self._push(_Pause(until, seconds, keepalive_s, acting))

    def tag(self, kind: str, dg: str) -> None:
        """Stamp one event on the tap's down side once what was written before it has left."""
        self._push(("tag", kind, dg))

    def end(self, how: str, partial: bytes = b"", label: str | None = None) -> None:
        """End the response once everything before has been written (``finish``)."""
        self._push(("end", how, partial, label))

    async def settle(self) -> None:
        """Wait while too much waits: the queue past ``QUEUE_LIMIT``, the socket buffer past ``WRITE_HIGH``."""
        if self.queued > QUEUE_LIMIT:
            self._room.clear()
            await self._room.wait()
        await self._drain_socket()

    async def _drain_socket(self) -> None:
        if not self.closed and self.transport.get_write_buffer_size() > WRITE_HIGH:
            try:
                await self.writer.drain()
            except ConnectionError:  # the client went: its watcher says so and ends the exchange
                pass

    async def done(self) -> None:
        """Everything pushed has been written (or the response was abandoned)."""
        if self.drainer is not None:
            await self.drainer

    def abandon(self) -> None:
        """Stop writing: a deadline or a gone client ends the response some other way."""
        if self.drainer is not None:
            self.drainer.cancel()
            self.drainer = None
        self.queue.clear()
        self.queued = 0
        self._room.set()

    # -- writing ----------------------------------------------------------------------------------
    def _push(self, item: Any) -> None:
        if self.drainer is None and not self.queue and not isinstance(item, _Pause):
            self._perform(item)
            return
        self.queue.append(item)
        if self.drainer is None:
            self.drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self.queue:
                item = self.queue.popleft()
                if isinstance(item, _Pause):
                    await self._wait(item)
                    continue
                if item[0] == "data":
                    self.queued -= len(item[1])
                    if self.queued <= QUEUE_LIMIT:
                        self._room.set()
                self._perform(item)
                await self._drain_socket()
        finally:
            self.drainer = None

    async def _wait(self, pause: _Pause) -> None:
        now = time.monotonic()
        until = pause.until if pause.until is not None else now + pause.seconds
        every = pause.keepalive_s if self.sse and self.head_sent else None
        beat = now + every if every is not None else until  # on a fixed grid: a late wake-up does not drift
        while now < until:
            await asyncio.sleep(min(beat, until) - now)
            now = time.monotonic()
            if every is not None and beat <= now < until:
                self._write(KEEPALIVE_EVENT, "comment", _KEEPALIVE_DIGEST)
                if pause.acting is not None:
                    pause.acting.act("keepalives")
                while beat <= now:
                    beat += every

    def _perform(self, item: Any) -> None:
        what = item[0]
        if what == "data":
            self._write(item[1], item[2], item[3])
        elif what == "head":
            self.send_head(item[1])
        elif what == "tag":
            self.last_kind = item[1]
            self.tap.event_down(time.monotonic_ns(), item[1], item[2])
        else:
            self.finish(item[1], item[2], item[3])

    def send_head(self, response: h11.Response) -> None:
        if self.head_sent or self.closed:
            return
        self.head_sent = True
        self.tap.status_down = response.status_code
        head = self.conn.send(response) or b""
        # as written: h11 adds the framing (transfer-encoding, connection) to what it was given
        lines = head.split(b"\r\n")[1:]
        self.tap.headers_down = kept = headers_kept([tuple(line.split(b":", 1)) for line in lines if b":" in line])
        if "content-length" in kept:
            self.framing = "h11"
        elif kept.get("transfer-encoding", "").lower().endswith("chunked"):
            self.framing = "chunked"
        else:
            self.framing = "raw"
        self._raw(head)

    def _write(self, data: bytes, kind: str, dg: str) -> None:
        if self.closed:
            return
        if not self.head_sent:
            raise RuntimeError("body before head")  # a relay bug, never a peer's doing
        if self.gzip is not None:
            self._write_gzip(data, kind, dg)
            return
        self.tap.bytes_down += len(data)
        self._raw(self._frame(data))
        if kind:
            self.last_kind = kind
            self.tap.event_down(time.monotonic_ns(), kind, dg)

    def _write_gzip(self, data: bytes, kind: str, dg: str) -> None:
        assert self.gzip is not None
        if kind:
            self.last_kind = kind
            self._gzip_pending.append((kind, dg))
        out = self.gzip.add(data)
        if out:
            self._flush_gzip(out)

    def _frame(self, data: bytes) -> bytes | None:
        if self.framing == "chunked":
            return b"%x\r\n%b\r\n" % (len(data), data)
        if self.framing == "raw":
            return data
        return self.conn.send(h11.Data(data=data))

    def _flush_gzip(self, out: bytes) -> None:
        if not out:
            return
        self.tap.bytes_down += len(out)
        self._raw(self._frame(out))
        now = time.monotonic_ns()
        for kind, dg in self._gzip_pending:
            self.tap.event_down(now, kind, dg)
        self._gzip_pending.clear()

    def _raw(self, data: bytes | None) -> None:
        if data and not self.transport.is_closing():
            self.transport.write(data)

    # -- ends ---------------------------------------------------------------------------------------
    def finish(self, how: str, partial: bytes = b"", label: str | None = None) -> None:
        """End the response: ``clean`` (the body ends properly), ``bare_eof`` (the connection closes
        mid-body, after ``partial`` cut short: a chunk announced whole that never completes), ``reset``
        (a TCP reset). ``label`` is the tap's ``down_end`` when the way it ended is not enough to say it."""
        if self.closed:
            return
        self.tap.t_end = time.monotonic_ns()
        if how == "reset":
            self.tap.down_end = label or "reset"
            self.close(reset=True)
            return
        if not self.head_sent:
            raise RuntimeError("end before head")  # a relay bug, never a peer's doing
        if how == "bare_eof":
            self.tap.down_end = label or "bare_eof"
            if partial and self.gzip is None:
                cut = partial[: max(1, len(partial) // 2)]
                self._raw(b"%x\r\n" % len(partial) + cut if self.framing == "chunked" else cut)
            self.close()
            return
        if self.gzip is not None:
            self._flush_gzip(self.gzip.finish())
        self.tap.down_end = label or ("done" if self.last_kind == "done" else "eof")
        self._raw(self.conn.send(h11.EndOfMessage()))

    def close(self, reset: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if reset:
            linger_reset(self.transport)
        else:
            self.transport.close()

    @property
    def complete(self) -> bool:
        return self.conn.our_state in (h11.DONE, h11.MUST_CLOSE)

