"""The toxics: one class per type, with Toxiproxy 2.12.0's attributes, units and semantics.

Each class declares ``ATTRS`` (the attribute names in the order the real server emits them) and
a ``pipe(stage)`` coroutine that runs one per-connection stage until it is interrupted (returns
``None``) or has passed EOF on (returns ``DONE``). Attributes are read from ``stage.spec.attrs``,
so a PATCH takes effect when the stage restarts. ``cleanup(stage)`` runs when the toxic is
removed from a live connection. Values the real server crashes or stalls on are clamped here at
use time (the stored attribute is echoed back as sent); see the table in ``__init__``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .link import DONE, EOF, INTERRUPT, TIMEOUT, Chunk

if TYPE_CHECKING:  # pragma: no cover
    from .link import Stage


def derive_seed(*parts: object) -> int:
    """A stable 64-bit seed from the parts (independent of hash randomisation)."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8)
    return int.from_bytes(h.digest(), "big")


class Toxic:
    type = ""
    ATTRS: tuple[str, ...] = ()

    def validate(self, attrs: dict[str, int]) -> str | None:
        """An error message for values this server rejects with 400 (only non-standard toxics)."""
        return None

    async def pipe(self, st: Stage) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def cleanup(self, st: Stage) -> None:
        pass


class NoopToxic(Toxic):
    type = "noop"

    async def pipe(self, st: Stage) -> Any:
        while True:
            item = await st.recv()
            if item is INTERRUPT:
                return None
            st.emit(item)
            if item is EOF:
                return DONE


class LatencyToxic(Toxic):
    """Hold each chunk until its read time + latency + j, j uniform in [-jitter, jitter-1] ms."""

    type = "latency"
    ATTRS = ("latency", "jitter")

    async def pipe(self, st: Stage) -> Any:
        a = st.spec.attrs
        latency, jitter = a["latency"], a["jitter"]
        loop = st.loop
        while True:
            item = await st.recv()
            if item is INTERRUPT:
                return None
            if item is EOF:
                st.emit(EOF)
                return DONE
            delay = latency + (st.rng.randrange(-jitter, jitter) if jitter > 0 else 0)
            sleep = delay / 1000.0 - (loop.time() - item.ts)
            if sleep > 0:
                ok = await st.sleep(sleep)
                item.ts = loop.time()
                st.emit(item)
                if not ok:
                    return None
            else:
                st.emit(item)


class BandwidthToxic(Toxic):
    """``rate`` KB/s (1 KB = 1000 B, i.e. bytes per ms); chunks over rate*100 B go in 100 ms slices."""

    type = "bandwidth"
    ATTRS = ("rate",)

    async def pipe(self, st: Stage) -> Any:
        loop = st.loop
        debt = 0.0  # seconds
        while True:
            item = await st.recv()
            if item is INTERRUPT:
                return None
            if item is EOF:
                st.emit(EOF)
                return DONE
            rate = st.spec.attrs["rate"]
            if rate <= 0:  # clamp: real server stalls (0) or crashes (<0); here: unlimited
                debt = 0.0
                st.emit(item)
                continue
            data = item.data
            debt += len(data) / rate / 1000.0
            piece = rate * 100
            while len(data) > piece:
                if not await st.sleep(0.1):
                    st.emit(Chunk(data, item.ts))
                    return None
                st.emit(Chunk(data[:piece], item.ts))
                data = data[piece:]
                debt -= 0.1
            start = loop.time()
            ok = await st.sleep(debt)
            debt -= loop.time() - start
            st.emit(Chunk(data, item.ts))
            if not ok:
                return None


class SlowCloseToxic(Toxic):
    """Data passes; EOF is held ``delay`` ms."""

    type = "slow_close"
    ATTRS = ("delay",)

    async def pipe(self, st: Stage) -> Any:
        while True:
            item = await st.recv()
            if item is INTERRUPT:
                return None
            if item is EOF:
                if not await st.sleep(st.spec.attrs["delay"] / 1000.0):
                    st.unrecv(EOF)  # restarted (or removed) stage sees the EOF again
                    return None
                st.emit(EOF)
                return DONE
            st.emit(item)


class TimeoutToxic(Toxic):
    """Discard all data; close after ``timeout`` ms without a chunk (0: never). Removal closes."""

    type = "timeout"
    ATTRS = ("timeout",)

    async def pipe(self, st: Stage) -> Any:
        t = st.spec.attrs["timeout"]
        wait = t / 1000.0 if t > 0 else None
        while True:
            item = await st.recv(wait)
            if item is INTERRUPT:
                return None
            if item is TIMEOUT or item is EOF:
                st.emit(EOF)
                return DONE
            # data is dropped on the floor

    def cleanup(self, st: Stage) -> None:
        st.link.conn.close()


class ResetPeerToxic(Toxic):
    """On the first chunk (or EOF): drop it, wait ``timeout`` ms, close (RST when linger 0 was set)."""

    type = "reset_peer"
    ATTRS = ("timeout",)

    async def pipe(self, st: Stage) -> Any:
        item = await st.recv()
        if item is INTERRUPT:
            return None
        loop = st.loop
        deadline = loop.time() + max(0, st.spec.attrs["timeout"]) / 1000.0
        while True:  # the countdown is not interruptible (as in Go), but never blocks the API
            left = deadline - loop.time()
            if left <= 0:
                break
            st.interrupted = False
            await st.sleep(left)
        st.link.conn.reset()
        return DONE


class SlicerToxic(Toxic):
    """Split chunks by halving (split point moved by [-variation, variation)) until a piece is at
    most average_size + size_variation; ``delay`` µs after each piece."""

    type = "slicer"
    ATTRS = ("average_size", "size_variation", "delay")

    @staticmethod
    def cuts(n: int, avg: int, var: int, rng: Any) -> list[int]:
        avg = max(1, avg)  # clamp: 0 makes the real server overflow its stack
        var = max(0, var)
        out: list[int] = []
        stack = [(0, n)]
        while stack:
            s, e = stack.pop()
            if (e - s) - avg <= var:
                out.append(e)
                continue
            mid = s + (e - s) // 2
            if var > 0:
                mid += rng.randrange(2 * var) - var
            mid = min(max(mid, s + 1), e - 1)  # clamp: a large variation panics the real server
            stack.append((mid, e))
            stack.append((s, mid))
        return out

    async def pipe(self, st: Stage) -> Any:
        while True:
            item = await st.recv()
            if item is INTERRUPT:
                return None
            if item is EOF:
                st.emit(EOF)
                return DONE
            a = st.spec.attrs
            data = item.data
            delay = max(0, a["delay"]) / 1e6
            start = 0
            for end in self.cuts(len(data), a["average_size"], a["size_variation"], st.rng):
                st.emit(Chunk(data[start:end], item.ts))
                start = end
                if end < len(data):
                    if delay > 0:
                        ok = await st.sleep(delay)
                    else:
                        await _yield()
                        ok = not st.interrupted
                    if not ok:
                        st.emit(Chunk(data[start:], item.ts))
                        return None


async def _yield() -> None:
    import asyncio

    await asyncio.sleep(0)


class LimitDataToxic(Toxic):
    """Forward at most ``bytes`` bytes per connection and direction, then close."""

    type = "limit_data"
    ATTRS = ("bytes",)

    async def pipe(self, st: Stage) -> Any:
        sent = st.state.setdefault("sent", 0)
        while True:
            item = await st.recv()
            if item is INTERRUPT:
                return None
            if item is EOF:
                st.emit(EOF)
                return DONE
            remaining = max(0, st.spec.attrs["bytes"] - sent)
            data = item.data
            if remaining < len(data):
                data = data[:remaining]
            if data:
                st.emit(Chunk(data, item.ts))
                sent += len(data)
                st.state["sent"] = sent
                remaining -= len(data)
            if remaining <= 0:
                st.emit(EOF)
                return DONE


# The last chunk of an HTTP/1.1 chunked body (no trailers): where one response ends on a
# keep-alive connection. Streaming responses (SSE) are always chunked when they have no length.
_CHUNKED_END = b"\r\n0\r\n\r\n"


BUFFER_HARD_CAP_BYTES = 64 << 20  # what one buffer toxic may hold, whatever max_bytes says (read at each chunk)


class BufferToxic(Toxic):
    """Non-standard: hold bytes until the source closes, or a chunked HTTP response ends, or
    ``max_bytes`` are held, or ``max_time`` ms have passed since the first held byte (0 = no such
    limit); then flush as one write. Models a reverse proxy with response buffering on (nginx
    ``proxy_buffering``), which holds each *response*, not the whole keep-alive connection.

    ``max_bytes`` 0 or above ``BUFFER_HARD_CAP_BYTES`` (64 MiB) means the cap: a response or a
    stream that never ends is flushed every 64 MiB rather than held in memory without bound, as
    nginx spills to ``proxy_max_temp_file_size`` instead of growing."""

    type = "buffer"
    ATTRS = ("max_bytes", "max_time")

    def validate(self, attrs: dict[str, int]) -> str | None:
        for k in self.ATTRS:
            if attrs.get(k, 0) < 0:
                return f"invalid attribute {k}: must be >= 0 (0 = unlimited)"
        return None

    async def pipe(self, st: Stage) -> Any:
        loop = st.loop
        held: list[bytes] = []
        size = 0
        first = 0.0
        ts = 0.0

        def flush() -> None:
            nonlocal held, size
            if held:
                st.emit(Chunk(b"".join(held), ts))
                held, size = [], 0

        while True:
            a = st.spec.attrs
            wait = None
            if held and a["max_time"] > 0:
                wait = first + a["max_time"] / 1000.0 - loop.time()
            item = await st.recv(wait)
            if item is INTERRUPT:
                flush()
                return None
            if item is TIMEOUT:
                flush()
                continue
            if item is EOF:
                flush()
                st.emit(EOF)
                return DONE
            if not held:
                first = loop.time()
                ts = item.ts
            held.append(item.data)
            size += len(item.data)
            tail = b"".join(held[-len(_CHUNKED_END):])[-len(_CHUNKED_END):]  # pieces may be tiny
            limit = min(a["max_bytes"] or BUFFER_HARD_CAP_BYTES, BUFFER_HARD_CAP_BYTES)
            if tail == _CHUNKED_END or size >= limit:
                flush()


TOXICS: dict[str, Toxic] = {
    t.type: t
    for t in (
        NoopToxic(),
        LatencyToxic(),
        BandwidthToxic(),
        SlowCloseToxic(),
        TimeoutToxic(),
        ResetPeerToxic(),
        SlicerToxic(),
        LimitDataToxic(),
        BufferToxic(),
    )
}
STANDARD_TYPES = frozenset(TOXICS) - {"buffer"}


@dataclass(eq=False)
class ToxicSpec:
    """A toxic as the API knows it (shared by every live connection's stage of it)."""

    name: str
    type: str
    stream: str  # as the client sent it
    direction: str  # "upstream" | "downstream"
    toxicity: float
    attrs: dict[str, int] = field(default_factory=dict)

    @property
    def impl(self) -> Toxic:
        return TOXICS[self.type]
