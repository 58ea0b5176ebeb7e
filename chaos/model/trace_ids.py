"""W3C Trace Context ids of a run, derived, not drawn: the load knows each stream's span id when it sends
the request (``traceparent``), and an OpenTelemetry export made after the run (``chaos.output.otel``),
or again later from the run directory, gives the stream's span exactly that id. Pure.

- the trace id: the first 16 bytes of BLAKE2b over the run id (the journal's ``run_id``);
- a stream's span id: the first 8 bytes of BLAKE2b over its request id as it goes on the wire
  (``chaos.model.request_ids.RequestIds.wire``);
- the run, phase and fault spans: BLAKE2b over the run id and their name.

An id of all zeros is invalid in W3C Trace Context; the one in 2**64 draw that makes one becomes 1.
"""

from __future__ import annotations

import hashlib

__all__ = ["TRACEPARENT_HEADER", "span_id_of", "trace_id_of", "traceparent"]

TRACEPARENT_HEADER = "traceparent"


def _digest(text: str, size: int, person: bytes) -> str:
    raw = hashlib.blake2b(text.encode("utf-8"), digest_size=size, person=person).digest()
    value = int.from_bytes(raw, "big") or 1
    return f"{value:0{size * 2}x}"


def trace_id_of(run_id: str) -> str:
    """The run's trace id: 32 lower-case hex digits, never all zeros."""
    return _digest(run_id, 16, b"streamchaos-run")


def span_id_of(key: str) -> str:
    """The span id for ``key`` (a stream's request id as sent; ``run:...`` for the run's own spans): 16
    lower-case hex digits, never all zeros."""
    return _digest(key, 8, b"streamchaos-span")


def traceparent(trace_id: str, span_id: str) -> str:
    """The ``traceparent`` header value (version 00, sampled) naming ``span_id`` as the caller's span."""
    return f"00-{trace_id}-{span_id}-01"
