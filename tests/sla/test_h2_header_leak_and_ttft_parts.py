"""`integrity`'s ``content_type_missing`` (a header lost between the streams of one HTTP/2 connection) and
`ttft`'s ``ttft_parts`` (connect, TLS, request → head, head → first token), on synthetic records."""

from __future__ import annotations

from typing import Any

import pytest

import sla
from sla.ttft_parts import ttft_parts

pytestmark = pytest.mark.timeout(30)

SSE = "text/event-stream"


def _h2(synth: Any, id: str, stream_id: int, content_type: str) -> Any:
    return synth.stream(id, content_type=content_type, protocol="h2", connection="c1", stream_id=stream_id)


def test_a_stream_without_content_type_among_labelled_neighbours_fails_naming_stream_and_header(synth: Any) -> None:
    streams = [_h2(synth, "a", 1, SSE), _h2(synth, "b", 3, ""), _h2(synth, "c", 5, SSE + "; charset=utf-8")]
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "fail"
    assert verdict.evidence["problems"]["content_type_missing"] == 1
    (offender,) = verdict.evidence["offenders"]
    assert offender == {"id": "b", "problems": ["content_type_missing"], "missing_header": "content-type",
                        "protocol": "h2", "connection": "c1", "stream_id": 3}
    assert "b on connection c1, HTTP/2 stream 3" in verdict.evidence["reason"]
    assert "content-type" in verdict.evidence["reason"]


def test_a_server_that_never_sends_content_type_is_judged_as_sse(synth: Any) -> None:
    streams = [_h2(synth, "a", 1, ""), _h2(synth, "b", 3, "")]
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "pass", verdict.evidence


def test_every_stream_labelled_passes(synth: Any) -> None:
    streams = [_h2(synth, str(i), 2 * i + 1, SSE) for i in range(4)]
    assert sla.judge(synth.obs(streams), "integrity", {}).status == "pass"


def test_ttft_parts_of_a_new_tls_connection_add_up_to_its_ttft(synth: Any) -> None:
    ns = synth.ns
    st = synth.stream("n", sent=0.0, ttft=0.5, ttfb=0.2, t_connected=ns(0.01), t_tls=ns(0.04), t_request=ns(0.04),
                      reused=False, protocol="h2")
    parts = ttft_parts(st, st.t_first_content)
    assert parts == {"connect": 10_000_000, "tls": 30_000_000, "to_request": 0, "to_head": 160_000_000,
                     "head_to_token": 300_000_000}
    assert sum(parts.values()) == st.t_first_content - st.t_sent


def test_a_stream_that_joined_a_connection_already_opening_is_not_charged_its_handshake(synth: Any) -> None:
    """Sent after the TCP connect ended (it joined an HTTP/2 connection others opened): it waited for the TLS
    handshake's rest and the SETTINGS, and its parts still add up to its TTFT."""
    ns = synth.ns
    st = synth.stream("late", sent=0.02, ttft=0.3, ttfb=0.1, t_connected=ns(0.01), t_tls=ns(0.04),
                      t_request=ns(0.05), reused=False, protocol="h2")
    parts = ttft_parts(st, st.t_first_content)
    assert parts is not None
    assert parts["connect"] == 0 and parts["tls"] == 20_000_000 and parts["to_request"] == 10_000_000
    assert sum(parts.values()) == st.t_first_content - st.t_sent


def test_ttft_evidence_splits_new_and_reused_connections(synth: Any) -> None:
    ns = synth.ns
    new = synth.stream("new", sent=0.0, ttft=0.3, ttfb=0.1, t_connected=ns(0.02), t_request=ns(0.02), reused=False,
                       protocol="http/1.1")
    reused = synth.stream("old", sent=1.0, ttft=0.25, ttfb=1.05 - 1.0, t_request=ns(1.0), reused=True,
                          protocol="http/1.1")
    old_journal = synth.stream("older", sent=2.0, ttft=0.2)  # no t_request: no split
    verdict = sla.judge(synth.obs([new, reused, old_journal]), "ttft", {"budget": "1s"})
    parts = verdict.evidence["ttft_parts"]
    assert (parts["streams"], parts["new_connections"], parts["reused_connections"]) == (2, 1, 1)
    assert parts["protocols"] == {"http/1.1": 2}
    assert parts["connect"]["p50"] == pytest.approx(0.02)
    assert "tls" not in parts  # plain TCP: no handshake
    assert parts["head_to_token"]["p50"] == pytest.approx((0.2 + 0.2) / 2)


def test_a_phase_where_every_stream_lost_the_header_fails_when_other_phases_had_it(synth: Any) -> None:
    """A leak that hit every stream of its phase: the run's other phases show the server does send the header."""
    healthy = [synth.stream(f"h{i}", phase="baseline", sent=0.1 * i, content_type=SSE) for i in range(3)]
    leaked = [synth.stream(f"l{i}", phase="leak", sent=5 + 0.1 * i, content_type="", connection="c2",
                           protocol="h2", stream_id=2 * i + 1) for i in range(3)]
    phases = [synth.phase("baseline", 0.0, 4.0), synth.phase("leak", 4.0, 9.0)]
    obs = synth.obs(healthy + leaked, phases=phases)
    verdict = sla.judge(obs, "integrity", {}, "leak")
    assert verdict.status == "fail" and verdict.evidence["problems"]["content_type_missing"] == 3
    assert sla.judge(obs, "integrity", {}, "baseline").status == "pass"
