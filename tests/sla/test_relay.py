"""`relay` on synthetic taps: what a gateway between two stream hops (or a stream hop itself) did to
each stream, one test per kind of alteration, with its intact counterpart passing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import sla
from chaos.model.observations import Note, Observations, TapRecord
from sla.relay import compare_events, pair_taps

pytestmark = pytest.mark.timeout(30)

S = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * S
PATH = Note("path", T0, {"hops": [{"name": "edge", "kind": "stream"}, {"name": "gw", "kind": "nginx"},
                                  {"name": "core", "kind": "stream"}]})
SSE = {"content-type": "text/event-stream"}


def events(n: int = 6, *, start_ms: float = 100.0, gap_ms: float = 20.0, lag_ms: float = 0.0,
           tag: str = "r") -> list[list[Any]]:
    """``n`` data events then a usage record and [DONE], ``gap_ms`` apart, shifted by ``lag_ms``."""
    kinds = ["data"] * n + ["usage", "done"]
    return [[T0 + round((start_ms + lag_ms + i * gap_ms) * MS), kind, f"{tag}-{i}"] for i, kind in enumerate(kinds)]


def tap(hop: str, rid: str | None, seq: int, *, up: Sequence[list[Any]] = (), down: Sequence[list[Any]] = (),
        accept_ms: float = 0.0, **extra: Any) -> TapRecord:
    fields: dict[str, Any] = {"status_up": 200, "status_down": 200, "headers_up": dict(SSE),
                              "headers_down": dict(SSE), "up_end": "done", "down_end": "done"}
    fields.update(extra)
    return TapRecord(hop=hop, seq=seq, request_id=rid, target="/v1/completions",
                     t_accept=T0 + round(accept_ms * MS), up=list(up), down=list(down), **fields)


def across(sent: list[list[Any]], received: list[list[Any]], rid: str, seq: int, *,
           outer: dict[str, Any] | None = None, inner: dict[str, Any] | None = None,
           inner_id: str | None = "same") -> list[TapRecord]:
    """One request's two taps around the gateway: ``sent`` left the core hop, ``received`` reached the edge."""
    return [tap("edge", rid, seq, up=received, down=received, accept_ms=seq * 10.0, **(outer or {})),
            tap("core", rid if inner_id == "same" else inner_id, seq, up=sent, down=sent,
                accept_ms=seq * 10.0 + 1, **(inner or {}))]


def run(taps: Sequence[TapRecord], notes: Sequence[Note] = (PATH,)) -> Observations:
    return Observations(experiment="synthetic", t0=T0, taps=list(taps), notes=list(notes))


def intact(n_streams: int = 5) -> list[TapRecord]:
    out: list[TapRecord] = []
    for i in range(n_streams):
        out += across(events(tag=f"s{i}"), events(tag=f"s{i}", lag_ms=0.3), f"s{i}", i + 1)
    return out


def test_a_gateway_that_relays_every_event_passes_with_its_added_latency() -> None:
    verdict = sla.judge(run(intact()), "relay", {"over": "gw"})
    assert verdict.status == "pass" and verdict.figure == 0.0 and verdict.samples == 5, verdict.evidence
    assert verdict.evidence["compared"].startswith("core (down) to edge (up), across gw")
    assert verdict.evidence["by_kind"] == {}
    latency = verdict.evidence["added_latency_ms"]
    assert latency["events"] == 40 and latency["p50"] == pytest.approx(0.3) and latency["p99"] == pytest.approx(0.3)


def test_a_gateway_that_drops_events_fails_naming_the_streams() -> None:
    taps = intact(4)
    broken = events(tag="x", lag_ms=0.3)
    del broken[2:4]
    taps += across(events(tag="x"), broken, "x", 9)
    verdict = sla.judge(run(taps), "relay", {"over": "gw"})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(1 / 5)
    assert verdict.evidence["by_kind"] == {"dropped": {"streams": 1, "events": 2, "request_ids": ["x"]}}
    # within a budget of a fifth of the streams it passes
    assert sla.judge(run(taps), "relay", {"over": "gw", "budget": 0.2}).status == "pass"


def test_gzip_with_buffering_is_an_encoding_introduced_and_a_buffered_stream() -> None:
    """nginx `gzip on` for text/event-stream: the edge hop undoes the gzip, so every event is intact, but
    it arrives compressed and all at once, after the last one was sent."""
    sent = events(tag="g")
    received = [[T0 + 400 * MS + i * 1000, kind, digest] for i, (_, kind, digest) in enumerate(sent)]
    taps = across(sent, received, "g", 1, outer={"headers_up": {**SSE, "content-encoding": "gzip"}})
    verdict = sla.judge(run(taps), "relay", {"over": "gw"})
    assert verdict.status == "fail", verdict.evidence
    assert set(verdict.evidence["by_kind"]) == {"encoding", "buffered"}
    assert verdict.evidence["bunched_events"] == verdict.evidence["gaps_examined"] == 7


def at_ms(sent: list[list[Any]], received_ms: Sequence[float]) -> list[list[Any]]:
    """``sent``'s events received at the given times (ms after T0)."""
    return [[T0 + round(t * MS), kind, digest] for t, (_, kind, digest) in zip(received_ms, sent, strict=True)]


def test_buffering_needs_four_collapsed_gaps_holding_5ms_each() -> None:
    """The true positive at its floor: four 10 ms gaps arriving together is a buffered stream."""
    sent = events(3, gap_ms=10.0, tag="b")  # 3 data events, usage, [DONE]: 4 gaps of 10 ms
    diff = compare_events(sent, at_ms(sent, [141.0 + i * 0.01 for i in range(5)]))
    assert dict(diff.kinds) == {"buffered": 4} and (diff.bunched, diff.gaps) == (4, 4)


@pytest.mark.parametrize("case", ["three_gaps", "jitter"])
def test_too_little_evidence_of_bunching_is_no_buffering(case: str) -> None:
    """A short stream whose three gaps all collapse is too little to tell a buffer from a busy host; and a
    3 ms gap arriving 0.2 ms apart (every other one: a reader woken late) held nothing back 5 ms."""
    if case == "three_gaps":
        sent = events(2, gap_ms=20.0, tag="t")
        got = at_ms(sent, [160.5 + i * 0.01 for i in range(4)])
    else:
        sent = events(6, gap_ms=3.0, tag="j")
        got = at_ms(sent, [100.3 + (i // 2) * 6.0 + (i % 2) * 0.2 for i in range(8)])
    diff = compare_events(sent, got)
    assert not diff.altered, diff.kinds
    assert diff.bunched == (3 if case == "three_gaps" else 0)


def test_a_hung_up_stream_is_judged_on_what_arrived_before_the_hang_up() -> None:
    """The client left 150 ms in: the events the edge hop read after that came out of its socket at once.
    Up to the hang-up they came as sent: no buffering. The same bunch before a hang-up is buffering."""
    sent = events(6, gap_ms=20.0, tag="h")
    received = at_ms(sent, [100.3, 120.3, 140.3] + [151.0 + i * 0.01 for i in range(5)])
    gone = {"t_client_gone": T0 + 150 * MS, "down_end": "client_gone", "up_end": "closed"}
    verdict = sla.judge(run(intact(2) + across(sent, received, "h", 5, outer=gone)), "relay", {"over": "gw"})
    assert verdict.status == "pass" and verdict.evidence["by_kind"] == {}, verdict.evidence
    late = at_ms(sent, [100.3] + [151.0 + i * 0.01 for i in range(7)])
    whole = sla.judge(run(intact(2) + across(sent, late, "h", 5)), "relay", {"over": "gw"})
    assert whole.status == "fail" and whole.evidence["by_kind"]["buffered"]["request_ids"] == ["h"]


@pytest.mark.parametrize(("edit", "kind", "count"), [
    ("merge", "merged", 1),
    ("swap", "reordered", 1),
    ("repeat", "added", 1),
    ("change", "altered", 1),
    ("lose_usage", "usage_lost", 1),
    ("foreign", "added", 1),
])
def test_each_kind_of_alteration_is_named(edit: str, kind: str, count: int) -> None:
    sent = events(tag="k")
    got = events(tag="k", lag_ms=0.5)
    if edit == "merge":  # events 1 and 2 arrive as one event nobody sent
        got[1:3] = [[got[2][0], "data", "k-merged"]]
    elif edit == "swap":
        got[2], got[3] = [got[2][0], "data", "k-3"], [got[3][0], "data", "k-2"]
    elif edit == "repeat":
        got.insert(3, [got[2][0] + 1000, "data", "k-2"])
    elif edit == "change":
        got[4] = [got[4][0], "data", "k-4-changed"]
    elif edit == "lose_usage":
        del got[6]
    elif edit == "foreign":
        got.insert(1, [got[0][0] + 1000, "data", "injected"])
    verdict = sla.judge(run(across(sent, got, "k", 1)), "relay", {"over": "gw"})
    assert verdict.status == "fail"
    assert verdict.evidence["by_kind"][kind]["events"] == count, verdict.evidence["by_kind"]
    assert verdict.evidence["by_kind"][kind]["request_ids"] == ["k"]


def test_done_lost_is_named_and_a_status_the_gateway_made_up_too() -> None:
    got = events(tag="d", lag_ms=0.2)[:-1]
    cut = across(events(tag="d"), got, "d", 1, outer={"up_end": "bare_eof"})
    answered = across(events(tag="e"), [], "e", 2, outer={"status_up": 504, "up_end": "eof"})
    verdict = sla.judge(run(cut + answered), "relay", {"over": "gw"})
    kinds = verdict.evidence["by_kind"]
    assert kinds["done_lost"]["request_ids"] == ["d", "e"] and kinds["status"]["request_ids"] == ["e"]
    assert verdict.figure == 1.0


def test_a_client_that_left_is_judged_on_what_it_received() -> None:
    """The edge's client hung up after three events: the events still in the gateway when it did are not
    drops, and no [DONE] was owed."""
    got = events(tag="h", lag_ms=0.2)[:3]
    taps = intact(2) + across(events(tag="h"), got, "h", 5,
                              outer={"t_client_gone": T0 + 150 * MS, "down_end": "client_gone"})
    verdict = sla.judge(run(taps), "relay", {"over": "gw"})
    assert verdict.status == "pass", verdict.evidence
    assert verdict.evidence["client_left"] == 1


def test_requests_whose_id_the_gateway_dropped_are_paired_in_order() -> None:
    taps: list[TapRecord] = []
    for i in range(3):
        taps += across(events(tag=f"o{i}"), events(tag=f"o{i}", lag_ms=0.4), f"o{i}", i + 1, inner_id=None)
    verdict = sla.judge(run(taps), "relay", {"over": "gw"})
    assert verdict.status == "pass" and verdict.samples == 3
    assert verdict.evidence["paired_by_order"] == 3


def test_pairing_takes_a_retried_requests_last_attempt() -> None:
    outer = [tap("edge", "a", 1, accept_ms=0)]
    inner = [tap("core", "a", 1, accept_ms=1), tap("core", "a", 2, accept_ms=5)]
    pairs, counts = pair_taps(outer, inner)
    assert pairs == [(outer[0], inner[1])] and counts["retried"] == 1 and counts["unpaired_inner"] == 0


def test_over_a_stream_hop_compares_its_own_two_sides() -> None:
    """A stream.drop at the hop: its down lacks events its up had. Keep-alive comments it wrote are not
    alterations."""
    up = events(tag="o")
    dropped = [e for i, e in enumerate(events(tag="o", lag_ms=0.1)) if i not in (1, 4)]
    kept = [[T0 + 50 * MS, "comment", "ka"]] + events(tag="o", lag_ms=0.1)
    obs = run([tap("edge", "a", 1, up=up, down=dropped, faults=["drop-1"]),
               tap("edge", "b", 2, up=up, down=kept)])
    verdict = sla.judge(obs, "relay", {"over": "edge"})
    assert verdict.status == "fail" and verdict.figure == 0.5
    assert verdict.evidence["by_kind"] == {"dropped": {"streams": 1, "events": 2, "request_ids": ["a"]}}
    assert verdict.evidence["comments"] == {"sent": 0, "received": 1}
    # without a path note, a hop that left taps is judged on its own sides too
    assert sla.judge(run(obs.taps, notes=()), "relay", {"over": "edge"}).figure == 0.5


def test_a_stream_hop_that_answered_itself_changed_the_status() -> None:
    answered = tap("edge", "a", 1, up=[], down=[], status_up=None, status_down=429, up_end="none", down_end="status")
    verdict = sla.judge(run([answered]), "relay", {"over": "edge"})
    assert verdict.status == "fail" and verdict.evidence["by_kind"]["status"]["request_ids"] == ["a"]


def test_streams_of_other_phases_are_left_out(synth: Any) -> None:
    obs = run(intact(2) + across(events(tag="z"), [], "z", 9))
    obs.streams = [synth.stream("s0", phase="load"), synth.stream("s1", phase="load"),
                   synth.stream("z", phase="warmup")]
    assert sla.judge(obs, "relay", {"over": "gw"}, phase="load").status == "pass"
    assert sla.judge(obs, "relay", {"over": "gw"}, phase="warmup").status == "fail"


@pytest.mark.parametrize(("taps", "notes", "over", "reason"), [
    ([], (PATH,), "gw", "no taps were recorded"),
    (intact(1), (Note("path", T0, {"hops": [{"name": "gw", "kind": "nginx"}, {"name": "core", "kind": "stream"}]}),),
     "gw", "no stream hop between 'gw' and the load"),
    (intact(1), (PATH,), "nope", "'nope' is not a hop of the path"),
    (intact(1), (), "gw", "the run recorded no path"),
])
def test_without_taps_on_both_sides_it_is_inconclusive(taps: list[TapRecord], notes: tuple[Note, ...], over: str,
                                                         reason: str) -> None:
    verdict = sla.judge(run(taps, notes), "relay", {"over": over})
    assert verdict.status == "inconclusive" and verdict.figure is None
    assert verdict.evidence["reason"].startswith(reason), verdict.evidence["reason"]


def test_too_few_paired_streams_is_inconclusive() -> None:
    verdict = sla.judge(run(intact(2)), "relay", {"over": "gw", "min_samples": 3})
    assert verdict.status == "inconclusive" and "2 stream(s) compared" in verdict.evidence["reason"]


def test_compare_events_classifies_regions_between_anchors() -> None:
    sent = [[i, "data", f"e{i}"] for i in range(8)]
    got = [sent[0], sent[1], [5, "data", "m"], sent[4], sent[6], sent[5], sent[7]]
    diff = compare_events(sent, got)
    assert dict(diff.kinds) == {"merged": 1, "reordered": 1}
    assert not compare_events(sent, sent).altered
    assert dict(compare_events(sent, sent[:5], client_left=True).kinds) == {}
    assert dict(compare_events(sent, sent[:5]).kinds) == {"dropped": 3}


def _host(busy_cores: float) -> dict[str, Any]:
    """A 2-core host's samples every 0.5 s over one 5 s phase, ``busy_cores`` of it busy throughout."""
    from chaos.host.contention import BUSY, CONTENTION_NOTE, NEIGHBOUR, RUN, WAIT
    from chaos.model.observations import MetricSample, PhaseWindow
    values = {BUSY: busy_cores, RUN: 0.05, NEIGHBOUR: busy_cores - 0.05, WAIT: 0.25}
    return {"metrics": [MetricSample(name, {}, value, T0 + k * S // 2) for name, value in values.items()
                        for k in range(1, 11)],
            "phases": [PhaseWindow("baseline", T0, T0 + 5 * S)],
            "notes": [PATH, Note(CONTENTION_NOTE, T0, {"cpus": 2, "period_s": 0.5, "target_processes_known": False})]}


def _bunched_stream(rid: str, seq: int) -> list[TapRecord]:
    """A stream whose 8 events, 20 ms apart, came out of the gateway together 170 ms late."""
    sent = events(tag=rid)
    return across(sent, at_ms(sent, [310.0 + i * 0.01 for i in range(len(sent))]), rid, seq)


@pytest.mark.parametrize(("busy_cores", "bunched", "dropped", "status"), [
    (2.0, 1, False, "inconclusive"),  # a starved nginx: a few streams bunched, nothing else altered
    (1.1, 1, False, "fail"),  # ... the same with CPU to spare: the hop did it
    (2.0, 1, True, "fail"),  # ... an event dropped as well: no host explains that
    (2.0, 10, False, "fail"),  # every stream bunched: a buffer, however busy the host
])
def test_a_few_bunched_streams_on_a_saturated_host_are_undecided(busy_cores: float, bunched: int, dropped: bool,
                                                                status: str) -> None:
    """Beside the suite and two busy processes (2.0 of 2 cores busy) an unbuffered nginx collapsed the gaps of 4
    of 268 streams; a buffering gateway collapses every stream's."""
    taps = intact(10 - bunched)
    for k in range(bunched):
        taps += _bunched_stream(f"b{k}", 20 + k)
    if dropped:
        broken = events(tag="x", lag_ms=0.3)
        del broken[2]
        taps += across(events(tag="x"), broken, "x", 40)
    host = _host(busy_cores)
    obs = Observations(experiment="synthetic", t0=T0, taps=taps, notes=host["notes"], metrics=host["metrics"],
                       phases=host["phases"])
    verdict = sla.judge(obs, "relay", {"over": "gw"})
    assert verdict.status == status, verdict.evidence
    assert verdict.evidence["by_kind"]["buffered"]["streams"] == bunched
    if status == "inconclusive":
        assert "saturated host (2.00 of 2 cores busy)" in verdict.evidence["reason"], verdict.evidence["reason"]
        assert verdict.figure == pytest.approx(0.1)
