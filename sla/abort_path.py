"""`abort_path`: after a client hangs up, how long each hop of the path keeps its upstream open.

For every judged stream the client hung up on (``StreamRecord.hangup``), the stream hops' taps of that
request are walked from the load side in: the path's order from the run's ``Note(topic="path")``
(``{"hops": [{"name", "kind", ...}, ...]}``, load side first; see ``sla.relay``), else the order the
hops first accepted a request in. The first tap is the one bearing the stream's request id; each next
one is paired with the tap one stream hop out as ``relay`` pairs them: by request id, else (a gateway
between them that does not forward ``X-Request-Id``) in arrival order. From the hang-up (the load
closing its connection, stamped on the same host clock as every tap) the walk measures, per hop:

- a *gateway* (the hops between two boundaries, a boundary being the load or a stream hop): from the
  boundary in front of it closing its connection (the hang-up, or that stream hop's
  ``t_upstream_closed``) to the next stream hop seeing its client leave (``t_client_gone``): how long
  the gateway kept its upstream open after its client left. A gateway that never let go, so that the
  stream ran on to its end at the stream hop behind it, held on until that end (``until_end``);
- a *stream hop*: from its client leaving to its closing its own upstream (``t_upstream_closed``); with
  nothing between it and the boundary in front, from that boundary's close (noticing included).

The window before the first token is included (a hang-up while queued or in prefill) and reported on
its own. The time from the hang-up to each stream hop's upstream close is in the evidence, and, where
the engine exports them (``sla.engine_series``), the time from each hang-up to the first scrape
showing the running-requests gauge below its level before it, and the same for KV usage: coarse
(a scrape interval) and shared by every stream ending meanwhile, so evidence only.

A hung-up stream whose tap at the next stream hop cannot be found by either (that hop has taps no
request id accounts for, and arrival order left this one over) leaves that hop, and the gateway in
front of it, *unmeasured* for that stream: counted per hop in the evidence (``unmeasured``), and the
verdict cannot pass. Where every tap at the next hop was paired by request id, a stream with none
there never got that far (``not_forwarded``: nothing was held for it behind).

``budget``: the longest any hop may hold on (a duration). The verdict fails when some hop held longer,
with that hop, the request and the time it held on; passes when every hold was measured and within
it. Inconclusive, with the reason, when no client hung up, no taps were recorded, no hung-up stream
was seen at any stream hop, or some hop was unmeasured for some hung-up stream (and no measured hold
failed). A gateway after the last stream hop (between it and the engine) has no tap behind it: only
the engine's gauges speak for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chaos.model.context import HaltSpec
from chaos.model.observations import NS, MetricSample, Observations, StreamRecord, TapRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS
from sla.engine_series import metrics_off, pick, profile_series
from sla.relay import STREAM_KIND, PathHop, between, pair_taps, path_hops

__all__ = ["AbortPath", "Hold", "holds_of"]

SCHEMA = Schema(
    (
        Param("budget", "duration", default=1.0,
              doc="the longest any hop may keep its upstream open after its client left, e.g. 500ms"),
        Param("min_samples", "int", default=1, min=1, doc="fewer hung-up streams seen at a stream hop: inconclusive"),
    )
)


@dataclass(frozen=True)
class Hold:
    """One hop's hold on one hung-up stream."""

    hop: str  # a stream hop's name, or the gateway(s) between two boundaries ("nginx", "between a and b")
    kind: str  # "stream" | "gateway"
    request_id: str
    held_ns: int
    before_first_token: bool
    until_end: bool = False  # the hop never let go: the stream ran to its end behind it
    wire_id: str | None = None  # its X-Request-Id as sent, where that was UUID-shaped (what a gateway's log shows)


@dataclass
class _Walk:
    """Every hold of the judged streams, and what could not be measured."""

    holds: list[Hold] = field(default_factory=list)
    closed_after: dict[str, list[int]] = field(default_factory=dict)  # stream hop -> hang-up to its upstream close
    unseen: int = 0  # hung-up streams no stream hop saw
    unobserved: int = 0  # hops whose close was never stamped (the run ended first)
    ended_before: int = 0  # hops whose stream had ended before the hang-up reached them
    not_forwarded: int = 0  # hung-up streams that never reached the next stream hop (every tap there accounted for)
    # hop (a stream hop, or the gateway(s) in front of it) -> (kind, hung-up streams it could not be measured on)
    unmeasured: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    paired_by_order: dict[str, int] = field(default_factory=dict)  # stream hop -> taps paired by arrival order


@dataclass
class _Pairing:
    """How one request's taps are found, stream hop by stream hop from the load side in."""

    order: list[str]  # the stream hops that left taps, load side first
    by_id: dict[str, dict[str, TapRecord]] = field(default_factory=dict)  # hop -> request id -> tap (last attempt)
    inward: dict[str, dict[int, TapRecord]] = field(default_factory=dict)  # hop -> id() of the tap one hop out -> tap
    by_ids_only: dict[str, bool] = field(default_factory=dict)  # hop -> every tap there was paired by request id
    by_order: dict[str, int] = field(default_factory=dict)  # hop -> taps paired in arrival order


def _hop_order(obs: Observations, path: Sequence[PathHop] | None) -> list[str]:
    """The stream hops that left taps, load side first: the path's order, else the order of their first accept."""
    tapped = {t.hop for t in obs.taps}
    if path is not None:
        return [h.name for h in path if h.kind == STREAM_KIND and h.name in tapped]
    first: dict[str, int] = {}
    for tap in obs.taps:
        first[tap.hop] = min(first.get(tap.hop, tap.t_accept), tap.t_accept)
    return sorted(first, key=lambda hop: first[hop])


def _pairing(obs: Observations, path: Sequence[PathHop] | None) -> _Pairing:
    """Pair every two neighbouring stream hops' taps as ``relay`` does (by request id, then arrival order)."""
    pairing = _Pairing(_hop_order(obs, path))
    for hop in pairing.order:
        ids: dict[str, TapRecord] = {}
        for tap in sorted(obs.taps_at(hop), key=lambda t: t.t_accept):
            if tap.request_id is not None:
                ids[tap.request_id] = tap  # a retried request: its last attempt
        pairing.by_id[hop] = ids
    for outer, inner in zip(pairing.order, pairing.order[1:], strict=False):
        pairs, counts = pair_taps(obs.taps_at(outer), obs.taps_at(inner))
        pairing.inward[inner] = {id(o): i for o, i in pairs}
        pairing.by_ids_only[inner] = counts["paired_by_order"] + counts["unpaired_inner"] == 0
        pairing.by_order[inner] = counts["paired_by_order"]
    return pairing


def _chain(stream_id: str, pairing: _Pairing) -> tuple[list[TapRecord], str | None]:
    """One request's taps, load side first, from the first stream hop that saw its id; and the stream hop
    where no tap of it could be paired (None: the chain reached the last stream hop)."""
    start = next((i for i, hop in enumerate(pairing.order) if stream_id in pairing.by_id[hop]), None)
    if start is None:
        return [], None
    taps = [pairing.by_id[pairing.order[start]][stream_id]]
    for hop in pairing.order[start + 1:]:
        nxt = pairing.inward[hop].get(id(taps[-1]))
        if nxt is None:
            return taps, hop
        taps.append(nxt)
    return taps, None


def _gateway_name(path: Sequence[PathHop] | None, outer: str | None, inner: str) -> str | None:
    """The gateway(s) between ``outer`` (None: the load) and stream hop ``inner``; None when the path says
    nothing lies between."""
    hops = between(path, outer, inner)
    if hops is None:
        return f"between {outer or 'the load'} and {inner}"
    return ", ".join(hops) or None


def holds_of(stream: StreamRecord, taps: Sequence[TapRecord], path: Sequence[PathHop] | None,
             walk: _Walk) -> bool:
    """Walk one hung-up stream's taps (load side first) and add its holds to ``walk``; whether the hang-up
    went on past the last tap (it closed its upstream too), so what lies behind it was owed a hold. Pure
    but for ``walk``."""
    assert stream.hangup is not None
    first = stream.t_first_token  # a reasoning token is a token: the engine was already generating
    early = first is None or first > stream.hangup.t
    rid = stream.id
    wire = next((t.wire_id for t in taps if t.wire_id), None)
    close: int = stream.hangup.t  # when the boundary in front closed its upstream connection
    outer: str | None = None
    for tap in taps:
        gateway = _gateway_name(path, outer, tap.hop)
        if tap.t_client_gone is None:
            end = tap.t_end if tap.t_end is not None else tap.t_upstream_closed
            if end is None:
                walk.unobserved += 1
                return False
            if end <= close:
                walk.ended_before += 1  # the response was over here before the hang-up reached it
                return False
            walk.holds.append(Hold(gateway or tap.hop, "gateway" if gateway else "stream", rid, end - close,
                                   early, until_end=True, wire_id=wire))
            return False  # the rest of the path never saw a hang-up
        if gateway is not None:
            walk.holds.append(Hold(gateway, "gateway", rid, max(0, tap.t_client_gone - close), early, wire_id=wire))
        if tap.t_upstream_closed is None:
            walk.unobserved += 1
            return False
        since = tap.t_client_gone if gateway is not None else close
        walk.holds.append(Hold(tap.hop, "stream", rid, max(0, tap.t_upstream_closed - since), early, wire_id=wire))
        walk.closed_after.setdefault(tap.hop, []).append(tap.t_upstream_closed - stream.hangup.t)
        close, outer = tap.t_upstream_closed, tap.hop
    return True


def _walk(obs: Observations, hung: Sequence[StreamRecord]) -> _Walk:
    path = path_hops(obs)
    pairing = _pairing(obs, path)
    walk = _Walk(paired_by_order={hop: n for hop, n in pairing.by_order.items() if n})
    for stream in hung:
        taps, cut_at = _chain(stream.id, pairing)
        if not taps:
            walk.unseen += 1
            continue
        if holds_of(stream, taps, path, walk) and cut_at is not None:
            _cut_short(walk, path, taps[-1].hop, cut_at, stream.id, reached=not pairing.by_ids_only[cut_at])
    return walk


def _cut_short(walk: _Walk, path: Sequence[PathHop] | None, outer: str, hop: str, stream_id: str, *,
               reached: bool) -> None:
    """The hang-up went on past stream hop ``outer`` and ``hop``'s tap of the stream was not found. With
    every tap at ``hop`` paired by request id, the stream never got there; else it may have, unpaired:
    ``hop`` and the gateway(s) in front of it are unmeasured for it."""
    if not reached:
        walk.not_forwarded += 1
        return
    gateway = _gateway_name(path, outer, hop)
    for label, kind in ((gateway, "gateway"), (hop, "stream")):
        if label is not None:
            walk.unmeasured.setdefault(label, (kind, []))[1].append(stream_id)


def _stats_s(values_ns: Sequence[int]) -> dict[str, Any]:
    arr = np.asarray(values_ns, dtype=float) / NS
    return {"n": int(len(arr)), "p50_s": round(float(np.quantile(arr, 0.5)), 6),
            "max_s": round(float(arr.max()), 6)} if len(arr) else {"n": 0}


def _per_hop(holds: Sequence[Hold], budget_ns: int,
             unmeasured: dict[str, tuple[str, list[str]]]) -> list[dict[str, Any]]:
    """Per hop, load side first (the order holds were walked in): held times, split at the first token,
    and the hung-up streams it could not be measured on (a hop measured on none: ``streams`` 0)."""
    out: dict[str, dict[str, Any]] = {}
    for hop in dict.fromkeys(h.hop for h in holds):
        mine = [h for h in holds if h.hop == hop]
        over = [h for h in mine if h.held_ns > budget_ns]
        out[hop] = {
            "hop": hop, "kind": mine[0].kind, "streams": len(mine), **_stats_s([h.held_ns for h in mine]),
            "before_first_token": _stats_s([h.held_ns for h in mine if h.before_first_token]),
            "after_first_token": _stats_s([h.held_ns for h in mine if not h.before_first_token]),
            "until_end": sum(1 for h in mine if h.until_end),
            "over_budget": len(over), "request_ids": [h.request_id for h in over[:MAX_IDS]],
        }
        if any(h.wire_id for h in over[:MAX_IDS]):  # beside them, as they went out (a server log's X-Request-Id)
            out[hop]["wire_ids"] = [h.wire_id or h.request_id for h in over[:MAX_IDS]]
        if mine[0].kind == "stream" and all(h.held_ns == 0 for h in mine):  # our own hop behind a gateway
            out[hop]["note"] = ("a stream hop closes its upstream on the read that sees its client leave, so "
                                "its hold is 0 by construction; what it shows is that the hang-up reached it")
    for hop, (kind, ids) in unmeasured.items():
        entry = out.setdefault(hop, {"hop": hop, "kind": kind, "streams": 0, "n": 0})
        entry.update(unmeasured=len(ids), unmeasured_ids=ids[:MAX_IDS])
    return list(out.values())


def _totals(samples: Sequence[MetricSample]) -> list[tuple[int, float]]:
    """(t, sum over label sets) per scrape time."""
    by_t: dict[int, float] = {}
    for m in samples:
        by_t[m.t] = by_t.get(m.t, 0.0) + m.value
    return sorted(by_t.items())


def _drop_after(totals: Sequence[tuple[int, float]], t: int) -> int | None:
    """ns from ``t`` to the first scrape below the last level scraped before ``t``; None if none."""
    before = [v for st, v in totals if st <= t]
    if not before:
        return None
    return next((st - t for st, v in totals if st > t and v < before[-1]), None)


def _engine(obs: Observations, hung: Sequence[StreamRecord]) -> dict[str, Any] | None:
    """The engine's running gauge and KV usage after each hang-up, where scraped (evidence only)."""
    if metrics_off(obs) is not None:
        return None
    usage_names, running_names, _, _ = profile_series(obs)
    out: dict[str, Any] = {}
    for label, names in (("running_drop", running_names), ("kv_return", usage_names)):
        name = pick(obs, names)
        if name is None:
            continue
        totals = _totals(obs.series(name))
        drops = [d for st in hung if st.hangup is not None and (d := _drop_after(totals, st.hangup.t)) is not None]
        out[label] = {"series": name, **_stats_s(drops), "not_seen": len(hung) - len(drops)}
    return out or None


@verifier
@dataclass(frozen=True, kw_only=True)
class AbortPath(SlaSpec):
    """After a client hang-up, no hop of the path keeps its upstream open longer than ``budget``."""

    kind = "abort_path"
    summary = "after a client hang-up, how long each hop of the path keeps its upstream open (from the taps)"
    schema = SCHEMA
    timing = False  # hop stamps against the hang-up's own stamp: a late load generator stamps both late
    better = "lower"
    capacity_fit = True
    needs = ()  # the stream hops' taps; the engine's gauges are evidence only
    sample_label = None  # holds exist only where a client hung up: nothing to draw for every run
    decides_in_phase = False  # a hop closes its upstream after the hang-up, possibly after the phase

    budget: float  # seconds
    min_samples: int

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        """Per hung-up stream a stream hop saw, its longest hold over the hops, seconds, in send order."""
        hung = _hung(obs, phase)
        walk = _walk(obs, hung)
        longest: dict[str, int] = {}
        for h in walk.holds:
            longest[h.request_id] = max(longest.get(h.request_id, 0), h.held_ns)
        return [longest[st.id] / NS for st in hung if st.id in longest]

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a hop holding an abandoned stream is a bug, not a load figure: keep the stated bound")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        evidence: dict[str, Any] = {"budget_s": self.budget}

        def verdict(status: Status, figure: float | None, samples: int, reason: str = "") -> Verdict:
            if reason:
                evidence["reason"] = reason
            return Verdict(self.kind, phase, status, figure, self.budget, "s", samples, evidence)

        hung = _hung(obs, phase)
        evidence["hung_up"] = len(hung)
        if not hung:
            return verdict("inconclusive", None, 0, "no client hung up on a stream: abort_path needs a "
                           "client.disconnect fault (or a client that gives up)")
        if not obs.taps:
            return verdict("inconclusive", None, 0, "no taps were recorded: the path needs stream hops with "
                           "`tap: true` to see when each hop let go")
        walk = _walk(obs, hung)
        seen = len(hung) - walk.unseen
        evidence.update(_walk_evidence(obs, hung, walk, int(self.budget * NS)))
        if seen < self.min_samples or not walk.holds:
            return verdict("inconclusive", None, seen, f"{seen} hung-up stream(s) seen at a stream hop with a "
                           f"measurable hold, at least {self.min_samples} needed (matched by request id)")
        worst = max(walk.holds, key=lambda h: h.held_ns)
        evidence["worst"] = {"hop": worst.hop, "kind": worst.kind, "request_id": worst.request_id,
                             "held_s": worst.held_ns / NS, "until_end": worst.until_end,
                             "before_first_token": worst.before_first_token}
        if worst.wire_id:
            evidence["worst"]["wire_id"] = worst.wire_id
        if worst.held_ns > self.budget * NS:
            return verdict("fail", worst.held_ns / NS, seen)
        if walk.unmeasured:  # a hold within the budget says nothing of the hops it was not measured at
            return verdict("inconclusive", None, seen, _unmeasured_reason(walk))
        return verdict("pass", worst.held_ns / NS, seen)


def _hung(obs: Observations, phase: str | None) -> list[StreamRecord]:
    return sorted((st for st in obs.population(phase) if st.hangup is not None), key=lambda st: st.t_sent or 0)


def _walk_evidence(obs: Observations, hung: Sequence[StreamRecord], walk: _Walk, budget_ns: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "seen_at_a_stream_hop": len(hung) - walk.unseen,
        "before_first_token": sum(1 for st in hung if st.t_first_token is None
                                  or (st.hangup is not None and (st.t_first_token or 0) > st.hangup.t)),
        "hops": _per_hop(walk.holds, budget_ns, walk.unmeasured),
        "hangup_to_upstream_closed": {hop: _stats_s(v) for hop, v in walk.closed_after.items()},
    }
    for key in ("unseen", "unobserved", "ended_before", "not_forwarded", "paired_by_order"):
        if getattr(walk, key):
            out[key] = getattr(walk, key)
    if walk.unmeasured:
        out["unmeasured"] = {hop: len(ids) for hop, (_, ids) in walk.unmeasured.items()}
    engine = _engine(obs, hung)
    if engine is not None:
        out["engine"] = engine
    return out


def _unmeasured_reason(walk: _Walk) -> str:
    shown = "; ".join(f"{hop}: {len(ids)}" for hop, (_, ids) in walk.unmeasured.items())
    return (f"hops not measured for some hung-up streams (their taps behind could be paired neither by request id "
            f"nor in arrival order; the hops behind them unmeasured too): {shown}. Every measured hold was within "
            "the budget; forward X-Request-Id through the gateway (LiteLLM: forward_client_headers_to_llm_api)")
