"""`streaming` on synthetic observations: a held-and-forwarded stream fails it, a streamed one, a
jittered one and a queued one (late first token, every event in its own read) do not."""

from __future__ import annotations

from typing import Any

import pytest

import sla

pytestmark = pytest.mark.timeout(30)


def _held(synth: Any, i: int, reads: int = 2, tokens: int = 32, **headers: str) -> Any:
    """A stream a buffering proxy held: nothing for 150 ms, then all content in ``reads`` reads."""
    per = tokens // reads
    gaps = [0.0 if (k + 1) % per else 0.004 for k in range(tokens - 1)]
    return synth.stream(f"held{i}", sent=i * 0.2, ttft=0.15, gaps=gaps, tokens=tokens, **headers)


def test_a_buffered_stream_fails_and_the_reason_says_so(synth: Any) -> None:
    streams = [_held(synth, i) for i in range(20)]
    verdict = sla.judge(synth.obs(streams), "streaming", {})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(1.0)
    assert "being buffered" in verdict.evidence["reason"]
    assert verdict.evidence["events_per_read_p50"] == pytest.approx(16.0)
    assert verdict.evidence["itl_p50_s"] == 0.0


@pytest.mark.parametrize(("headers", "named", "not_named"), [
    ({"server": "nginx/1.22.1", "content_encoding": "gzip"}, "gzip off for text/event-stream", "http-no-delay"),
    ({"server": "nginx/1.22.1"}, "proxy_buffering off", "http-no-delay"),
    ({}, "option http-no-delay", "Content-Encoding"),  # HAProxy's defaults: no Server header of its own
])
def test_the_reason_names_the_buffering_hops_own_fix(synth: Any, headers: dict[str, str], named: str,
                                                     not_named: str) -> None:
    streams = [_held(synth, i, **headers) for i in range(20)]
    verdict = sla.judge(synth.obs(streams), "streaming", {})
    assert verdict.status == "fail"
    assert (named in verdict.evidence["reason"]
            and not_named not in verdict.evidence["reason"]), verdict.evidence["reason"]
    assert verdict.evidence["server"] == headers.get("server")


def test_streamed_responses_pass(synth: Any) -> None:
    streams = [synth.stream(f"s{i}", sent=i * 0.2, ttft=0.01, itl=0.003, tokens=32) for i in range(20)]
    verdict = sla.judge(synth.obs(streams), "streaming", {})
    assert verdict.status == "pass" and verdict.figure == 0.0


def test_a_queued_server_is_not_called_buffered(synth: Any) -> None:
    # TTFT at 90% of the stream (queued behind other requests), then every token in its own read
    streams = [synth.stream(f"q{i}", sent=i * 0.5, ttft=2.0, itl=0.007, tokens=32) for i in range(20)]
    verdict = sla.judge(synth.obs(streams), "streaming", {})
    assert verdict.evidence["first_share_p50"] > 0.85
    assert verdict.status == "pass"


def _bunched(sizes: list[int], gap: float) -> list[float]:
    """The gaps of a stream whose reads carried ``sizes`` events each, ``gap`` apart."""
    return [g for size in sizes for g in [0.0] * (size - 1) + [gap]][:-1]


def test_jitter_bunching_is_not_called_buffered(synth: Any) -> None:
    # events bunched behind late ones (Toxiproxy latency with jitter): irregular reads of 1 to 7 events,
    # 3.2 a read on average (measured 3.7 (2.7-5.4) per stream), many of them a single event
    gaps = _bunched([1, 6, 2, 1, 5, 3, 1, 7, 2, 4], 0.03)
    streams = [synth.stream(f"j{i}", sent=i * 0.3, ttft=0.12, gaps=gaps, tokens=32) for i in range(20)]
    assert sla.judge(synth.obs(streams), "streaming", {}).status == "pass"


def test_a_steady_four_events_a_read_is_held_in_batches(synth: Any) -> None:
    """Issue 40: a hop that writes 4 events at a time while the tokens were generated 20 ms apart passed
    (4 per read is under the 8 of whole-response buffering); every read carrying 4 is no jitter."""
    gaps = _bunched([4] * 8, 0.08)
    streams = [synth.stream(f"b{i}", sent=i * 0.3, ttft=0.08, gaps=gaps, tokens=32) for i in range(20)]
    verdict = sla.judge(synth.obs(streams), "streaming", {})
    assert verdict.status == "fail" and verdict.figure == pytest.approx(1.0), verdict.evidence
    assert "4.0 content events per read" in verdict.evidence["reason"]
    assert sla.judge(synth.obs(streams), "streaming", {"min_batch_events": 5}).status == "pass"


def test_irregular_bunches_of_four_or_more_from_a_starved_host_are_not_held(synth: Any) -> None:
    """A saturated 2-core host (nginx, the stack and the client all waiting for a core) bunched tokens
    irregularly, 4 to 12 a read: 11-18% of a healthy smoke's streams behind an unbuffered nginx had 80% of
    their reads at 4 or more and failed `streaming`. A hop that holds N at a time gives steady reads of N."""
    gaps = _bunched([5, 9, 4, 12, 6, 4, 7, 3], 0.03)
    streams = [synth.stream(f"x{i}", sent=i * 0.3, ttft=0.05, gaps=gaps, tokens=50) for i in range(20)]
    assert sla.judge(synth.obs(streams), "streaming", {}).status == "pass"
    steady = _bunched([4, 4, 5, 4, 4, 4, 4, 3], 0.03)  # one read late by an event: still steady
    held = [synth.stream(f"y{i}", sent=i * 0.3, ttft=0.05, gaps=steady, tokens=32) for i in range(20)]
    assert sla.judge(synth.obs(held), "streaming", {}).status == "fail"


def test_a_few_buffered_streams_within_budget_pass_and_short_streams_are_not_judged(synth: Any) -> None:
    streams = [synth.stream(f"s{i}", sent=i * 0.2, ttft=0.01, itl=0.003, tokens=32) for i in range(19)]
    streams.append(_held(synth, 99))
    streams += [synth.stream(f"short{i}", ttft=0.1, itl=0.0, tokens=3) for i in range(10)]  # 3 tokens in one read
    verdict = sla.judge(synth.obs(streams), "streaming", {})
    assert verdict.status == "pass" and verdict.samples == 20 and verdict.figure == pytest.approx(0.05)


def test_too_few_judged_streams_are_inconclusive(synth: Any) -> None:
    verdict = sla.judge(synth.obs([_held(synth, 0)]), "streaming", {})
    assert verdict.status == "inconclusive" and "needed" in verdict.evidence["reason"]


def _host(synth: Any, busy_cores: float, end_s: float) -> dict[str, Any]:
    """A 2-core host's samples every 0.5 s over one phase, ``busy_cores`` of it busy throughout."""
    from chaos.host.contention import BUSY, CONTENTION_NOTE, NEIGHBOUR, RUN, WAIT
    metrics = [sample for name, value in ((BUSY, busy_cores), (RUN, 0.05), (NEIGHBOUR, busy_cores - 0.05),
                                          (WAIT, 0.25))
               for sample in synth.steps(name, 0.5, end_s, 0.5, lambda t, v=value: v)]
    return {"metrics": metrics, "phases": [synth.phase("baseline", 0.0, end_s)],
            "notes": [synth.note(CONTENTION_NOTE, 0.0, cpus=2, period_s=0.5, target_processes_known=False)]}


def _starved(synth: Any, i: int) -> Any:
    """A stream an unbuffered nginx relayed on a saturated host, as measured: its first token on its own
    and on time, then irregular bunches, 8 or more a read on average (first read 1-2 events at the median,
    the first token at 0.14-0.24 of the stream's time)."""
    return synth.stream(f"st{i}", sent=i * 0.3, ttft=0.05, gaps=_bunched([1, 9, 12, 10], 0.06), tokens=32)


def _queued(synth: Any, i: int) -> Any:
    """A serial engine's stream on a saturated host (``transformers serve``): its first token late from
    queueing (0.78 of the stream's time) but alone in its read, then bunches."""
    return synth.stream(f"q{i}", sent=i * 0.3, ttft=0.8, gaps=_bunched([1, 9, 12, 10], 0.07), tokens=32)


def _starved_at_the_start(synth: Any, i: int) -> Any:
    """Half of them as ``_starved``, half bunched from the response's start (a starved nginx falls behind
    there: a first read of 10 events): CI's third unbuffered-nginx fail, 39 of 261 held, most marked."""
    if i % 2:
        return _starved(synth, i)
    return synth.stream(f"ss{i}", sent=i * 0.3, ttft=0.15, gaps=_bunched([10, 1, 12, 9], 0.03), tokens=32)


@pytest.mark.parametrize("shape", ["nginx", "queued", "bunched from the start"])
@pytest.mark.parametrize(("busy_cores", "status"), [(2.0, "inconclusive"), (1.1, "fail")])
def test_bunched_streams_too_few_for_a_buffer_are_undecided_only_on_a_saturated_host(
        synth: Any, busy_cores: float, status: str, shape: str) -> None:
    """An unbuffered nginx beside the suite and two busy processes: 51% of its streams came 8 or more events
    a read; a serial engine 11%. Nothing held them; the host starved the hops. On a host with CPU to spare
    the same streams fail: a hop bunches them."""
    make = {"nginx": _starved, "queued": _queued, "bunched from the start": _starved_at_the_start}[shape]
    streams = [make(synth, i) for i in range(20)] + [
        synth.stream(f"s{i}", sent=i * 0.3 + 0.1, ttft=0.01, itl=0.005, tokens=32) for i in range(20)]
    verdict = sla.judge(synth.obs(streams, **_host(synth, busy_cores, 7.0)), "streaming", {})
    assert verdict.status == status, verdict.evidence
    assert verdict.figure == pytest.approx(0.5)
    assert verdict.evidence["marked"] == (10 if shape == "bunched from the start" else 0), verdict.evidence
    if status == "inconclusive":
        assert verdict.evidence["saturated_host"]["busy_cores"] == pytest.approx(2.0)
        assert verdict.evidence["inconclusive_cause"] == "host saturated"
        assert "saturated host (2.00 of 2 cores busy)" in verdict.evidence["reason"], verdict.evidence["reason"]
    else:
        assert "being buffered" in verdict.evidence["reason"]


@pytest.mark.parametrize("shape", ["whole", "first buffer", "steady batches"])
def test_a_buffers_mark_fails_on_a_saturated_host_too(synth: Any, shape: str) -> None:
    """A buffer holds the first bytes too: a first read of 8 or more events (nginx buffering: 20 of 32), or
    steady batches, each fail however busy the host."""
    if shape == "whole":
        streams = [_held(synth, i) for i in range(20)]
    elif shape == "first buffer":  # a buffer's worth first, early in the stream, then irregular bunches
        streams = [synth.stream(f"l{i}", sent=i * 0.3, ttft=0.05, gaps=_bunched([9, 3, 12, 8], 0.05), tokens=32)
                   for i in range(20)]
    else:
        streams = [synth.stream(f"b{i}", sent=i * 0.3, ttft=0.08, gaps=_bunched([4] * 8, 0.08), tokens=32)
                   for i in range(20)]
    verdict = sla.judge(synth.obs(streams, **_host(synth, 2.0, 7.0)), "streaming", {})
    assert verdict.status == "fail", verdict.evidence
    assert verdict.evidence["marked"] == 20 and "being buffered" in verdict.evidence["reason"]
