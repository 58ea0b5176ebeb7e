"""`streaming`: the responses really stream; nothing in the path (a proxy, a gateway) buffers them.

A buffering hop (nginx with ``proxy_buffering`` and HTTP/1.0 to the upstream, a gateway that
collects the response) holds each response and forwards it whole, or in a few buffer-sized
pieces: the client's first content arrives late with much of the stream, many content events
come in each network read, and the inter-token gaps collapse to ~0. A stream is judged
**buffered** when its content events came at ``min_events_per_read`` (8) or more per read.

Measured here (median and 10th-90th percentile of events per read, per stream): behind nginx
1.22 buffering, 32-token streams 14 (12-25) and 64-token streams 18 (16-25), the first read at
78% / 45% of the stream's time; directly and behind nginx unbuffered 1.1-1.2 (at most 2.2);
100 ms ± 50 ms of Toxiproxy jitter, which bunches events behind a late one, 3.7 (2.7-5.4); a
slow serial engine (``transformers serve``) 1.0-2.6. TTFT / end-to-end alone does not tell them
apart: a server that queues requests has it near 0.8 with every event in its own read. A stream
with fewer than ``min_events`` content events is not judged.

The figure is the share of judged streams that were buffered, against ``budget`` (default 10%);
the evidence gives TTFT / e2e, events per read and the inter-token gap medians of the judged
streams, and, when it fails, says plainly that the responses are being buffered and names the
hop's own fix from the buffered streams' Server, Via and Content-Encoding headers
(``sla.proxy_fix``: nginx's gzip or proxy_buffering, HAProxy's ``option http-no-delay``, Caddy's
``flush_interval -1``). A compressed stream is judged on its decoded events: the load client
announces ``gzip, deflate`` as the OpenAI SDK does, and nginx's gzip filter holds a stream whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS
from sla.proxy_fix import buffering_fix

__all__ = ["buffered", "stream_signs", "Streaming"]

SCHEMA = Schema(
    (
        Param("budget", "fraction", default=0.10, doc="the largest share of judged streams that may arrive buffered"),
        Param("min_events_per_read", "float", default=8.0, min=2.0,
              doc="a stream whose content events came this many per network read or more was buffered"),
        Param("min_events", "int", default=8, min=2, doc="streams with fewer content events are not judged"),
        Param("min_samples", "int", default=5, min=1, doc="fewer judged streams than this: inconclusive"),
    )
)


def stream_signs(stream: StreamRecord) -> dict[str, float] | None:
    """Of one stream: the share of its content events in its first content read, TTFT / end-to-end,
    its content reads and events per read; None when it cannot be judged. Pure."""
    stamps = stream.t_content
    if stream.t_sent is None or not stamps:
        return None
    e2e = stamps[-1] - stream.t_sent
    if e2e <= 0:
        return None
    reads = len(set(stamps))  # every event of one read carries that read's stamp
    first_read = sum(1 for t in stamps if t == stamps[0])
    return {"first_read_share": first_read / len(stamps), "first_share": (stamps[0] - stream.t_sent) / e2e,
            "content_reads": float(reads), "events_per_read": len(stamps) / reads}


def buffered(signs: Mapping[str, float], min_events_per_read: float) -> bool:
    """Whether a stream's signs say it was held and forwarded whole (or in a few big pieces). Pure."""
    return bool(signs["events_per_read"] >= min_events_per_read)


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


WHOLE_RESPONSE_SHARE = 0.5  # a buffer that holds responses whole puts most of a stream in its first read


@verifier
@dataclass(frozen=True, kw_only=True)
class Streaming(SlaSpec):
    kind = "streaming"
    summary = "responses arrive as a stream, not buffered whole by a proxy or gateway in the path"
    schema = SCHEMA
    timing = True
    better = "lower"
    capacity_fit = True
    needs = ()
    sample_label = None

    budget: float
    min_events_per_read: float
    min_events: int
    min_samples: int

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a share of buffered streams: counts, no sample of values

    def lateness_explains(self, verdict: Verdict, lag_s: float) -> bool:
        """A late client bunches events (vLLM on a starved CPU: 2 per read at the median, 8+ in a burst);
        it never makes the first read carry most of a stream, as nginx's buffering or gzip does."""
        return float(verdict.evidence.get("first_read_share_p50") or 0.0) < WHOLE_RESPONSE_SHARE

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a buffered share is a policy: responses stream or they do not")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        budget: float = self.budget
        judged: list[tuple[StreamRecord, dict[str, float]]] = []
        for stream in obs.population(phase):
            if stream.hangup is not None or len(stream.t_content) < self.min_events:
                continue
            signs = stream_signs(stream)
            if signs is not None:
                judged.append((stream, signs))
        held = [(st, sg) for st, sg in judged if buffered(sg, self.min_events_per_read)]
        gaps = [g / NS for st, _ in judged for g in st.gaps_ns]
        ttfts = [st.ttft_ns / NS for st, _ in judged if st.ttft_ns is not None]
        evidence: dict[str, Any] = {
            "judged": len(judged),
            "buffered": len(held),
            "first_read_share_p50": _median([sg["first_read_share"] for _, sg in judged]),
            "first_share_p50": _median([sg["first_share"] for _, sg in judged]),
            "events_per_read_p50": _median([sg["events_per_read"] for _, sg in judged]),
            "content_reads_p50": _median([sg["content_reads"] for _, sg in judged]),
            "ttft_p50_s": _median(ttfts),
            "itl_p50_s": _median(gaps),
            "buffered_ids": [st.id for st, _ in held[:MAX_IDS]],
            "rule": f"buffered: {self.min_events_per_read:g} or more content events per network read",
        }
        if len(judged) < self.min_samples:
            evidence["reason"] = (f"{len(judged)} streams with at least {self.min_events} content events, "
                                  f"{self.min_samples} needed")
            return Verdict("streaming", phase, "inconclusive", None, budget, "fraction", len(judged), evidence)
        share = len(held) / len(judged)
        status: Status = "pass" if share <= budget else "fail"
        if status == "fail":
            # the hop that holds the streams names itself (or not) in the headers most of them came with
            (server, via, encoding), _ = Counter((st.server, st.via, st.content_encoding)
                                                 for st, _ in held).most_common(1)[0]
            evidence.update(server=server, via=via, content_encoding=encoding)
            evidence["reason"] = (
                f"your responses are being buffered by something in the path: {len(held)} of {len(judged)} "
                f"streams got their first token together with {evidence['first_read_share_p50']:.0%} "
                f"of their content (median), after {evidence['first_share_p50']:.0%} of the stream's time, "
                f"{evidence['events_per_read_p50']:.1f} content events per read; "
                f"{buffering_fix(server, via, encoding)}")
        return Verdict("streaming", phase, status, share, budget, "fraction", len(judged), evidence)
