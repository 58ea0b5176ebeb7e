"""`streaming`: the responses really stream; nothing in the path (a proxy, a gateway) buffers them.

A buffering hop (nginx with ``proxy_buffering`` and HTTP/1.0 to the upstream, a gateway that
collects the response) holds each response and forwards it whole, or in a few buffer-sized
pieces: the client's first content arrives late with much of the stream, many content events
come in each network read, and the inter-token gaps collapse to ~0. A stream is judged
**buffered** when its content events came at ``min_events_per_read`` (8) or more per read, or
**held in batches** when nearly every read (80% of its reads but the last, at least 3 reads) carried
``min_batch_events`` (4) or more, in steady sizes (the 20th and 80th percentiles at most one event
apart): a hop or server that writes a steady 4 events at a time while the tokens were generated
apart. Jitter bunches events irregularly (1 to 10 a read around a mean of ~3.7), not 4 in every read.

Measured here (median and 10th-90th percentile of events per read, per stream): behind nginx
1.22 buffering, 32-token streams 14 (12-25) and 64-token streams 18 (16-25), the first read at
78% / 45% of the stream's time; directly and behind nginx unbuffered 1.1-1.2 (at most 2.2);
100 ms ± 50 ms of Toxiproxy jitter, which bunches events behind a late one, 3.7 (2.7-5.4); a
slow serial engine (``transformers serve``) 1.0-2.6. TTFT / end-to-end alone does not tell them
apart: a server that queues requests has it near 0.8 with every event in its own read. A stream
with fewer than ``min_events`` content events is not judged.

A buffer holds every stream it relays, the first bytes as the rest: measured, nginx buffering 353 of
353 streams held, gzip 443 of 443, HAProxy's defaults 485 of 488, each held stream with a buffer's
mark: its first content read ``min_events_per_read`` events or more (nginx buffering: 20 of 32), or
steady batches. A starved host bunches some streams: beside the suite and two busy processes (2.0 of 2
cores busy) an unbuffered nginx's streams came 8 or more events a read for 13%, 15% and 51% of them
(their first read 1 to 2 events at the median, but most of the bunched ones' first read large: the
response's start is where a starved nginx falls behind), a serial engine (``transformers serve``) 11%.
So on a saturated host (``chaos.host.contention.SATURATED_SHARE`` of its cores busy over the judged
phase) the verdict fails only when ``SATURATED_FAIL_SHARE`` of the judged streams or more were held
with a buffer's mark; less is inconclusive and says why (a hop that buffers only some streams, one
replica of two, is then undecided there: rerun on a host with CPU to spare, where it fails).

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

from chaos.host.contention import HOST_SATURATED, saturated_host
from chaos.model.context import HaltSpec
from chaos.model.observations import NS, Observations, StreamRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS
from sla.proxy_fix import PathFacts, buffering_fix
from sla.relay import PATH_TOPIC

__all__ = ["buffered", "buffers_mark", "stream_signs", "Streaming"]

SCHEMA = Schema(
    (
        Param("budget", "fraction", default=0.10, doc="the largest share of judged streams that may arrive buffered"),
        Param("min_events_per_read", "float", default=8.0, min=2.0,
              doc="a stream whose content events came this many per network read or more was buffered"),
        Param("min_batch_events", "int", default=4, min=2,
              doc="a stream whose reads (80% of them, the last left out) each carried this many content events "
                  "or more was held and forwarded in batches"),
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
    per_read = list(Counter(stamps).values())  # every event of one read carries that read's stamp
    reads = len(per_read)
    return {"first_read_share": per_read[0] / len(stamps), "first_read_events": float(per_read[0]),
            "first_share": (stamps[0] - stream.t_sent) / e2e,
            "content_reads": float(reads), "events_per_read": len(stamps) / reads,
            # the smallest batch of the reads but the last, at the 20th percentile: 4 for a steady 4-a-write
            "batch_p20": float(np.percentile(per_read[:-1], 20)) if reads > 1 else float(per_read[0]),
            # ... and at the 80th: a hop that writes N at a time gives reads of N, a starved host irregular ones
            "batch_p80": float(np.percentile(per_read[:-1], 80)) if reads > 1 else float(per_read[0]),
            # how long the events of one read took to generate, were they generated evenly from the request
            # on (what a late client could have gathered into one read); held streams arrive bunched, so the
            # time between their first and last event says nothing of it
            "read_span_s": (len(stamps) / reads - 1) * e2e / len(stamps) / NS}


def buffered(signs: Mapping[str, float], min_events_per_read: float, min_batch_events: int = 0) -> bool:
    """Whether a stream's signs say it was held and forwarded whole (or in a few big pieces), or in
    steady batches of ``min_batch_events`` or more (0: not judged). Pure."""
    return signs["events_per_read"] >= min_events_per_read or _steady_batches(signs, min_batch_events)


def _steady_batches(signs: Mapping[str, float], min_batch_events: int) -> bool:
    """Whether nearly every read carried ``min_batch_events`` or more, in steady sizes (0: not judged). Pure."""
    return bool(min_batch_events and signs["content_reads"] >= STEADY_READS
                and signs["batch_p20"] >= min_batch_events
                and signs.get("batch_p80", signs["batch_p20"]) - signs["batch_p20"] <= STEADY_SPREAD)


def buffers_mark(signs: Mapping[str, float], min_events_per_read: float, min_batch_events: int = 0) -> bool:
    """Whether a stream judged ``buffered`` carries a buffer's own mark: its first content read held
    ``min_events_per_read`` events or more (a buffer holds the first bytes too), or it came in steady
    batches (a hop's writes; a starved host bunches irregularly). Without it, the events were bunched
    after a smaller first read, as a starved host bunches them too. Not a late first token:
    a queueing engine's comes late and alone. Pure."""
    return signs["first_read_events"] >= min_events_per_read or _steady_batches(signs, min_batch_events)


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


WHOLE_RESPONSE_SHARE = 0.5  # a buffer that holds responses whole puts most of a stream in its first read
STEADY_READS = 3  # batches are judged steady over at least this many reads
# ... and steady when the reads' sizes (20th to 80th percentile) differ by at most one event: a hop that
# writes 4 at a time gives 4s; a saturated host bunches tokens irregularly (1 to 12 an nginx read, beside
# two busy processes: 11-18% of a healthy smoke's streams had 80% of their reads at 4 or more)
STEADY_SPREAD = 1.0
# on a saturated host a fail needs this share of the judged streams held with a buffer's mark: real buffers
# held 99-100% (nginx, gzip, HAProxy), a starved host bunched 11-51%
SATURATED_FAIL_SHARE = 0.75


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
    min_batch_events: int
    min_events: int
    min_samples: int

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        return None  # a share of buffered streams: counts, no sample of values

    def lateness_explains(self, verdict: Verdict, lag_s: float) -> bool:
        """A late client bunches events (vLLM on a starved CPU: 2 per read at the median, 8+ in a burst);
        it never makes the first read carry most of a stream, as nginx's buffering or gzip does. And a
        client late by ``lag_s`` finds in one read only the events that arrived within ``lag_s`` of each
        other: a held stream whose reads each stand for more generation time than that (``held_read_span_p50_s``:
        events per read less one, times the stream's mean time per event) is not its doing."""
        if float(verdict.evidence.get("first_read_share_p50") or 0.0) >= WHOLE_RESPONSE_SHARE:
            return False
        span = verdict.evidence.get("held_read_span_p50_s")
        return span is None or float(span) <= lag_s

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
        held = [(st, sg) for st, sg in judged if buffered(sg, self.min_events_per_read, self.min_batch_events)]
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
            "held_read_span_p50_s": _median([sg["read_span_s"] for _, sg in held]),
            "buffered_ids": [st.id for st, _ in held[:MAX_IDS]],
            "rule": (f"buffered: {self.min_events_per_read:g} or more content events per network read, or "
                     f"{self.min_batch_events} or more in 80% of its reads"),
        }
        if len(judged) < self.min_samples:
            evidence["reason"] = (f"{len(judged)} streams with at least {self.min_events} content events, "
                                  f"{self.min_samples} needed")
            return Verdict("streaming", phase, "inconclusive", None, budget, "fraction", len(judged), evidence)
        share = len(held) / len(judged)
        status: Status = "pass" if share <= budget else "fail"
        marked = sum(1 for _, sg in held if buffers_mark(sg, self.min_events_per_read, self.min_batch_events))
        evidence["marked"] = marked  # held streams with a buffer's own mark: these fail on any host
        host = (saturated_host(obs, phase) if status == "fail" and marked / len(judged) < SATURATED_FAIL_SHARE
                else None)
        if host is not None:
            evidence["saturated_host"] = host
            evidence["inconclusive_cause"] = HOST_SATURATED
            evidence["reason"] = (
                f"{len(held)} of {len(judged)} streams came {self.min_events_per_read:g} or more content "
                f"events per read, {marked} of them with a buffer's mark (a first read of "
                f"{self.min_events_per_read:g} or more events, or steady batches), on a saturated host "
                f"({host['busy_cores']:.2f} of {host['cpus']} cores busy), where a starved hop bunches some "
                f"streams so too; a buffer holds every stream it relays ({SATURATED_FAIL_SHARE:.0%} or more "
                f"with its mark decide a fail here): rerun on a host with CPU to spare")
            return Verdict("streaming", phase, "inconclusive", share, budget, "fraction", len(judged), evidence)
        if status == "fail":
            # the hop that holds the streams names itself (or not) in the headers most of them came with
            evidence["reason"] = _reason(obs, held, judged, evidence)
        return Verdict("streaming", phase, status, share, budget, "fraction", len(judged), evidence)


def _reason(obs: Observations, held: list[tuple[StreamRecord, dict[str, float]]],
            judged: list[tuple[StreamRecord, dict[str, float]]], evidence: dict[str, Any]) -> str:
    """What was seen, then the hop that holds the streams as it names itself (or not) in the headers most
    of them came with, and what the run knows of its path (``path_facts``); sets the header evidence."""
    (server, via, encoding), _ = Counter((st.server, st.via, st.content_encoding) for st, _ in held).most_common(1)[0]
    evidence.update(server=server, via=via, content_encoding=encoding)
    held_epr = _median([sg["events_per_read"] for _, sg in held]) or 0.0
    return (f"your responses are being buffered by something in the path: {len(held)} of {len(judged)} streams came "
            f"{held_epr:.1f} content events per read (median of the held ones; "
            f"{evidence['events_per_read_p50']:.1f} over all), their first token together with "
            f"{evidence['first_read_share_p50']:.0%} of their content (median), after "
            f"{evidence['first_share_p50']:.0%} of the stream's time; "
            f"{buffering_fix(server, via, encoding, path_facts(obs, [st for st, _ in held]))}")


_NON_COMPRESSING = frozenset({"stream", "toxiproxy"})  # hop kinds that relay the bytes as they come


def path_facts(obs: Observations, held: list[StreamRecord]) -> PathFacts:
    """What the run knows of its path beyond the headers: its own nginx hop's configuration, the held
    responses' X-Accel-Buffering, who compressed them as a stream hop's taps saw it, and whether any hop
    of its path could have compressed at all (the run's ``path`` note; a journal without one: unknown)."""
    hops = _hops(obs)
    nginx = next((h.get("config") for h in hops or () if h.get("kind") == "nginx"), None)
    accel = [st.x_accel_buffering for st in held if st.x_accel_buffering is not None]
    return PathFacts(
        nginx_config=nginx if isinstance(nginx, str) else None,
        accel_off=bool(accel) and all(a.strip().lower() == "no" for a in accel),
        compressed_behind=_compressed_behind(obs, {st.id for st in held}, hops),
        no_compressing_hop=hops is not None and all(h.get("kind") in _NON_COMPRESSING for h in hops))


def _hops(obs: Observations) -> list[dict[str, Any]] | None:
    """The run's path hops (its ``path`` note); ``[]`` for a run that recorded its target but no path (the
    runner notes a path only when there is one; before paths, Toxiproxy was the only hop, and it does not
    compress); None when the journal cannot tell (synthetic observations)."""
    notes = obs.notes_on(PATH_TOPIC)
    if not notes:
        return [] if obs.notes_on("target") else None
    raw = notes[-1].data.get("hops")
    return [h for h in raw if isinstance(h, dict)] if isinstance(raw, list) else None


def _compressed_behind(obs: Observations, ids: set[str], hops: list[dict[str, Any]] | None) -> str | None:
    """Who compressed the held streams, from the innermost stream hop that received them compressed."""
    order = [str(h.get("name")) for h in hops or ()]
    seen = {t.hop for t in obs.taps if t.request_id in ids
            and (t.headers_up.get("content-encoding") or "identity").strip().lower() != "identity"}
    if not seen:
        return None
    inner = max(seen, key=lambda name: order.index(name) if name in order else -1)
    if order and order[-1] == inner:
        return f"the origin server (its response reached stream hop {inner}, the innermost, already compressed)"
    return f"a hop behind stream hop {inner} or the origin server (the response reached {inner} already compressed)"
