"""Server-sent events over bytes, incrementally: whole events out of the reads of a response body.

Pure and allocation-light, because it runs once per upstream read on the hop's hot path: a read is
split on blank lines in bytes (``split(b"\\n\\n")`` when the buffer holds no carriage return, a
regular expression only when it does), never decoded to text, never walked byte by byte. An event
is kept as the bytes it arrived as, terminator included, so relaying the events one after another
gives back the body byte for byte.

``classify`` names an event's kind as a tap records it (``TAP_EVENT_KINDS`` of
``chaos.model.observations``: data, usage, finish, error, done, comment) and returns the payload the
digest is taken over: the ``data:`` values joined with ``\\n`` (the SSE data a client dispatches),
or for an event without data lines the event's own text.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["DONE_EVENT", "KEEPALIVE_EVENT", "EventParser", "carries_reasoning", "classify", "digest",
           "utf8_inner_offsets"]

DONE_EVENT = b"data: [DONE]\n\n"
KEEPALIVE_EVENT = b": keep-alive\n\n"

# an event ends at a blank line: two line ends in a row, each CRLF, LF or CR (the SSE grammar); a CR
# followed by LF is one line end, never two
_BOUNDARY = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LINE_END = re.compile(rb"\r\n|\r|\n")
_ERROR = re.compile(rb'\s*\{\s*"error"\s*:')


class EventParser:
    """Whole events out of body bytes fed as they arrive; ``buffered`` bytes wait for their blank line."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """The events ``data`` completes, each with its terminator, in order."""
        buf = self._buf + data if self._buf else data
        if b"\r" not in buf:  # the common case: LF line ends, one C-speed split
            parts = buf.split(b"\n\n")
            self._buf = parts.pop()
            return [p + b"\n\n" for p in parts]
        return self._feed_cr(buf)

    def _feed_cr(self, buf: bytes, final: bool = False) -> list[bytes]:
        events = []
        start = 0
        for match in _BOUNDARY.finditer(buf):
            end = match.end()
            # a CR at the very end may be the first half of a CRLF still on its way: wait for it
            if end == len(buf) and buf.endswith(b"\r") and not final:
                break
            events.append(buf[start:end])
            start = end
        self._buf = buf[start:]
        return events

    def finish(self) -> tuple[list[bytes], bytes]:
        """The body ended: the events still buffered (one that ended in a lone CR), and what is left
        unterminated (relayed as it is, not an event)."""
        events = self._feed_cr(self._buf, final=True) if b"\r" in self._buf else []
        return events, self.take()

    def take(self) -> bytes:
        """Everything still buffered (an unterminated event at the body's end, or an oversized one)."""
        rest, self._buf = self._buf, b""
        return rest


def classify(event: bytes) -> tuple[str, bytes]:
    """``(kind, payload)`` of one event as ``EventParser`` returns it; kind "" for blank lines alone."""
    body = event.strip(b"\r\n")
    if not body:
        return "", b""
    if body.startswith(b"data:") and b"\n" not in body and b"\r" not in body:
        payload = body[6:] if body[5:6] == b" " else body[5:]  # one data line: the usual event
    else:
        found = _data_of(body)
        if found is None:
            return "comment", body
        payload = found
    return _kind(payload), payload


def _data_of(body: bytes) -> bytes | None:
    """The event's data (its ``data`` field values joined with LF), or None when it has no data line."""
    values = []
    for line in _LINE_END.split(body):
        name, _, value = line.partition(b":")
        if name == b"data":  # "data" alone is an empty data line too
            values.append(value[1:] if value[:1] == b" " else value)
    return b"\n".join(values) if values else None


def _kind(payload: bytes) -> str:
    if payload == b"[DONE]":
        return "done"
    if _ERROR.match(payload):
        return "error"
    if _starts(payload, b'"finish_reason"', b'"'):  # a string: finished (null is not)
        return "finish"
    if _starts(payload, b'"usage"', b"{"):  # an object: the usage record (null is none)
        return "usage"
    return "data"


def carries_reasoning(payload: bytes) -> bool:
    """Whether a data payload carries reasoning text: a non-empty string under vLLM's
    ``delta.reasoning_content`` or ``delta.reasoning`` (null or "" is none). A byte search, no JSON parse;
    asked only of a request that a rule watches for reasoning."""
    return _starts(payload, b'"reasoning_content"', b'"', b'""') or _starts(payload, b'"reasoning"', b'"', b'""')


def _starts(payload: bytes, key: bytes, first: bytes, unless: bytes | None = None) -> bool:
    """Whether some ``key:`` in ``payload`` has a value beginning with ``first`` (``bytes.find``, not a regex
    over the whole payload: this runs for every event)."""
    at = payload.find(key)
    while at != -1:
        after = payload[at + len(key):at + len(key) + 32].lstrip()
        if after[:1] == b":":
            value = after[1:].lstrip()
            if value[:1] == first and (unless is None or not value.startswith(unless)):
                return True
        at = payload.find(key, at + len(key))
    return False


def digest(payload: bytes) -> str:
    """The first 16 hex digits of the payload's SHA-256: what two taps compare events by."""
    return hashlib.sha256(payload).hexdigest()[:16]


def utf8_inner_offsets(data: bytes) -> list[int]:
    """Offsets at which splitting ``data`` cuts a multibyte UTF-8 character in two (before a continuation
    byte, 0x80-0xBF), found by a C-speed translate, not a Python loop over the bytes."""
    marks = data.translate(_CONTINUATION)
    out = []
    at = marks.find(b"\x01", 1)
    while at != -1:
        out.append(at)
        at = marks.find(b"\x01", at + 1)
    return out


_CONTINUATION = bytes(1 if 0x80 <= b <= 0xBF else 0 for b in range(256))
