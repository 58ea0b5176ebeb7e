"""Incremental decoding of a compressed response body (``Content-Encoding: gzip`` / ``deflate``).

One ``zlib.decompressobj`` per response, fed each network read as it comes: the bytes a read
completes are handed on at once, so an event decoded from a read carries that read's stamp (a
compressor that holds the stream back shows up as few, late, fat reads, as it would for the
OpenAI SDK's httpx). ``deflate`` is the zlib format by the RFC, but servers also send raw DEFLATE:
as httpx does, the first read decides (zlib header or not). Output comes in pieces of at most
``PIECE_BYTES``, so a small read that inflates to gigabytes (a compression bomb) meets the SSE
parser's bound before it meets the client's memory. ``br`` and ``zstd`` are not decoded
(no well-kept decoder in the standard library), so the load client never announces them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

__all__ = ["PIECE_BYTES", "BodyDecoder", "DecodeError", "decoder_for"]

PIECE_BYTES = 64 * 1024  # the most one decoded piece holds


class DecodeError(ValueError):
    """The body does not decode as its Content-Encoding says (or the coding is not one we asked for)."""


class BodyDecoder:
    """Feed compressed reads with ``decode``; ``flush`` at the end of the body."""

    __slots__ = ("coding", "_obj", "_raw_fallback", "_started")

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._raw_fallback = coding == "deflate"
        self._started = False
        self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS if coding == "gzip" else zlib.MAX_WBITS)

    def decode(self, data: bytes) -> Iterator[bytes]:
        """The bytes one read decodes to, in pieces of at most ``PIECE_BYTES`` (usually one)."""
        try:
            if not self._started and self._raw_fallback:
                self._started = True
                try:
                    first = self._obj.decompress(data, PIECE_BYTES)
                except zlib.error:
                    self._obj = zlib.decompressobj(-zlib.MAX_WBITS)  # raw DEFLATE, no zlib header
                    first = self._obj.decompress(data, PIECE_BYTES)
            else:
                self._started = True
                first = self._obj.decompress(data, PIECE_BYTES)
            if first:
                yield first
            while self._obj.unconsumed_tail:
                piece = self._obj.decompress(self._obj.unconsumed_tail, PIECE_BYTES)
                if piece:
                    yield piece
        except zlib.error as exc:
            raise DecodeError(f"the {self.coding} body does not decode: {exc}") from None

    def flush(self) -> bytes:
        """The last bytes, once the body ended (empty when the compressed stream was complete)."""
        try:
            return self._obj.flush()
        except zlib.error as exc:
            raise DecodeError(f"the {self.coding} body does not decode: {exc}") from None


def decoder_for(content_encoding: str | None) -> BodyDecoder | None:
    """A decoder for a response's Content-Encoding; None for none or ``identity``; DecodeError for
    a coding this client cannot decode (and so never announced)."""
    if not content_encoding:
        return None
    coding = content_encoding.strip().lower()
    if coding in ("", "identity"):
        return None
    if coding in ("gzip", "x-gzip"):
        return BodyDecoder("gzip")
    if coding == "deflate":
        return BodyDecoder("deflate")
    raise DecodeError(f"the response is encoded as {content_encoding!r}, which the load client cannot decode "
                      "and did not announce in Accept-Encoding")
