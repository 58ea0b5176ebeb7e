"""`abort_path` on synthetic taps: after a client hang-up, how long each hop kept its upstream open; a
gateway that kept generating for a departed client fails with the time it held on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import sla
from chaos.model.observations import Observations, StreamRecord, TapRecord

pytestmark = pytest.mark.timeout(30)

S = 1_000_000_000
MS = 1_000_000
PATH_HOPS = [{"name": "edge", "kind": "stream"}, {"name": "gw", "kind": "litellm"}, {"name": "core", "kind": "stream"}]


def at(synth: Any, seconds: float | None) -> int | None:
    return None if seconds is None else int(synth.ns(seconds))


def tap(synth: Any, hop: str, rid: str | None, *, accept: float, gone: float | None, closed: float | None,
        end: float | None = None) -> TapRecord:
    return TapRecord(hop=hop, seq=1, request_id=rid, target="/v1/completions", t_accept=at(synth, accept) or 0,
                     t_upstream_open=at(synth, accept + 0.001), t_client_gone=at(synth, gone),
                     t_upstream_closed=at(synth, closed), t_end=at(synth, end if end is not None else gone),
                     up_end="closed" if gone is not None else "done",
                     down_end="client_gone" if gone is not None else "done")


def hung_up(synth: Any, rid: str, *, sent: float = 0.0, after: float = 1.0, tokens: int = 100) -> StreamRecord:
    stream: StreamRecord = synth.stream(rid, sent=sent, tokens=tokens, itl=0.02, hangup_after=after)
    return stream


def chain(synth: Any, rid: str, hangup: float, *, gw_lets_go_after: float | None, stream_end: float = 10.0,
          notice: float = 0.0005, core_id: str | None = "same") -> list[TapRecord]:
    """The edge hop sees the client leave and closes toward the gateway; the gateway lets go of the core
    hop after ``gw_lets_go_after`` s (None: never, the stream runs on to ``stream_end``). ``core_id``: the
    request id the core hop saw ("same": the client's; None: the gateway did not forward it)."""
    edge_closed = hangup + notice + 0.0003
    edge = tap(synth, "edge", rid, accept=hangup - 1.0, gone=hangup + notice, closed=edge_closed)
    inner_rid = rid if core_id == "same" else core_id
    if gw_lets_go_after is None:
        core = tap(synth, "core", inner_rid, accept=hangup - 0.999, gone=None, closed=stream_end, end=stream_end)
    else:
        gone = edge_closed + gw_lets_go_after
        core = tap(synth, "core", inner_rid, accept=hangup - 0.999, gone=gone, closed=gone + 0.0002)
    return [edge, core]


def observed(synth: Any, streams: list[StreamRecord], taps: list[TapRecord], *, path: bool = True,
             metrics: Sequence[Any] = ()) -> Observations:
    obs: Observations = synth.obs(streams, metrics=list(metrics),
                                  notes=[synth.note("path", 0.0, hops=PATH_HOPS)] if path else [])
    obs.taps = taps
    return obs


def test_a_path_that_lets_go_at_once_passes_with_its_figures_per_hop(synth: Any) -> None:
    streams = [hung_up(synth, f"h{i}", sent=i * 0.1) for i in range(4)] + [synth.stream("ok", sent=0.5)]
    taps = [t for i in range(4) for t in chain(synth, f"h{i}", i * 0.1 + 1.0, gw_lets_go_after=0.002)]
    verdict = sla.judge(observed(synth, streams, taps), "abort_path", {"budget": "500ms"})
    assert verdict.status == "pass", verdict.evidence
    assert verdict.samples == 4 and verdict.unit == "s" and verdict.budget == 0.5
    assert verdict.figure == pytest.approx(0.002, abs=1e-6)
    hops = {h["hop"]: h for h in verdict.evidence["hops"]}
    assert list(hops) == ["edge", "gw", "core"]  # load side first
    assert hops["gw"]["kind"] == "gateway" and hops["gw"]["max_s"] == pytest.approx(0.002, abs=1e-6)
    assert hops["edge"]["max_s"] == pytest.approx(0.0008, abs=1e-6)  # noticed and closed, from the hang-up
    assert hops["core"]["max_s"] == pytest.approx(0.0002, abs=1e-6)
    assert verdict.evidence["hangup_to_upstream_closed"]["core"]["max_s"] == pytest.approx(0.0030, abs=1e-6)


def test_a_gateway_that_keeps_the_upstream_stream_open_fails_with_the_time_it_held(synth: Any) -> None:
    streams = [hung_up(synth, "h0"), hung_up(synth, "h1", sent=0.2)]
    taps = (chain(synth, "h0", 1.0, gw_lets_go_after=0.001)
            + chain(synth, "h1", 1.2, gw_lets_go_after=None, stream_end=4.2))  # generated on for 3 s
    verdict = sla.judge(observed(synth, streams, taps), "abort_path", {"budget": "1s"})
    assert verdict.status == "fail"
    assert verdict.figure == pytest.approx(4.2 - 1.2008, abs=1e-6)
    worst = verdict.evidence["worst"]
    assert worst["hop"] == "gw" and worst["request_id"] == "h1" and worst["until_end"] is True
    gw = next(h for h in verdict.evidence["hops"] if h["hop"] == "gw")
    assert gw["over_budget"] == 1 and gw["request_ids"] == ["h1"] and gw["until_end"] == 1
    # a budget longer than the hold passes: the figure is the hold, not a yes/no
    assert sla.judge(observed(synth, streams, taps), "abort_path", {"budget": "5s"}).status == "pass"


def test_a_late_let_go_is_a_hold_too(synth: Any) -> None:
    streams = [hung_up(synth, "h0")]
    verdict = sla.judge(observed(synth, streams, chain(synth, "h0", 1.0, gw_lets_go_after=2.5)), "abort_path", {})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(2.5, abs=1e-6)
    assert verdict.evidence["worst"]["until_end"] is False


def test_the_window_before_the_first_token_is_reported_on_its_own(synth: Any) -> None:
    queued = synth.stream("q", sent=0.0, ttft=2.0, hangup_after=0.5)  # hung up during prefill
    assert queued.t_first_content is None
    taps = chain(synth, "q", 0.5, gw_lets_go_after=1.5)
    verdict = sla.judge(observed(synth, [queued], taps), "abort_path", {"budget": "1s"})
    assert verdict.status == "fail" and verdict.evidence["before_first_token"] == 1
    gw = next(h for h in verdict.evidence["hops"] if h["hop"] == "gw")
    assert gw["before_first_token"]["max_s"] == pytest.approx(1.5, abs=1e-6)
    assert gw["after_first_token"] == {"n": 0}
    assert verdict.evidence["worst"]["before_first_token"] is True


# -- a gateway that does not forward X-Request-Id (LiteLLM without forward_client_headers_to_llm_api) -------


def test_taps_behind_a_gateway_that_drops_the_request_id_are_paired_in_arrival_order(synth: Any) -> None:
    """Every core tap without a request id: the gateway's hold is still measured, so a gateway that keeps
    its upstream open 3 s fails (not a pass judged on the edge hop alone), and one that lets go passes
    with its own figures."""
    streams = [hung_up(synth, f"h{i}", sent=i * 0.1) for i in range(3)]
    holding = [t for i in range(3) for t in chain(synth, f"h{i}", i * 0.1 + 1.0,
                                                       gw_lets_go_after=3.0 if i == 1 else 0.002, core_id=None)]
    verdict = sla.judge(observed(synth, streams, holding), "abort_path", {"budget": "1s"})
    assert verdict.status == "fail", verdict.evidence
    assert verdict.figure == pytest.approx(3.0, abs=1e-6)
    assert verdict.evidence["worst"]["hop"] == "gw" and verdict.evidence["worst"]["request_id"] == "h1"
    assert verdict.evidence["paired_by_order"] == {"core": 3}

    letting_go = [t for i in range(3) for t in chain(synth, f"h{i}", i * 0.1 + 1.0, gw_lets_go_after=0.002,
                                                          core_id=None)]
    verdict = sla.judge(observed(synth, streams, letting_go), "abort_path", {"budget": "1s"})
    assert verdict.status == "pass", verdict.evidence
    hops = {h["hop"]: h for h in verdict.evidence["hops"]}
    assert list(hops) == ["edge", "gw", "core"] and hops["gw"]["n"] == 3
    assert hops["gw"]["max_s"] == pytest.approx(0.002, abs=1e-6) and "unmeasured" not in verdict.evidence


def test_a_hop_whose_taps_cannot_be_paired_is_unmeasured_and_never_passes(synth: Any) -> None:
    """Three hung-up streams, core taps without ids for two of them: arrival order pairs those two and
    leaves the third over, so the gateway and the core hop are unmeasured for it. The two measured holds
    are within the budget, yet the verdict is inconclusive, with the count; a measured hold over the
    budget still fails."""
    streams = [hung_up(synth, f"h{i}", sent=i * 0.1) for i in range(3)]

    def taps(first_gw_hold: float) -> list[TapRecord]:
        out = [t for i in range(3) for t in chain(synth, f"h{i}", i * 0.1 + 1.0,
                                                   gw_lets_go_after=first_gw_hold if i == 0 else 0.002, core_id=None)]
        return [t for t in out if not (t.hop == "core" and t.t_accept == at(synth, 2 * 0.1 + 0.001))]

    verdict = sla.judge(observed(synth, streams, taps(0.002)), "abort_path", {"budget": "1s"})
    assert verdict.status == "inconclusive" and verdict.figure is None, verdict.evidence
    assert verdict.evidence["reason"].startswith("hops not measured for some hung-up streams")
    assert verdict.evidence["unmeasured"] == {"gw": 1, "core": 1}
    hops = {h["hop"]: h for h in verdict.evidence["hops"]}
    assert hops["gw"]["n"] == 2 and hops["gw"]["unmeasured"] == 1 and hops["gw"]["unmeasured_ids"] == ["h2"]
    assert hops["core"]["unmeasured"] == 1 and "unmeasured" not in hops["edge"]

    held = sla.judge(observed(synth, streams, taps(2.0)), "abort_path", {"budget": "1s"})
    assert held.status == "fail" and held.evidence["worst"]["request_id"] == "h0", held.evidence


def test_a_stream_that_never_reached_the_next_hop_leaves_nothing_unmeasured(synth: Any) -> None:
    """Every core tap bears its request id and none is h2's: h2 never got past the gateway, which held
    nothing behind for it."""
    streams = [hung_up(synth, f"h{i}", sent=i * 0.1) for i in range(3)]
    taps = [t for i in range(3) for t in chain(synth, f"h{i}", i * 0.1 + 1.0, gw_lets_go_after=0.002)
            if not (t.hop == "core" and t.request_id == "h2")]
    verdict = sla.judge(observed(synth, streams, taps), "abort_path", {"budget": "1s"})
    assert verdict.status == "pass", verdict.evidence
    assert verdict.evidence["not_forwarded"] == 1 and "unmeasured" not in verdict.evidence


def test_without_a_path_note_the_hops_are_ordered_by_arrival(synth: Any) -> None:
    taps = chain(synth, "h0", 1.0, gw_lets_go_after=2.0)
    verdict = sla.judge(observed(synth, [hung_up(synth, "h0")], taps[::-1], path=False), "abort_path", {})
    assert verdict.status == "fail"
    assert verdict.evidence["worst"]["hop"] == "between edge and core"


def test_the_engines_gauges_are_evidence_after_each_hangup(synth: Any) -> None:
    running = synth.steps("vllm:num_requests_running", 0.0, 3.0, 0.25, lambda t: 1 if t < 1.5 else 0)
    taps = chain(synth, "h0", 1.0, gw_lets_go_after=0.001)
    verdict = sla.judge(observed(synth, [hung_up(synth, "h0")], taps, metrics=running), "abort_path", {})
    assert verdict.status == "pass"
    engine = verdict.evidence["engine"]["running_drop"]
    assert engine["series"] == "vllm:num_requests_running" and engine["max_s"] == pytest.approx(0.5)


@pytest.mark.parametrize(("case", "reason"), [
    ("no_hangup", "no client hung up"),
    ("no_taps", "no taps were recorded"),
    ("unseen", "0 hung-up stream(s) seen at a stream hop"),
])
def test_without_hangups_or_taps_it_is_inconclusive(synth: Any, case: str, reason: str) -> None:
    streams = [synth.stream("ok")] if case == "no_hangup" else [hung_up(synth, "h0")]
    taps = {"no_hangup": chain(synth, "ok", 1.0, gw_lets_go_after=0.001), "no_taps": [],
            "unseen": chain(synth, "other", 1.0, gw_lets_go_after=5.0)}[case]
    verdict = sla.judge(observed(synth, streams, taps), "abort_path", {})
    assert verdict.status == "inconclusive" and verdict.figure is None
    assert verdict.evidence["reason"].startswith(reason), verdict.evidence["reason"]


def test_samples_are_each_hung_up_streams_longest_hold(synth: Any) -> None:
    streams = [hung_up(synth, "h0"), hung_up(synth, "h1", sent=0.2)]
    taps = chain(synth, "h0", 1.0, gw_lets_go_after=0.25) + chain(synth, "h1", 1.2, gw_lets_go_after=0.5)
    spec = sla.spec_for("abort_path", {})
    assert spec.samples(observed(synth, streams, taps), None) == pytest.approx([0.25, 0.5], abs=1e-6)


def test_a_hold_over_budget_names_the_request_as_sent_beside_its_record_id(synth: Any) -> None:
    """Taps read back from the load's UUID-shaped ids (``chaos.model.request_ids``) keep the id as sent: the
    evidence gives it beside the record id, for a gateway's log."""
    from dataclasses import replace

    from chaos.model.request_ids import wire_id

    wire = wire_id("0-1", 0x1A2B3C4D)
    streams = [hung_up(synth, "0-1")]
    taps = [replace(t, wire_id=wire) for t in chain(synth, "0-1", 1.0, gw_lets_go_after=None, stream_end=4.0)]
    verdict = sla.judge(observed(synth, streams, taps), "abort_path", {"budget": "1s"})
    assert verdict.status == "fail", verdict.evidence
    assert verdict.evidence["worst"]["request_id"] == "0-1" and verdict.evidence["worst"]["wire_id"] == wire
    gw = next(h for h in verdict.evidence["hops"] if h["hop"] == "gw")
    assert gw["request_ids"] == ["0-1"] and gw["wire_ids"] == [wire]
