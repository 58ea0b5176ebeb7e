"""`early_close` names the cause of each early close (a truncated 200 is one, whatever its status), and,
where stream hops tapped the request, where the stream was cut."""

from __future__ import annotations

from typing import Any

import pytest

import sla
from chaos.model.observations import ErrorInfo, TapRecord
from sla.early_close import close_cause

pytestmark = pytest.mark.timeout(30)

PATH_HOPS = [{"name": "edge", "kind": "stream"}, {"name": "gw", "kind": "nginx"}, {"name": "core", "kind": "stream"}]


def cut(synth: Any, rid: str, **kwargs: Any) -> Any:
    return synth.stream(rid, finish=None, done=False, **kwargs)


@pytest.mark.parametrize(("stream", "cause"), [
    ({"error": ErrorInfo("read", "peer closed connection without sending complete message body", cause="bare_eof")},
     "bare_eof"),
    ({"error": ErrorInfo("read", "ConnectionResetError: [Errno 104] Connection reset by peer", cause="reset")},
     "reset"),
    # a journal written before ErrorInfo.cause: the message tells
    ({"error": ErrorInfo("read", "peer closed connection without sending complete message body")}, "bare_eof"),
    ({"error": ErrorInfo("read", "ConnectionResetError: [Errno 104] Connection reset by peer")}, "reset"),
    ({"error": ErrorInfo("read", "server disconnected without sending a response", cause="no_response")},
     "no_response"),
    ({"error": ErrorInfo("timeout", "no complete response within the request timeout of 5s")}, "timeout"),
    ({"status": 504, "error": ErrorInfo("http", "HTTP 504", 504)}, "http_status"),
    ({"in_band": "stream cut by streamchaos", "done": True}, "error_event"),
    ({"done": True}, "done_without_finish"),  # a fake [DONE]: clean-looking, no finish reason
    ({}, "eof_without_done"),  # the body ended cleanly, no terminal event
])
def test_each_early_close_has_one_cause(synth: Any, stream: dict[str, Any], cause: str) -> None:
    st = synth.stream("x", **{"finish": None, "done": False, **stream})
    assert close_cause(st) == cause
    verdict = sla.judge(synth.obs([st, synth.stream("ok")]), "early_close", {})
    assert verdict.status == "fail"
    assert verdict.evidence["by_cause"] == {cause: 1}
    assert verdict.evidence["offenders"][0]["cause"] == cause


def test_a_truncated_200_is_an_early_close_and_complete_streams_pass(synth: Any) -> None:
    eof = ErrorInfo("read", "peer closed connection without sending complete message body", cause="bare_eof")
    streams = [synth.stream(f"ok{i}") for i in range(8)] + [cut(synth, "t0", status=200, error=eof),
                                                              cut(synth, "t1", status=200)]
    verdict = sla.judge(synth.obs(streams), "early_close", {})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(0.2)
    assert verdict.evidence["by_cause"] == {"bare_eof": 1, "eof_without_done": 1}
    clean = sla.judge(synth.obs(streams[:8]), "early_close", {})
    assert clean.status == "pass" and clean.evidence["by_cause"] == {}


def tap(synth: Any, hop: str, rid: str, accept: float, up_end: str, down_end: str, **extra: Any) -> TapRecord:
    return TapRecord(hop=hop, seq=1, request_id=rid, target="/v1/completions", t_accept=synth.ns(accept),
                     up_end=up_end, down_end=down_end, **extra)


def with_taps(synth: Any, streams: list[Any], taps: list[TapRecord]) -> Any:
    obs = synth.obs(streams, notes=[synth.note("path", 0.0, hops=PATH_HOPS)])
    obs.taps = taps
    return obs


def test_a_stream_hops_deadline_is_the_cause_and_the_clients_view_is_kept(synth: Any) -> None:
    """A clean deadline (as Envoy ends a stream): the client saw a body end without [DONE]."""
    taps = [tap(synth, "edge", "d", 0.0, "cut", "deadline", faults=["gateway-deadline"]),
            tap(synth, "core", "d", 0.001, "done", "client_gone")]
    verdict = sla.judge(with_taps(synth, [cut(synth, "d")], taps), "early_close", {})
    offender = verdict.evidence["offenders"][0]
    assert offender["cause"] == "deadline" and offender["seen_as"] == "eof_without_done"
    assert offender["cut_at"] == "at stream hop edge (rules: gateway-deadline)"
    assert verdict.evidence["by_cause"] == {"deadline": 1}


def test_a_cut_between_two_stream_hops_names_the_gateway_between(synth: Any) -> None:
    """The core hop relayed the whole stream; the edge hop received a connection closed mid-body: the
    gateway between them (nginx's proxy_read_timeout, say) cut it."""
    eof = ErrorInfo("read", "peer closed connection without sending complete message body", cause="bare_eof")
    taps = [tap(synth, "edge", "g", 0.0, "bare_eof", "bare_eof"), tap(synth, "core", "g", 0.001, "done", "done")]
    verdict = sla.judge(with_taps(synth, [cut(synth, "g", error=eof)], taps), "early_close", {})
    offender = verdict.evidence["offenders"][0]
    assert offender["cause"] == "bare_eof" and offender["cut_at"] == "between core and edge (gw)"
    assert verdict.evidence["by_cut_at"] == {"between core and edge (gw)": 1}


def test_a_cut_behind_the_innermost_hop_is_the_targets(synth: Any) -> None:
    reset = ErrorInfo("read", "ConnectionResetError: reset", cause="reset")
    taps = [tap(synth, "edge", "e", 0.0, "reset", "reset"), tap(synth, "core", "e", 0.001, "reset", "reset")]
    verdict = sla.judge(with_taps(synth, [cut(synth, "e", error=reset)], taps), "early_close", {})
    assert verdict.evidence["offenders"][0]["cut_at"] == "between the target and core"


def test_every_hop_relayed_it_whole_so_the_cut_lies_in_front(synth: Any) -> None:
    taps = [tap(synth, "edge", "f", 0.0, "done", "done"), tap(synth, "core", "f", 0.001, "done", "done")]
    verdict = sla.judge(with_taps(synth, [cut(synth, "f")], taps), "early_close", {})
    assert verdict.evidence["offenders"][0]["cut_at"] == "between edge and the load"
    assert "seen_as" not in verdict.evidence["offenders"][0]


def test_an_error_status_from_behind_the_innermost_hop_is_the_targets(synth: Any) -> None:
    taps = [tap(synth, "edge", "s", 0.0, "eof", "eof", status_up=503, status_down=503),
            tap(synth, "core", "s", 0.001, "eof", "eof", status_up=503, status_down=503)]
    failed = cut(synth, "s", status=503, error=ErrorInfo("http", "overloaded", 503), ttft=None)
    engine_without_done = synth.note("engine_profile", 0.0, end={"finish_reason": True, "done": False})
    obs = with_taps(synth, [failed], taps)
    obs.notes.append(engine_without_done)  # the status, not a missing [DONE], shows where
    offender = sla.judge(obs, "early_close", {}).evidence["offenders"][0]
    assert offender["cause"] == "http_status" and offender["cut_at"] == "between the target and core"
