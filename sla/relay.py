"""`relay`: what a hop of the path did to the streams it relayed, read off the stream hops' taps.

``relay {over, budget, min_samples}`` compares, per stream, what went into a hop with what came out
of it, event by event (``TapRecord``: ``[t_ns, kind, digest]`` per SSE event, digests of the payload
with any Content-Encoding undone):

- ``over`` names a hop that is not a stream hop (a gateway): the nearest stream hop on its target
  side (*inner*) and on its load side (*outer*) are compared: what inner wrote downstream
  (``inner.down``) against what outer received from upstream (``outer.up``). Everything between the
  two taps is judged together (the evidence names it).
- ``over`` names a stream hop: that hop's own ``up`` against its own ``down`` (so a ``stream.drop``
  or a ``stream.cut`` at it is caught).

The path's order comes from the run's ``Note(topic="path")`` whose ``data`` is ``{"hops": [{"name":
..., "kind": ..., ...}, ...]}``, load side first (the contract the runner writes); without one, only
``over`` naming a stream hop with taps can be judged. The two taps of one stream are paired by
``request_id``, falling back to arrival order for requests whose id a gateway dropped or replaced.

Per stream, kinds of alteration: ``dropped`` (events sent, never received), ``added`` (received twice,
or events nobody sent), ``merged`` (two or more sent events arriving as one), ``reordered``,
``altered`` (an event whose digest changed), ``usage_lost`` (the usage record sent, none received),
``done_lost`` (``[DONE]`` sent, none received), ``encoding`` (a Content-Encoding introduced),
``content_type`` (``text/event-stream`` sent, something else received), ``status`` (the status
changed, or the hop answered instead of relaying), ``buffered`` (events sent apart were held back and
arrived together: of the gaps of ``BUNCH_MIN_GAP_NS`` or more between consecutive sent events, at
least ``BUNCH_MIN_GAPS``, at least half *collapsed*: came out at ``BUNCH_RATIO`` of their size or less,
``BUNCH_MIN_HOLD_NS`` or more shorter than sent). The evidence floor is there because a short stream
on a busy host has a gap or two that collapse by scheduling alone (a 2 ms gap arriving 0.1 ms apart
holds nothing anyone waits on); a buffering gateway collapses most gaps of every stream. Keep-alive
comments are left out of the comparison (a hop may add them) and counted. A stream whose client left
before it ended is judged on what it received: events after its last received one are not called
dropped, and its timing (bunching) only on what arrived before the hang-up (the load's stamp, or the
hop noticing it): what a hop reads after its client left is what sat in its socket, read at once.
Evidence also has the added latency per event (received stamp minus sent stamp, p50/p99: the same
host clock on both sides) and the bunched events.

The verdict: the share of judged streams with any alteration against ``budget`` (a fraction, default
0). A starved hop bunches a few streams too: beside the suite and two busy processes (2.0 of 2 cores
busy) an unbuffered nginx collapsed the gaps of 4 of 268 streams, up to 170 ms late. When every altered
stream was only ``buffered``, they are fewer than ``SCATTERED_SHARE`` of those judged (a buffer holds
every stream it relays), and the host was saturated (``chaos.host.contention.saturated_host``), the
verdict is inconclusive and says why; with CPU to spare, or with anything else altered, it stands.
Inconclusive, with the reason, when there are no taps, the path has no stream hop on one side of
``over``, or fewer than ``min_samples`` streams could be paired. A side whose tap reached its event
cap (``dropped_up``/``dropped_down``) cannot be compared and is counted, not judged.
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chaos.host.contention import HOST_SATURATED, saturated_host
from chaos.model.context import HaltSpec
from chaos.model.observations import Observations, TapRecord
from chaos.model.params import Param, Schema
from sla.base import BudgetRule, SlaSpec, Status, Verdict, verifier
from sla.common import MAX_IDS

__all__ = ["PATH_TOPIC", "STREAM_KIND", "Diff", "PathHop", "Relay", "compare_events", "pair_taps", "path_hops",
           "stream_hop_names", "tap_in_phase"]

PATH_TOPIC = "path"  # the note the runner writes: {"hops": [{"name", "kind", ...}, ...]}, load side first
STREAM_KIND = "stream"
BUNCH_MIN_GAP_NS = 2_000_000  # a gap between two sent events this long or longer can show bunching (2 ms)
BUNCH_RATIO = 0.1  # ... it collapsed when it came out at a tenth of its size or less
BUNCH_MIN_HOLD_NS = 5_000_000  # ... and 5 ms or more shorter than sent: less is scheduling jitter, not holding
BUNCH_MIN_GAPS = 4  # fewer such gaps in a stream: too little evidence to call it buffered
SCATTERED_SHARE = 0.5  # a buffer holds every stream it relays; a starved hop bunches a few (1.5% measured)
KINDS = ("dropped", "added", "merged", "reordered", "altered", "usage_lost", "done_lost", "encoding",
         "content_type", "status", "buffered")

SCHEMA = Schema(
    (
        Param("over", "str", required=True,
              doc="the hop of the path to judge: a gateway between two stream hops, or a stream hop itself"),
        Param("budget", "fraction", default=0.0, doc="the largest share of streams the hop may alter"),
        Param("min_samples", "int", default=1, min=1, doc="fewer paired streams than this: inconclusive"),
    )
)


# -- the path ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathHop:
    name: str
    kind: str


def path_hops(obs: Observations) -> list[PathHop] | None:
    """The run's path, load side first, from its last ``path`` note; None when it recorded none."""
    for note in reversed(obs.notes_on(PATH_TOPIC)):
        hops = note.data.get("hops")
        if isinstance(hops, list) and all(isinstance(h, dict) and "name" in h for h in hops):
            return [PathHop(str(h["name"]), str(h.get("kind", ""))) for h in hops]
    return None


def stream_hop_names(obs: Observations) -> list[str]:
    """The stream hops, load side first: from the path, else every hop that left taps (in name order)."""
    path = path_hops(obs)
    if path is not None:
        return [h.name for h in path if h.kind == STREAM_KIND]
    return sorted({t.hop for t in obs.taps})


def between(path: Sequence[PathHop] | None, outer: str | None, inner: str | None) -> list[str] | None:
    """The hops strictly between ``outer`` (None: the load) and ``inner`` (None: the target); None
    when the path is unknown."""
    if path is None:
        return None
    names = [h.name for h in path]
    lo = names.index(outer) + 1 if outer in names else 0
    hi = names.index(inner) if inner in names else len(names)
    return names[lo:hi]


@dataclass(frozen=True)
class _Sides:
    """What one verdict compares: ``outer``'s up against ``inner``'s down, or one hop's own up and down."""

    inner: str
    outer: str | None  # None: ``inner`` is the hop itself (its up against its down)
    across: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        if self.outer is None:
            return f"{self.inner}: what it received upstream against what it wrote downstream"
        return (f"{self.inner} (down) to {self.outer} (up), across {', '.join(self.across) or 'the link'}")


def _sides(obs: Observations, over: str) -> _Sides | str:
    """Which taps judge ``over``, or why none can."""
    path = path_hops(obs)
    if path is None:
        if obs.taps_at(over):
            return _Sides(inner=over, outer=None)
        return (f"the run recorded no path (a {PATH_TOPIC!r} note) and {over!r} left no taps: put a stream hop on "
                f"each side of it in `path:`")
    names = [h.name for h in path]
    if over not in names:
        return f"{over!r} is not a hop of the path ({', '.join(names) or 'empty'})"
    i = names.index(over)
    if path[i].kind == STREAM_KIND:
        return _Sides(inner=over, outer=None)
    outer = next((h.name for h in reversed(path[:i]) if h.kind == STREAM_KIND), None)
    inner = next((h.name for h in path[i + 1:] if h.kind == STREAM_KIND), None)
    if outer is None or inner is None:
        side = "load" if outer is None else "target"
        return (f"no stream hop between {over!r} and the {side}: put a `stream` hop on each side of it in `path:` "
                "to judge what it relays")
    return _Sides(inner=inner, outer=outer, across=tuple(between(path, outer, inner) or ()))


# -- pairing and phases -----------------------------------------------------------------------------


def pair_taps(outer: Sequence[TapRecord], inner: Sequence[TapRecord]) -> tuple[list[tuple[TapRecord, TapRecord]],
                                                                                dict[str, int]]:
    """Pairs (outer, inner) of one request's taps: by request id (a retried request: its last attempt),
    then in arrival order for the rest (an inner request accepted no earlier than its outer one).
    Counts: paired_by_order, retried, unpaired_outer, unpaired_inner."""
    by_id: dict[str, list[TapRecord]] = {}
    for tap in sorted(inner, key=lambda t: t.t_accept):
        if tap.request_id is not None:
            by_id.setdefault(tap.request_id, []).append(tap)
    pairs: list[tuple[TapRecord, TapRecord]] = []
    used: set[int] = set()
    rest: list[TapRecord] = []
    retried = 0
    for tap in sorted(outer, key=lambda t: t.t_accept):
        tries = by_id.get(tap.request_id) if tap.request_id is not None else None
        if tries:
            pairs.append((tap, tries[-1]))
            used.update(id(t) for t in tries)
            retried += len(tries) - 1
        else:
            rest.append(tap)
    left = [t for t in sorted(inner, key=lambda t: t.t_accept) if id(t) not in used]
    by_order = _pair_in_order(rest, left)
    counts = {"paired_by_order": len(by_order), "retried": retried,
              "unpaired_outer": len(rest) - len(by_order), "unpaired_inner": len(left) - len(by_order)}
    return pairs + by_order, counts


def _pair_in_order(outer: Sequence[TapRecord], inner: Sequence[TapRecord]) -> list[tuple[TapRecord, TapRecord]]:
    """Greedy pairing in arrival order: each outer request with the next inner one accepted after it."""
    pairs = []
    j = 0
    for tap in outer:
        while j < len(inner) and inner[j].t_accept < tap.t_accept:
            j += 1
        if j == len(inner):
            break
        pairs.append((tap, inner[j]))
        j += 1
    return pairs


def tap_in_phase(obs: Observations, phase: str | None) -> Callable[[TapRecord], bool]:
    """Whether a tap belongs to the judged population: its request id is a judged stream; a request id
    the load never sent (or none) by the time it was accepted, inside the phase's window."""
    judged = {st.id for st in obs.population(phase)}
    known = {st.id for st in obs.streams}
    window = obs.phase(phase) if phase is not None else None

    def belongs(tap: TapRecord) -> bool:
        if tap.request_id in judged:
            return True
        if tap.request_id in known:
            return False  # another phase's stream, or background load
        if phase is None:
            return True
        if window is None:
            return False
        return window.t_start <= tap.t_accept and (window.t_end is None or tap.t_accept < window.t_end)

    return belongs


# -- comparing one stream's two sides -----------------------------------------------------------------


@dataclass
class Diff:
    """What happened to one stream between its two sides: events per kind, latencies, bunching."""

    kinds: Counter[str] = field(default_factory=Counter)
    latencies_ns: list[int] = field(default_factory=list)
    bunched: int = 0
    gaps: int = 0  # gaps long enough to show bunching
    comments: tuple[int, int] = (0, 0)  # keep-alive comments (sent, received)

    @property
    def altered(self) -> bool:
        return any(self.kinds[k] for k in KINDS)


Event = tuple[int, str, str]


def _events(side: Sequence[Sequence[Any]]) -> tuple[list[Event], int]:
    """The non-comment events of one side, and how many comments it had."""
    out = [(int(e[0]), str(e[1]), str(e[2])) for e in side if len(e) >= 3 and e[1] != "comment"]
    return out, len(side) - len(out)


def _match(sent: Sequence[Event], received: Sequence[Event]) -> tuple[list[tuple[int, int]], list[int], int]:
    """(matches (sent index, received index), received events nobody sent, received duplicates):
    the k-th arrival of a digest is the k-th sending of it."""
    slots: dict[str, deque[int]] = {}
    for i, (_, _, digest) in enumerate(sent):
        slots.setdefault(digest, deque()).append(i)
    matches: list[tuple[int, int]] = []
    foreign: list[int] = []
    duplicates = 0
    for j, (_, _, digest) in enumerate(received):
        queue = slots.get(digest)
        if queue:
            matches.append((queue.popleft(), j))
        elif queue is not None:
            duplicates += 1
        else:
            foreign.append(j)
    return matches, foreign, duplicates


def _in_order(matches: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of matches in the same order on both sides (their LIS by sent index): the anchors;
    the other matches were reordered."""
    tails: list[int] = []
    tail_at: list[int] = []
    parent: list[int] = []
    for k, (si, _) in enumerate(matches):
        pos = bisect.bisect_left(tails, si)
        if pos == len(tails):
            tails.append(si)
            tail_at.append(k)
        else:
            tails[pos] = si
            tail_at[pos] = k
        parent.append(tail_at[pos - 1] if pos else -1)
    out: list[tuple[int, int]] = []
    k = tail_at[-1] if tail_at else -1
    while k >= 0:
        out.append(matches[k])
        k = parent[k]
    return out[::-1]


def _regions(anchors: Sequence[tuple[int, int]], missing: Sequence[int], foreign: Sequence[int],
             tail_ok: bool) -> Counter[str]:
    """Classify, between consecutive anchors, the sent events missing and the received ones nobody sent:
    missing alone dropped, foreign alone added, more missing than foreign merged, as many altered.
    ``tail_ok``: what is missing after the last anchor is the client leaving, not a drop."""
    sent_at = [a for a, _ in anchors]
    recv_at = [b for _, b in anchors]
    miss = Counter(bisect.bisect_left(sent_at, i) for i in missing)
    extra = Counter(bisect.bisect_left(recv_at, j) for j in foreign)
    kinds: Counter[str] = Counter()
    for region in set(miss) | set(extra):
        m, f = miss[region], extra[region]
        if tail_ok and region == len(anchors):
            m = 0
        if f == 0:
            kinds["dropped"] += m
        elif m == 0:
            kinds["added"] += f
        elif m > f:
            kinds["merged"] += f
        else:
            kinds["altered"] += m
            kinds["added"] += f - m
    return +kinds


def _bunching(sent: Sequence[Event], received: Sequence[Event], anchors: Sequence[tuple[int, int]],
              until: int | None = None) -> tuple[int, int]:
    """(bunched, gaps): gaps of at least ``BUNCH_MIN_GAP_NS`` between consecutive sent events, and those of
    them that collapsed (arrived at a ``BUNCH_RATIO`` of the gap or closer, ``BUNCH_MIN_HOLD_NS`` or more
    sooner); only events received by ``until`` (the hang-up) count."""
    bunched = gaps = 0
    for (s1, r1), (s2, r2) in zip(anchors, anchors[1:], strict=False):
        if until is not None and received[r2][0] > until:
            break  # anchors arrive in order: the rest came after the hang-up
        if s2 != s1 + 1 or r2 != r1 + 1:
            continue
        sent_gap = sent[s2][0] - sent[s1][0]
        if sent_gap < BUNCH_MIN_GAP_NS:
            continue
        gaps += 1
        got_gap = received[r2][0] - received[r1][0]
        if got_gap <= sent_gap * BUNCH_RATIO and sent_gap - got_gap >= BUNCH_MIN_HOLD_NS:
            bunched += 1
    return bunched, gaps


def compare_events(sent_side: Sequence[Sequence[Any]], received_side: Sequence[Sequence[Any]], *,
                   client_left: bool = False, hung_up_at: int | None = None) -> Diff:
    """What happened between one stream's sent events and its received ones (tap ``[t_ns, kind, digest]``
    lists). ``client_left``: the receiving side's client went away, so a missing tail is no drop;
    ``hung_up_at``: when it did (ns), so bunching is judged on what was received by then. Pure."""
    sent, sent_comments = _events(sent_side)
    received, received_comments = _events(received_side)
    matches, foreign, duplicates = _match(sent, received)
    anchors = _in_order(matches)
    matched = {si for si, _ in matches}
    missing = [i for i in range(len(sent)) if i not in matched]
    diff = Diff(comments=(sent_comments, received_comments))
    diff.kinds.update(_regions(anchors, missing, foreign, client_left))
    diff.kinds["added"] += duplicates
    diff.kinds["reordered"] += len(matches) - len(anchors)
    sent_kinds = {k for _, k, _ in sent}
    got_kinds = {k for _, k, _ in received}
    if not client_left:
        diff.kinds["usage_lost"] += int("usage" in sent_kinds and "usage" not in got_kinds)
        diff.kinds["done_lost"] += int("done" in sent_kinds and "done" not in got_kinds)
    diff.latencies_ns = [received[j][0] - sent[i][0] for i, j in matches]
    diff.bunched, diff.gaps = _bunching(sent, received, anchors, hung_up_at)
    if diff.gaps >= BUNCH_MIN_GAPS and 2 * diff.bunched >= diff.gaps:
        diff.kinds["buffered"] += diff.bunched
    diff.kinds = +diff.kinds
    return diff


def _encoded(headers: dict[str, str]) -> bool:
    return headers.get("content-encoding", "").strip().lower() not in ("", "identity")


def _heads(diff: Diff, sent_headers: dict[str, str], got_headers: dict[str, str], sent_status: int | None,
           got_status: int | None) -> None:
    """The response heads' part: an encoding introduced, the event-stream type lost, the status changed."""
    if _encoded(got_headers) and not _encoded(sent_headers):
        diff.kinds["encoding"] += 1
    if ("text/event-stream" in sent_headers.get("content-type", "")
            and "content-type" in got_headers and "text/event-stream" not in got_headers["content-type"]):
        diff.kinds["content_type"] += 1
    if got_status is not None and got_status != sent_status:
        diff.kinds["status"] += 1


def _client_left(tap: TapRecord) -> bool:
    return tap.t_client_gone is not None or tap.down_end == "client_gone"


def _hung_up_at(tap: TapRecord, hung_up: dict[str, int]) -> int | None:
    """The earliest stamp of the client leaving: the load's hang-up, or ``tap``'s hop noticing it."""
    stamps = [t for t in (hung_up.get(tap.request_id or ""), tap.t_client_gone) if t is not None]
    return min(stamps) if stamps else None


# -- the verdict ------------------------------------------------------------------------------------


@dataclass
class _Judged:
    """The streams compared, and what could not be."""

    streams: list[tuple[str, Diff]] = field(default_factory=list)  # (request id or hop#seq, diff)
    counts: Counter[str] = field(default_factory=Counter)


def _stream_id(tap: TapRecord) -> str:
    return tap.request_id or f"{tap.hop}#{tap.seq}"


def _compare_pair(outer: TapRecord, inner: TapRecord, hung_up: dict[str, int]) -> Diff:
    left = _client_left(outer) or outer.up_end == "closed" or outer.request_id in hung_up
    diff = compare_events(inner.down, outer.up, client_left=left, hung_up_at=_hung_up_at(outer, hung_up))
    _heads(diff, inner.headers_down, outer.headers_up, inner.status_down, outer.status_up)
    return diff


def _compare_own(tap: TapRecord, hung_up: dict[str, int]) -> Diff:
    diff = compare_events(tap.up, tap.down, client_left=_client_left(tap) or tap.request_id in hung_up,
                          hung_up_at=_hung_up_at(tap, hung_up))
    # a hop that answered itself (a status fault) forwarded nothing: its own answer is the change
    sent_status = tap.status_up if tap.status_up is not None or tap.up_end != "none" else None
    _heads(diff, tap.headers_up, tap.headers_down, sent_status, tap.status_down)
    return diff


def _capped(outer: TapRecord, inner: TapRecord, *, own: bool) -> bool:
    """A compared side reached the hop's event cap: the lists are not the whole stream."""
    return bool(inner.dropped_up or inner.dropped_down) if own else bool(inner.dropped_down or outer.dropped_up)


def _judge_streams(obs: Observations, phase: str | None, sides: _Sides) -> _Judged:
    belongs = tap_in_phase(obs, phase)
    hung_up = {st.id: st.hangup.t for st in obs.streams if st.hangup is not None}
    out = _Judged()
    if sides.outer is None:
        pairs = [(tap, tap) for tap in obs.taps_at(sides.inner) if belongs(tap)]
    else:
        outer = [t for t in obs.taps_at(sides.outer) if belongs(t)]
        pairs, counts = pair_taps(outer, obs.taps_at(sides.inner))
        out.counts.update(counts)
    for outer_tap, inner_tap in sorted(pairs, key=lambda p: p[0].t_accept):
        if _capped(outer_tap, inner_tap, own=sides.outer is None):
            out.counts["capped"] += 1
            continue
        diff = (_compare_own(outer_tap, hung_up) if sides.outer is None
                else _compare_pair(outer_tap, inner_tap, hung_up))
        out.counts["client_left"] += int(_client_left(outer_tap))
        out.streams.append((_stream_id(outer_tap), diff))
    return out


def _latency_ms(diffs: Sequence[Diff]) -> dict[str, Any]:
    values = np.asarray([v for d in diffs for v in d.latencies_ns], dtype=float) / 1e6
    if not len(values):
        return {"events": 0}
    return {"events": int(len(values)), "p50": round(float(np.quantile(values, 0.5)), 4),
            "p99": round(float(np.quantile(values, 0.99)), 4), "max": round(float(values.max()), 4)}


def _evidence(sides: _Sides, judged: _Judged) -> dict[str, Any]:
    by_kind: dict[str, Any] = {}
    for kind in KINDS:
        hit = [(sid, d.kinds[kind]) for sid, d in judged.streams if d.kinds[kind]]
        if hit:
            by_kind[kind] = {"streams": len(hit), "events": sum(n for _, n in hit),
                             "request_ids": [sid for sid, _ in hit[:MAX_IDS]]}
    diffs = [d for _, d in judged.streams]
    return {
        "compared": sides.shown,
        "streams": len(diffs),
        "altered_streams": sum(1 for d in diffs if d.altered),
        "by_kind": by_kind,
        "added_latency_ms": _latency_ms(diffs),
        "bunched_events": sum(d.bunched for d in diffs),
        "gaps_examined": sum(d.gaps for d in diffs),  # upstream gaps of 2 ms or more, checked for bunching
        "comments": {"sent": sum(d.comments[0] for d in diffs), "received": sum(d.comments[1] for d in diffs)},
        **{k: v for k, v in sorted(judged.counts.items()) if v},
    }


@verifier
@dataclass(frozen=True, kw_only=True)
class Relay(SlaSpec):
    """The share of streams a hop altered (dropped, added, merged, reordered, changed, buffered) within ``budget``."""

    kind = "relay"
    summary = ("share of streams a hop of the path altered (events dropped, added, merged, reordered, changed; "
               "usage or [DONE] lost; gzip or buffering introduced), from the stream hops' taps")
    schema = SCHEMA
    timing = False  # the hops' own stamps: a late load generator changes none of them
    better = "lower"
    capacity_fit = True
    needs = ()  # the stream hops' taps, nothing of the engine
    sample_label = None  # 0/1 outcomes: nothing to draw

    over: str
    budget: float
    min_samples: int

    def samples(self, obs: Observations, phase: str | None) -> list[float] | None:
        """1.0 per stream the hop altered, 0.0 per stream it relayed intact, in arrival order."""
        sides = _sides(obs, self.over) if self.over else "no hop named"
        if isinstance(sides, str):
            return []
        return [1.0 if d.altered else 0.0 for _, d in _judge_streams(obs, phase, sides).streams]

    def budget_rule(self) -> BudgetRule:
        return BudgetRule.policy("a ceiling on streams a hop may alter is a policy, not a measurement")

    def probe_halt(self, window_s: float, factor: float, min_streams: int) -> HaltSpec | None:
        return None

    def judge(self, obs: Observations, phase: str | None) -> Verdict:
        evidence: dict[str, Any] = {"over": self.over}

        def verdict(status: Status, figure: float | None, samples: int, reason: str = "") -> Verdict:
            if reason:
                evidence["reason"] = reason
            return Verdict(self.kind, phase, status, figure, self.budget, "fraction", samples, evidence)

        if not obs.taps:
            return verdict("inconclusive", None, 0, "no taps were recorded: the path has no stream hop with "
                           "`tap: true`, or the run recorded none")
        sides = _sides(obs, self.over)
        if isinstance(sides, str):
            return verdict("inconclusive", None, 0, sides)
        judged = _judge_streams(obs, phase, sides)
        evidence.update(_evidence(sides, judged))
        n = len(judged.streams)
        if n < self.min_samples:
            return verdict("inconclusive", None, n, f"{n} stream(s) compared across {sides.shown}, at least "
                           f"{self.min_samples} needed")
        share = evidence["altered_streams"] / n
        if share > self.budget and share < SCATTERED_SHARE and set(evidence["by_kind"]) == {"buffered"}:
            host = saturated_host(obs, phase)
            if host is not None:
                evidence["saturated_host"] = host
                evidence["inconclusive_cause"] = HOST_SATURATED
                return verdict("inconclusive", share, n, (
                    f"{evidence['altered_streams']} of {n} streams came out of {sides.shown} with their "
                    f"events bunched and nothing else altered, on a saturated host ({host['busy_cores']:.2f} of "
                    f"{host['cpus']} cores busy), where a starved hop bunches a few streams too; a buffer holds "
                    f"every stream it relays: rerun on a host with CPU to spare"))
        return verdict("pass" if share <= self.budget else "fail", share, n)
