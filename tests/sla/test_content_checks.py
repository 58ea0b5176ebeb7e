"""Issue 40, the content and framing defects that passed every shipped experiment, on synthetic
observations: events over the server's own usage, a short ``length`` under ``ignore_eos``, a stream
served as another Content-Type, and the words of ``streaming`` (who holds, who compresses, what a
late client can explain)."""

from __future__ import annotations

from typing import Any

import pytest

import sla
from chaos.model.observations import TapRecord

pytestmark = pytest.mark.timeout(30)

SENT = {"sent": ["ignore_eos", "stream_options"]}


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}


# ---- integrity: usage against events, repeated events, the Content-Type --------------------------


def test_more_content_events_than_the_servers_usage_fail_integrity(synth: Any) -> None:
    streams = [synth.stream(f"s{i}", tokens=32, usage=_usage(32)) for i in range(10)]
    streams.append(synth.stream("dup", tokens=33, usage=_usage(32), repeated_events=1))
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "fail", verdict.evidence
    assert verdict.evidence["problems"]["events_over_usage"] == 1
    assert verdict.evidence["offenders"] == [{"id": "dup", "problems": ["events_over_usage"], "content_events": 33,
                                              "usage_completion_tokens": 32, "repeated_events": 1}]
    assert "usage.completion_tokens" in verdict.evidence["reason"]
    assert verdict.evidence["compared_with_usage"] == 11 and verdict.evidence["repeated_events"] == 1


def test_repeated_tokens_the_usage_accounts_for_pass_and_are_still_counted(synth: Any) -> None:
    # "the the": an engine may send the same payload twice in a row; its usage counts both tokens
    streams = [synth.stream(f"s{i}", tokens=32, usage=_usage(32), repeated_events=2) for i in range(5)]
    streams.append(synth.stream("no-usage", tokens=32, repeated_events=1))  # nothing to count against
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "pass", verdict.evidence
    assert verdict.evidence["repeated_events"] == 11 and verdict.evidence["streams_with_repeated_events"] == 6
    assert verdict.evidence["compared_with_usage"] == 5


def test_a_stream_served_as_json_fails_integrity_naming_the_content_type(synth: Any) -> None:
    streams = [synth.stream(f"j{i}", tokens=8, content_type="application/json") for i in range(4)]
    streams += [synth.stream("ok", tokens=8, content_type="text/event-stream; charset=utf-8"),
                synth.stream("old", tokens=8),  # a journal from before the field: not judged on it
                synth.stream("err", tokens=0, status=500, content_type="application/json")]  # errors' business
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "fail"
    assert verdict.evidence["problems"]["content_type"] == 4
    assert verdict.evidence["content_types"] == {"application/json": 4}
    assert "'application/json'" in verdict.evidence["reason"] and "text/event-stream" in verdict.evidence["reason"]
    assert verdict.evidence["offenders"][0] == {"id": "j0", "problems": ["content_type"],
                                                "content_type": "application/json"}


def test_no_content_type_at_all_is_judged_as_sse_and_another_type_case_free(synth: Any) -> None:
    """A server or proxy that drops the header but streams valid SSE is no content_type problem (it
    failed integrity); neither is the type in another case or with parameters."""
    streams = [synth.stream("n", tokens=8, content_type=""),
               synth.stream("c", tokens=8, content_type="Text/Event-Stream ; charset=UTF-8")]
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "pass" and verdict.evidence["content_types"] == {}, verdict.evidence


# ---- early_close: finish_reason length before max_tokens under ignore_eos ------------------------


def test_a_short_length_under_ignore_eos_is_an_early_close(synth: Any) -> None:
    streams = [synth.stream(f"s{i}", tokens=32, max_tokens=32, finish="length", usage=_usage(32)) for i in range(9)]
    streams.append(synth.stream("short", tokens=26, max_tokens=32, finish="length", usage=_usage(26)))
    obs = synth.obs(streams, notes=[synth.note("preflight", 0.0, **SENT)])
    verdict = sla.judge(obs, "early_close", {"budget": 0.0})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(0.1), verdict.evidence
    assert verdict.evidence["by_cause"] == {"short_length": 1} and verdict.evidence["ignore_eos_sent"] is True
    (offender,) = verdict.evidence["offenders"]
    assert offender["id"] == "short" and offender["why"] == ["short_length"]
    assert "after 26 of max_tokens 32 (usage.completion_tokens)" in offender["detail"]


def test_without_usage_a_stream_short_by_events_is_not_called_cut(synth: Any) -> None:
    # 30 events for 32 tokens: an engine that sends a held-back character's bytes as one event
    # (llama-cpp-python) ends every healthy stream so; events bound the tokens from below only
    stream = synth.stream("short", tokens=30, max_tokens=32, finish="length")
    obs = synth.obs([stream], notes=[synth.note("preflight", 0.0, **SENT)])
    verdict = sla.judge(obs, "early_close", {"budget": 0.0})
    assert verdict.status == "pass" and verdict.evidence["offenders"] == [], verdict.evidence


@pytest.mark.parametrize(("finish", "sent", "tokens"), [
    ("length", {"sent": ["stream_options"]}, 26),  # ignore_eos not sent (dropped, or off): length may come early
    ("length", None, 26),  # a journal from before the preflight said what it sent
    ("stop", SENT, 26),  # an end of sequence is no cut
    ("length", SENT, 32),  # the whole length
])
def test_a_length_end_is_judged_only_where_ignore_eos_promised_max_tokens(
        synth: Any, finish: str, sent: dict[str, Any] | None, tokens: int) -> None:
    streams = [synth.stream("s", tokens=tokens, max_tokens=32, finish=finish, usage=_usage(tokens))]
    notes = [synth.note("preflight", 0.0, **sent)] if sent is not None else []
    assert sla.judge(synth.obs(streams, notes=notes), "early_close", {"budget": 0.0}).status == "pass"


# ---- streaming: what the advice may claim ---------------------------------------------------------


def _held(synth: Any, i: int, per_read: int = 16, tokens: int = 32, gap: float = 0.004, **extra: Any) -> Any:
    gaps = [0.0 if (k + 1) % per_read else gap for k in range(tokens - 1)]
    return synth.stream(f"h{i}", sent=i * 0.3, ttft=0.15, gaps=gaps, tokens=tokens, **extra)


def _path(*hops: dict[str, Any]) -> Any:
    return {"hops": list(hops)}


NGINX_STREAMING = ("proxy_http_version 1.1;\nproxy_buffering off;\nproxy_request_buffering off;\n")


def _reason(synth: Any, streams: list[Any], notes: list[Any] = (), taps: list[TapRecord] = ()) -> str:  # type: ignore[assignment]
    obs = synth.obs(streams, notes=notes)
    obs.taps.extend(taps)
    verdict = sla.judge(obs, "streaming", {})
    assert verdict.status == "fail", verdict.evidence
    return str(verdict.evidence["reason"])


def test_an_nginx_this_run_started_with_proxy_buffering_off_is_not_told_to_turn_it_off(synth: Any) -> None:
    streams = [_held(synth, i, server="nginx/1.22.1") for i in range(10)]
    note = synth.note("path", 0.0, **_path({"name": "edge", "kind": "nginx", "config": NGINX_STREAMING}))
    reason = _reason(synth, streams, [note])
    assert "already has proxy_buffering off" in reason and "set proxy_buffering off" not in reason, reason
    assert "16.0 content events per read" in reason  # what was seen


def test_responses_that_carry_x_accel_buffering_no_do_not_claim_nginx_buffers(synth: Any) -> None:
    streams = [_held(synth, i, server="nginx", x_accel_buffering="no") for i in range(10)]
    reason = _reason(synth, streams)
    assert "X-Accel-Buffering: no" in reason and "set proxy_buffering off" not in reason, reason


def test_a_gzip_the_origin_did_is_not_blamed_on_nginx(synth: Any) -> None:
    streams = [_held(synth, i, server="nginx/1.22.1", content_encoding="gzip") for i in range(10)]
    # the run's own nginx, gzip off in its configuration: the server behind it compressed
    note = synth.note("path", 0.0, **_path({"name": "edge", "kind": "nginx", "config": NGINX_STREAMING}))
    reason = _reason(synth, streams, [note])
    assert "server behind it compresses" in reason and "set gzip off" not in reason, reason
    # a stream hop behind nginx saw the origin's answer already compressed
    hop = synth.note("path", 0.0, **_path({"name": "edge", "kind": "nginx", "config": None},
                                           {"name": "inner", "kind": "stream", "config": None}))
    taps = [TapRecord(hop="inner", seq=i + 1, request_id=f"h{i}", target="/v1/completions", t_accept=synth.ns(i),
                      headers_up={"content-encoding": "gzip"}) for i in range(10)]
    reason = _reason(synth, streams, [hop], taps)
    assert "the origin server" in reason and "stream hop inner" in reason and "set gzip off" not in reason, reason


def test_a_target_that_compresses_its_own_answer_is_told_so_when_the_load_went_direct(synth: Any) -> None:
    streams = [_held(synth, i, server="uvicorn", content_encoding="gzip") for i in range(10)]
    reason = _reason(synth, streams, [synth.note("path", 0.0, hops=[])])
    assert "the target's own answer (Server: uvicorn) is compressed" in reason, reason
    assert "nginx" not in reason and "a hop in front" not in reason


def test_without_what_the_run_knows_the_words_stay_as_they_were(synth: Any) -> None:
    streams = [_held(synth, i, server="nginx/1.22.1") for i in range(10)]
    assert "set proxy_buffering off" in _reason(synth, streams)  # a journal without a path note


def test_a_late_client_explains_only_the_events_that_arrived_within_its_lag(synth: Any) -> None:
    """Issue 40: a steady 8 events a read, tokens 20 ms apart, was called inconclusive in 2 of 6 runs by a
    client lag of ~30 ms: such a client gathers at most ~30 ms of events into one read, not 140 ms."""
    spec = sla.spec_for("streaming")
    streams = [_held(synth, i, per_read=8, tokens=64, gap=0.16) for i in range(10)]
    verdict = spec.judge(synth.obs(streams), None)
    assert verdict.status == "fail"
    span = verdict.evidence["held_read_span_p50_s"]
    assert 0.1 < span < 0.2, verdict.evidence
    assert not spec.lateness_explains(verdict, lag_s=0.03)
    assert spec.lateness_explains(verdict, lag_s=0.5)
