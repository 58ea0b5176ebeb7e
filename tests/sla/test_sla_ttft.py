"""`ttft` on synthetic observations: a buffering proxy fails it, a streaming stack passes, 50 samples cannot
judge a p99."""

from __future__ import annotations

from typing import Any

import pytest

import sla
from chaos.model.errors import ExperimentInvalid
from chaos.model.observations import Observations

pytestmark = pytest.mark.timeout(30)


def test_buffered_stream_whose_first_content_arrives_with_the_last_fails(synth: Any) -> None:
    # A buffering proxy: the server produced 20 tokens 20ms apart but every content event reaches
    # the client at once, 0.5s after sending, just after the proxy saw the first byte go by.
    streams = [synth.stream(f"r{i}", sent=i * 0.1, ttft=0.5, ttfb=0.5, tokens=20, gaps=[0.0] * 19) for i in range(40)]
    verdict = sla.judge(synth.obs(streams), "ttft", {"quantile": "p50", "budget": "200ms"})
    assert verdict.status == "fail"
    assert verdict.figure == pytest.approx(0.5)
    assert verdict.budget == pytest.approx(0.2)
    assert verdict.unit == "s"
    assert verdict.samples == 40
    assert verdict.evidence["ttft_over_e2e_p50"] == pytest.approx(1.0)  # TTFT equals end-to-end


def test_streaming_stack_passes_p99(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", sent=i * 0.01, ttft=0.05 + (i % 10) * 0.005, ttfb=0.01) for i in range(400)]
    verdict = sla.judge(synth.obs(streams), "ttft", {"quantile": 0.99, "budget": "500ms"})
    assert verdict.status == "pass"
    assert verdict.figure == pytest.approx(0.095)
    assert verdict.evidence["upper"] <= 0.5
    assert verdict.evidence["ttfb"]["p50"] == pytest.approx(0.01)  # first byte reported beside it
    assert verdict.evidence["ttfb_p99"] == pytest.approx(0.01)


def test_p99_from_50_samples_is_inconclusive_and_says_how_many_would_do(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", ttft=0.05) for i in range(50)]
    verdict = sla.judge(synth.obs(streams), "ttft", {"budget": "1s"})  # default quantile 0.99
    assert verdict.status == "inconclusive"
    assert verdict.figure == pytest.approx(0.05)
    assert verdict.evidence["samples_needed"] == 368
    assert "368" in verdict.evidence["reason"]


def test_streams_without_content_are_left_out_and_counted(synth: Any, err: dict[str, Any]) -> None:
    fast = [synth.stream(f"ok{i}", ttft=0.05) for i in range(30)]
    hung_up = [synth.stream(f"h{i}", ttft=5.0, hangup_after=1.0) for i in range(3)]  # left before content
    failed = [synth.stream(f"e{i}", ttft=None, status=503, error=err["503"], finish=None, done=False) for i in range(2)]
    late_hangup = [synth.stream("h-late", ttft=0.06, tokens=10, hangup_after=0.1)]  # saw content, then left
    verdict = sla.judge(synth.obs(fast + hung_up + failed + late_hangup), "ttft", {"quantile": "p50", "budget": "1s"})
    assert verdict.status == "pass"
    # the late hang-up's first content was really seen; the three that gave up after waiting 1s for
    # content are censored at 1s >= budget, so they count as over budget (a lower bound)
    assert verdict.samples == 34
    assert verdict.evidence["censored_over_budget"] == 3
    assert verdict.evidence["hung_up_before_content"] == 3
    assert verdict.evidence["no_content"] == 2
    assert verdict.evidence["no_content_by_reason"] == {"http": 2}
    assert verdict.evidence["no_content_ids"] == ["e0", "e1"]


def test_phase_scoping_and_background_load(synth: Any) -> None:
    base = [synth.stream(f"b{i}", phase="baseline", ttft=0.05) for i in range(20)]
    slow = [synth.stream(f"s{i}", phase="fault", ttft=2.0) for i in range(20)]
    hog = [synth.stream(f"hog{i}", phase="baseline", ttft=9.0, background=True) for i in range(20)]
    obs = synth.obs(base + slow + hog)
    assert sla.judge(obs, "ttft", {"quantile": "p50", "budget": "1s"}, "baseline").status == "pass"
    assert sla.judge(obs, "ttft", {"quantile": "p50", "budget": "1s"}, "fault").status == "fail"
    assert sla.judge(obs, "ttft", {"quantile": "p50", "budget": "1s"}).samples == 40  # background never counts


@pytest.mark.parametrize(("raw", "q"), [("p50", 0.5), ("p99.9", 0.999), (0.9, 0.9), ("95%", 0.95)])
def test_quantile_accepts_numbers_and_percentile_names(synth: Any, raw: object, q: float) -> None:
    verdict = sla.judge(synth.obs([synth.stream("r", ttft=0.05)]), "ttft", {"quantile": raw, "budget": "1s"})
    assert verdict.evidence["quantile"] == pytest.approx(q)


@pytest.mark.parametrize("raw", ["p100", 1.0, 0, "fast", True])
def test_quantile_out_of_range_is_an_experiment_error(raw: object) -> None:
    with pytest.raises(ExperimentInvalid, match="quantile"):
        sla.judge(Observations(), "ttft", {"quantile": raw, "budget": "1s"})


def test_sla_ttft_server_that_never_answers_cannot_pass(synth: Any) -> None:
    """Half the streams time out after 5s without content: censored over budget, so p50 fails."""
    from chaos.model.observations import ErrorInfo, Observations, StreamRecord
    from sla.ttft import Ttft

    streams = []
    for i in range(60):
        if i % 2:
            streams.append(StreamRecord(id=f"s{i}", phase="p", t_sent=0, t_end=5_000_000_000,
                                        error=ErrorInfo("timeout", "read timeout")))
        else:
            streams.append(StreamRecord(id=f"s{i}", phase="p", t_sent=0, t_first_content=50_000_000,
                                        t_content=[50_000_000]))
    verdict = Ttft(quantile=0.9, budget=0.5, confidence=0.95).judge(Observations(streams=streams), None)
    assert verdict.status == "fail"
    assert verdict.evidence["censored_over_budget"] == 30


def test_sla_ttft_early_give_ups_stay_unknown(synth: Any) -> None:
    """A client that gave up after 10ms tells nothing about a 500ms budget: left out, not a fail."""
    from chaos.model.observations import Hangup, Observations, StreamRecord
    from sla.ttft import Ttft

    streams = [StreamRecord(id=f"s{i}", phase="p", t_sent=0, t_first_content=20_000_000, t_content=[20_000_000])
               for i in range(40)]
    streams += [StreamRecord(id=f"h{i}", phase="p", t_sent=0, t_end=10_000_000,
                             hangup=Hangup("f", "read_timeout", 10_000_000))
                for i in range(40)]
    verdict = Ttft(quantile=0.5, budget=0.5, confidence=0.95).judge(Observations(streams=streams), None)
    assert verdict.status == "pass" and verdict.evidence["censored_unknown"] == 40
