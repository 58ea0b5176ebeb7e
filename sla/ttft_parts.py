"""TTFT taken apart, from the client's stamps (``StreamRecord.t_connected``, ``t_tls``, ``t_request``):
where the wait for a first token went on the way from the request's start to it.

- ``connect``: the TCP connect (a new connection only): the network's round trip and the server's accept;
- ``tls``: the TLS handshake after it (a new TLS connection only);
- ``to_request``: from there to the request's bytes written (a new connection only): HTTP/2's wait for
  the server's SETTINGS, and a stream's wait for a connection that other streams opened;
- ``to_head``: the request's bytes written → the response head: the server's admission and queue as a
  client sees them, plus one round trip (an engine that answers its head only once it schedules the
  request, as the builtin stack and vLLM's API server do after validation, shows its queue here);
- ``head_to_token``: the head → the first token: prefill, and what a buffering hop holds back.

A reused connection has no connect, TLS or to_request part: its TTFT starts at the request's write.
The parts of one stream add up to its TTFT (``t_sent`` is the connect's start on a new connection, the
write on a reused one). Journals from before the stamps (no ``t_request``) give no split. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from chaos.model.observations import StreamRecord
from sla.common import summary_s

__all__ = ["PARTS", "ttft_parts", "parts_evidence"]

PARTS = ("connect", "tls", "to_request", "to_head", "head_to_token")


def ttft_parts(stream: StreamRecord, first_ns: int | None) -> dict[str, int] | None:
    """The parts (ns) of one stream's wait from ``t_sent`` to ``first_ns`` (its first token), or None
    where its stamps cannot say (no first token, no request or head stamp, a journal from before). Each
    part starts where the one before ended (a stream that joined a connection already opening starts
    later than its connect did), so the parts add up to the wait."""
    if first_ns is None or stream.t_sent is None or stream.t_request is None or stream.t_headers is None:
        return None
    parts: dict[str, int] = {}
    start = stream.t_sent

    def until(name: str, stamp: int) -> None:
        nonlocal start
        parts[name] = max(0, stamp - start)
        start = max(start, stamp)

    if stream.t_connected is not None:
        until("connect", stream.t_connected)
        if stream.t_tls is not None:
            until("tls", stream.t_tls)
        until("to_request", stream.t_request)
    else:
        start = max(start, stream.t_request)  # a reused connection: the request is written as it is sent
    until("to_head", stream.t_headers)
    until("head_to_token", first_ns)
    return parts


def parts_evidence(streams: Sequence[StreamRecord], firsts: Sequence[int | None],
                   qs: Sequence[float] = (0.5, 0.9, 0.99)) -> dict[str, Any] | None:
    """Per part, its quantiles (seconds) over the streams that had it; how many streams came on a new
    connection and how many on a reused one, and over which protocols. None: no stream could be split."""
    split = [(st, p) for st, first in zip(streams, firsts, strict=True) if (p := ttft_parts(st, first)) is not None]
    if not split:
        return None
    out: dict[str, Any] = {
        "streams": len(split),
        "new_connections": sum(1 for st, _ in split if st.reused is False),
        "reused_connections": sum(1 for st, _ in split if st.reused),
        "protocols": dict(Counter(st.protocol or "unknown" for st, _ in split)),
    }
    for part in PARTS:
        values = [p[part] for _, p in split if part in p]
        if values:
            out[part] = summary_s(values, qs)
    return out
