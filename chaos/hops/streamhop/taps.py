"""What the hop records of one request (the ``TapRecord`` of ``chaos.model.observations``, field for
field, which this product may not import: ``tests/hops`` reads a written line back with ``from_json``),
and the file the records go to.

A tap holds at most ``max_events`` events per side and counts the rest in ``dropped_up`` /
``dropped_down``; it is written as one JSON line when its request ends and nothing of it is kept
after that. The file is opened for appending, mode 0600, without following a link, and each record
goes out in one ``write`` so a reader never sees half a line from a live hop.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["HEADERS_KEPT", "Tap", "TapFile", "headers_kept"]

# the response headers a tap keeps (lower-case): what tells how a hop framed and encoded the stream
HEADERS_KEPT = ("content-type", "content-encoding", "content-length", "transfer-encoding", "cache-control",
                "x-accel-buffering", "retry-after", "connection")


class Tap:
    """One request through the hop, filled in as it goes (stamps: ``time.monotonic_ns()``)."""

    __slots__ = ("hop", "seq", "request_id", "target", "t_accept", "t_upstream_open", "t_upstream_head", "t_end",
                 "t_client_gone", "t_upstream_closed", "status_up", "status_down", "headers_up", "headers_down",
                 "up", "down", "dropped_up", "dropped_down", "bytes_up", "bytes_down", "reads_up", "up_end",
                 "down_end", "faults", "traceparent", "max_events")

    def __init__(self, hop: str, seq: int, request_id: str | None, target: str, t_accept: int,
                 max_events: int) -> None:
        self.hop, self.seq, self.request_id, self.target, self.t_accept = hop, seq, request_id, target, t_accept
        self.t_upstream_open: int | None = None
        self.t_upstream_head: int | None = None
        self.t_end: int | None = None
        self.t_client_gone: int | None = None
        self.t_upstream_closed: int | None = None
        self.status_up: int | None = None
        self.status_down: int | None = None
        self.headers_up: dict[str, str] = {}
        self.headers_down: dict[str, str] = {}
        # (t_ns, kind, digest) tuples, not lists: a tuple of atoms leaves the garbage collector's watch,
        # and thousands of live lists made its full collections the hop's worst per-event latency
        self.up: list[tuple[int, str, str]] = []
        self.down: list[tuple[int, str, str]] = []
        self.dropped_up = self.dropped_down = 0
        self.bytes_up = self.bytes_down = self.reads_up = 0
        self.up_end = self.down_end = "none"
        self.faults: list[str] = []
        self.traceparent: str | None = None  # the request's W3C traceparent as it reached the hop (the load's --otlp)
        self.max_events = max_events

    def event_up(self, t_ns: int, kind: str, digest: str) -> None:
        if len(self.up) < self.max_events:
            self.up.append((t_ns, kind, digest))
        else:
            self.dropped_up += 1

    def event_down(self, t_ns: int, kind: str, digest: str) -> None:
        if len(self.down) < self.max_events:
            self.down.append((t_ns, kind, digest))
        else:
            self.dropped_down += 1

    def closed_upstream(self, t_ns: int, end: str) -> None:
        """The hop closed (or lost) its upstream connection; the first reason given stands."""
        if self.t_upstream_closed is None:
            self.t_upstream_closed = t_ns
        if self.up_end == "none" or self.up_end == "open":
            self.up_end = end

    def as_dict(self) -> dict[str, Any]:
        """The ``TapRecord`` as ``chaos.model.observations.to_json`` writes it."""
        body: dict[str, Any] = {"type": "tap"}
        for name in _FIELDS:
            body[name] = getattr(self, name)
        if body["up_end"] == "open":  # still open when the request ended: the hop let it go with it
            body["up_end"] = "closed"
        return body


_FIELDS = tuple(name for name in Tap.__slots__ if name != "max_events")


def headers_kept(headers: list[tuple[bytes, ...]] | list[tuple[bytes, bytes]]) -> dict[str, str]:
    kept: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("latin-1").strip().lower()
        if key in HEADERS_KEPT:
            kept[key] = value.decode("latin-1").strip()
    return kept


class TapFile:
    """The taps file: one JSON line per finished request, appended."""

    def __init__(self, path: str) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd: int | None = os.open(path, flags, 0o600)
        os.fchmod(self._fd, 0o600)  # an existing file keeps its mode through open(): make it ours
        self.written = 0

    def write(self, tap: Tap) -> None:
        if self._fd is None:
            return
        line = json.dumps(tap.as_dict(), separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        view = memoryview(line)
        while view:  # a regular file takes it whole; the loop is for the rare short write
            view = view[os.write(self._fd, view):]
        self.written += 1

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
