"""Incremental Server-Sent Events parser: bytes in any split → the same events, with UTF-8 accounting.

Framing follows the WHATWG SSE rules with the tolerance LLM servers need: CRLF, LF or CR line ends,
``data:`` with or without one space, ``:`` comment lines, multi-line data joined with ``\\n``,
``event:``/``id:`` fields. Lines are split on *bytes* (CR and LF never occur inside a multibyte
UTF-8 sequence), so a character split across reads is always reassembled before it is decoded and
is never mistaken for an error; invalid bytes are counted exactly (one count per byte of each
maximal invalid subpart, the same spans ``errors='replace'`` turns into U+FFFD) so that integrity
checks can tell a genuine U+FFFD in the text from a broken byte stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "SSEEvent", "SSEOverflow", "SSEParser", "decode_counting"]

_LINE_END = re.compile(rb"\r\n|\r|\n")
DEFAULT_MAX_EVENT_BYTES = 1 << 20  # 1 MiB: far above any token event, far below what hurts a client


class SSEOverflow(ValueError):
    """A line or an event grew past the parser's bound: the stream is broken (or hostile).

    ``events``: the events the same read completed before the bound was hit; they are real.
    """

    def __init__(self, message: str, events: list[SSEEvent] | None = None) -> None:
        super().__init__(message)
        self.events: list[SSEEvent] = events or []


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event. ``data`` is None when the block had fields but no ``data:`` line."""

    data: str | None
    event: str | None = None
    id: str | None = None
    terminated: bool = True  # False: the stream ended before the blank line that closes the event


def decode_counting(raw: bytes) -> tuple[str, int]:
    """Decode UTF-8 like ``errors='replace'`` and also return how many bytes were invalid."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    out: list[str] = []
    bad = 0
    pos = 0
    while True:
        try:
            out.append(raw[pos:].decode("utf-8"))
            return "".join(out), bad
        except UnicodeDecodeError as exc:
            # exc.start/end are relative to raw[pos:]; the span is one maximal invalid subpart
            out.append(raw[pos : pos + exc.start].decode("utf-8"))
            out.append("\ufffd")
            bad += exc.end - exc.start
            pos += exc.end


def _utf8_length(lead: int) -> int:
    """Sequence length announced by a lead byte; 0 for bytes that cannot start a sequence."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead < 0xE0:
        return 2
    if 0xE0 <= lead < 0xF0:
        return 3
    if 0xF0 <= lead < 0xF5:
        return 4
    return 0


class SSEParser:
    """Feed network reads with ``feed``; call ``close`` at end of stream for a trailing event.

    ``max_event_bytes`` bounds both an unterminated line and the data of one event: a server that
    never sends a line end (or a blank line) must not grow a client's memory without bound, so
    ``feed`` raises ``SSEOverflow`` instead, and the caller stops reading the stream.
    """

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes < 1:
            raise ValueError(f"max_event_bytes must be at least 1, found {max_event_bytes}")
        self.max_event_bytes = max_event_bytes
        self._buf = b""
        self._data_bytes = 0  # size of the data lines of the current event so far
        self._skip_lf = False  # the previous read ended in CR: a leading LF belongs to it
        self._data: list[str] = []
        self._event: str | None = None
        self._id: str | None = None
        self._fields = False  # the current block has had at least one field line
        self._need = 0  # continuation bytes still owed by a character begun in an earlier read
        self.utf8_errors = 0  # invalid bytes seen
        self.split_chars = 0  # valid multibyte characters that arrived split across reads
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse one network read; return the events it completed."""
        if not chunk:
            return []
        self._track_split(chunk)
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if (
            not self._buf and not self._fields and chunk[:6] == b"data: " and chunk[-2:] == b"\n\n"
            and chunk.count(b"\n") == 2 and b"\r" not in chunk and len(chunk) <= self.max_event_bytes
        ):
            # the common read of a token stream: exactly one complete one-line event (the general
            # path below gives the same event; this one skips the line splitting)
            value, bad = decode_counting(chunk[6:-2])
            self.utf8_errors += bad
            return [SSEEvent(value)]
        return self._feed_lines(chunk)

    def _feed_lines(self, chunk: bytes) -> list[SSEEvent]:
        """The general path of ``feed``: split the read into lines (any line end), parse each."""
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" not in buf:
            if b"\n" not in buf:
                self._check_line(buf)
                self._buf = buf
                return []
            parts = buf.split(b"\n")
        else:
            parts = _LINE_END.split(buf)
            if buf.endswith(b"\r"):
                self._skip_lf = True
        self._buf = parts.pop()
        events: list[SSEEvent] = []
        try:
            for raw in parts:
                event = self._line(raw)
                if event is not None:
                    events.append(event)
            self._check_line(self._buf)
        except SSEOverflow as exc:
            exc.events = events
            raise
        return events

    def _check_line(self, pending: bytes) -> None:
        if len(pending) > self.max_event_bytes:
            self._buf = b""  # let go of it: the stream is abandoned
            raise SSEOverflow(f"an SSE line grew past {self.max_event_bytes} bytes without a line end")

    def close(self) -> list[SSEEvent]:
        """End of stream: an unterminated last line or event is returned with ``terminated=False``."""
        if self._buf:
            raw, self._buf = self._buf, b""
            self._line(raw)
        self._need = 0
        if not self._fields:
            return []
        event = self._dispatch()
        return [SSEEvent(event.data, event.event, event.id, terminated=False)] if event else []

    def _line(self, raw: bytes) -> SSEEvent | None:
        if not raw:
            return self._dispatch() if self._fields else None
        if raw[:1] == b":":
            self.comments += 1  # keep-alive; never a field, never content
            return None
        line, bad = decode_counting(raw)
        self.utf8_errors += bad
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        self._fields = True
        if name == "data":
            self._data_bytes += len(raw)
            if self._data_bytes > self.max_event_bytes:
                self._data = []
                raise SSEOverflow(f"an SSE event grew past {self.max_event_bytes} bytes of data without a blank line")
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        # retry and unknown fields are ignored, as the SSE spec says
        return None

    def _dispatch(self) -> SSEEvent | None:
        data = "\n".join(self._data) if self._data else None
        event = SSEEvent(data, self._event, self._id)
        self._data = []
        self._data_bytes = 0
        self._event = None
        self._id = None
        self._fields = False
        return event

    def _track_split(self, chunk: bytes) -> None:
        """Count characters completed in this read that were begun in an earlier one."""
        start = 0
        if self._need:
            while start < len(chunk) and self._need and 0x80 <= chunk[start] <= 0xBF:
                start += 1
                self._need -= 1
            if self._need == 0:
                self.split_chars += 1
            elif start < len(chunk):
                self._need = 0  # broken sequence: an invalid-byte matter, not a split
            else:
                return  # the whole read continued the character; it is still incomplete
        end = len(chunk)
        # look back at most 3 bytes for the lead byte of a trailing, incomplete sequence
        for back in range(1, min(4, end - start) + 1):
            byte = chunk[end - back]
            if byte < 0x80:
                return
            if byte >= 0xC0:
                length = _utf8_length(byte)
                if length > back:
                    self._need = length - back
                return
