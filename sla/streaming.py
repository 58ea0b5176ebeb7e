"""`streaming`: the responses really stream; nothing in the path (a proxy, a gateway) buffers them.

A buffering hop (nginx with ``proxy_buffering`` and HTTP/1.0 to the upstream, a gateway that
collects the response) holds each response and forwards it whole: the client then gets its first
token with nearly all of the stream (TTFT / end-to-end near 1), many content events per network
read (the whole stream in one or two reads), and inter-token gaps that collapse to ~0 while TTFT
rises. A stream is judged **buffered** when both hold: its first content arrived after at least
``min_first_share`` of its end-to-end time, and its content events came in at most
``max_reads`` reads (or fewer than one read per ``min_events_per_read`` events). Latency alone
(a slow link, ``network.latency``) raises TTFT / e2e but keeps events in separate reads, so it
is not mistaken for buffering; a stream with fewer than ``min_events`` content events is not
judged (a two-token answer cannot show either sign).

The figure is the share of judged streams that were buffered, against ``budget`` (default 10%);
the evidence gives TTFT / e2e, events per read and the inter-token gap medians of the judged
streams, and, when it fails, says plainly that the responses are being buffered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from chaos.observations import NS, Observations, StreamRecord
from chaos.params import Param, Schema
from sla.base import Status, Verdict, verifier
from sla.common import MAX_IDS

__all__ = ["buffered", "stream_signs", "streaming"]

SCHEMA = Schema(
    (
        Param("budget", "fraction", default=0.10, doc="the largest share of judged streams that may arrive buffered"),
        Param("min_first_share", "fraction", default=0.8,
              doc="a stream whose first content came after this share of its end-to-end time may be buffered"),
        Param("max_reads", "int", default=2, min=1, doc="... and whose content came in at most this many reads"),
        Param("min_events_per_read", "float", default=4.0, min=1.0,
              doc="... or in fewer reads than one per this many content events"),
        Param("min_events", "int", default=4, min=2, doc="streams with fewer content events are not judged"),
        Param("min_samples", "int", default=5, min=1, doc="fewer judged streams than this: inconclusive"),
    )
)


def stream_signs(stream: StreamRecord) -> dict[str, float] | None:
    """TTFT / e2e, content reads and events per read of one stream, or None when it cannot be judged. Pure."""
    stamps = stream.t_content
    if stream.t_sent is None or not stamps:
        return None
    e2e = stamps[-1] - stream.t_sent
    if e2e <= 0:
        return None
    reads = len(set(stamps))  # every event of one read carries that read's stamp
    return {"first_share": (stamps[0] - stream.t_sent) / e2e, "content_reads": float(reads),
            "events_per_read": len(stamps) / reads}


def buffered(signs: Mapping[str, float], params: Mapping[str, Any]) -> bool:
    """Whether a stream's signs say it was held and forwarded whole. Pure."""
    few_reads = signs["content_reads"] <= params["max_reads"] or signs["events_per_read"] >= params["min_events_per_read"]
    return bool(signs["first_share"] >= params["min_first_share"] and few_reads)


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


@verifier("streaming", SCHEMA, "responses arrive as a stream, not buffered whole by a proxy or gateway in the path")
def streaming(obs: Observations, params: Mapping[str, Any], phase: str | None) -> Verdict:
    budget: float = params["budget"]
    judged: list[tuple[StreamRecord, dict[str, float]]] = []
    for stream in obs.population(phase):
        if stream.hangup is not None or len(stream.t_content) < params["min_events"]:
            continue
        signs = stream_signs(stream)
        if signs is not None:
            judged.append((stream, signs))
    held = [(st, sg) for st, sg in judged if buffered(sg, params)]
    gaps = [g / NS for st, _ in judged for g in st.gaps_ns]
    ttfts = [st.ttft_ns / NS for st, _ in judged if st.ttft_ns is not None]
    evidence: dict[str, Any] = {
        "judged": len(judged),
        "buffered": len(held),
        "first_share_p50": _median([sg["first_share"] for _, sg in judged]),
        "events_per_read_p50": _median([sg["events_per_read"] for _, sg in judged]),
        "content_reads_p50": _median([sg["content_reads"] for _, sg in judged]),
        "ttft_p50_s": _median(ttfts),
        "itl_p50_s": _median(gaps),
        "buffered_ids": [st.id for st, _ in held[:MAX_IDS]],
        "rule": (f"buffered: first content after >= {params['min_first_share']:.0%} of the stream's time and "
                 f"its content in <= {params['max_reads']} reads (or >= {params['min_events_per_read']:g} events per read)"),
    }
    if len(judged) < params["min_samples"]:
        evidence["reason"] = (f"{len(judged)} streams with at least {params['min_events']} content events, "
                              f"{params['min_samples']} needed")
        return Verdict("streaming", phase, "inconclusive", None, budget, "fraction", len(judged), evidence)
    share = len(held) / len(judged)
    status: Status = "pass" if share <= budget else "fail"
    if status == "fail":
        evidence["reason"] = (
            f"your responses are being buffered by something in the path: {len(held)} of {len(judged)} streams got "
            f"their first token with {evidence['first_share_p50']:.0%} of the stream's time gone (median) and "
            f"{evidence['events_per_read_p50']:.1f} content events per read; look for proxy_buffering (nginx: "
            "proxy_buffering off, or X-Accel-Buffering: no with proxy_http_version 1.1) or a gateway that collects responses")
    return Verdict("streaming", phase, status, share, budget, "fraction", len(judged), evidence)
