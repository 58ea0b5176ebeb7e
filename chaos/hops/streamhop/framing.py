"""The upstream response body's framing, undone on the hot path: chunked transfer coding, a
Content-Length, or the connection's end (RFC 9112 6.3).

h11 parses the response head; the body is de-framed here because h11 costs about 7 µs per chunk on
the hop's hot path (``benchmarks/bench_http_parser.py``) and this reader, with ``bytes.find`` and
slices, under 2. It is strict where a proxy must be: a chunk size line longer than ``LINE_LIMIT``,
a size that is not hex, a chunk not followed by CRLF, or trailers past ``TRAILER_LIMIT`` raise
``FramingError`` (the relay then ends the response as a broken upstream body).
"""

from __future__ import annotations

__all__ = ["LINE_LIMIT", "TRAILER_LIMIT", "BodyReader", "FramingError"]

LINE_LIMIT = 4096  # bytes of a chunk size line (with extensions)
TRAILER_LIMIT = 16 * 1024  # bytes of trailers after the last chunk
_MAX_CHUNK = 1 << 62
_HEX = frozenset(b"0123456789abcdefABCDEF")


class FramingError(ValueError):
    """The upstream's body framing is broken: the body cannot be relayed further."""


class BodyReader:
    """Body bytes out of the reads of a response: ``feed(data)`` → the body bytes in it; ``done`` once the
    framing says the body ended (for a body that runs to the connection's end: when ``eof()`` is called)."""

    __slots__ = ("mode", "done", "_buf", "_left", "_crlf", "_trailer", "_trailer_bytes")

    def __init__(self, mode: str, length: int = 0) -> None:
        if mode not in ("chunked", "length", "close"):
            raise ValueError(f"unknown framing {mode!r}")
        self.mode = mode  # chunked | length | close
        self._left = length if mode == "length" else 0  # bytes to go in the current chunk (or the whole body)
        self.done = mode == "length" and length == 0
        self._buf = b""
        self._crlf = self._trailer = False
        self._trailer_bytes = 0

    def feed(self, data: bytes) -> bytes:
        if self.done or not data:
            return b""
        if self.mode == "close":
            return data
        if self.mode == "length":
            piece = data[: self._left]
            self._left -= len(piece)
            self.done = self._left == 0
            return piece
        return self._chunked(data)

    @property
    def pending(self) -> int:
        """Bytes read past what the framing has placed (after the body's end: bytes that belong to no body)."""
        return len(self._buf)

    def eof(self) -> bool:
        """The connection ended: True when that is the body's proper end (close-delimited), else the body
        was cut short."""
        if self.mode == "close":
            self.done = True
        return self.done

    def _chunked(self, data: bytes) -> bytes:
        if not self._buf and not self._left and not self._crlf and not self._trailer:
            whole = _one_chunk(data)  # the usual read: exactly one whole chunk (one event)
            if whole is not None:
                return whole
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while pos < n and not self.done:
            if self._left:
                take = min(self._left, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._left -= take
                self._crlf = self._left == 0
            elif self._crlf:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise FramingError("a chunk is not followed by CRLF")
                pos += 2
                self._crlf = False
            else:
                end = buf.find(b"\r\n", pos)
                if end == -1:
                    if n - pos > LINE_LIMIT:
                        raise FramingError("a chunk size line is too long")
                    break
                self._line(buf[pos:end])
                pos = end + 2
        self._buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _line(self, line: bytes) -> None:
        if self._trailer:
            self._trailer_bytes += len(line) + 2
            if self._trailer_bytes > TRAILER_LIMIT:
                raise FramingError("trailers too long")
            self.done = not line
            return
        size_text = line.split(b";", 1)[0].strip(b" \t")
        if not size_text or not _HEX.issuperset(size_text) or len(size_text) > 16:
            raise FramingError(f"a chunk size is not hex: {bytes(line[:40])!r}")
        size = int(size_text, 16)
        if size > _MAX_CHUNK:
            raise FramingError("a chunk size is too large")
        if size == 0:
            self._trailer = True
        else:
            self._left = size


def _one_chunk(data: bytes) -> bytes | None:
    """The data of ``data`` when it is exactly one whole, non-final chunk without extensions, else None."""
    end = data.find(b"\r\n", 0, 18)
    if end < 1 or not data.endswith(b"\r\n") or not _HEX.issuperset(data[:end]):
        return None
    size = int(data[:end], 16)
    start = end + 2
    if size == 0 or start + size + 2 != len(data):
        return None
    return data[start:start + size]
