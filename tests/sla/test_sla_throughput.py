"""`throughput` on synthetic observations: too few tokens or requests per phase second fail it."""

from __future__ import annotations

from typing import Any

import pytest

import sla
from chaos.model.errors import ExperimentInvalid

pytestmark = pytest.mark.timeout(30)


def load(synth: Any, usage: int | None = None) -> Any:
    # 10 streams of 10 content events each, all inside the 10s window of phase "load"
    streams = [
        synth.stream(f"r{i}", sent=1.0 + i * 0.5, tokens=10, usage={"completion_tokens": usage} if usage else None)
        for i in range(10)
    ]
    return synth.obs(streams, phases=[synth.phase("load", 0.0, 10.0)])


def test_slow_generation_fails(synth: Any) -> None:
    verdict = sla.judge(load(synth), "throughput", {"min_tokens_per_s": 50}, "load")
    assert verdict.status == "fail"
    assert verdict.figure == pytest.approx(10.0)  # 100 content events / 10 s
    assert verdict.unit == "tokens/s"
    assert verdict.evidence["token_source"] == "content_events"


def test_enough_tokens_pass_and_usage_counts_are_preferred(synth: Any) -> None:
    assert sla.judge(load(synth), "throughput", {"min_tokens_per_s": 5}, "load").status == "pass"
    verdict = sla.judge(load(synth, usage=30), "throughput", {"min_tokens_per_s": "25/s"}, "load")
    assert verdict.status == "pass"
    assert verdict.figure == pytest.approx(30.0)  # 3 tokens per chunk
    assert verdict.evidence["token_source"] == "usage"


def test_requests_per_second(synth: Any) -> None:
    verdict = sla.judge(load(synth), "throughput", {"min_requests_per_s": 2}, "load")
    assert verdict.status == "fail"
    assert verdict.figure == pytest.approx(1.0)
    assert verdict.unit == "requests/s"
    assert sla.judge(load(synth), "throughput", {"min_requests_per_s": "30/m"}, "load").status == "pass"


def test_only_the_part_inside_the_window_counts(synth: Any) -> None:
    # one stream, 10 events 1s apart from t=5.1, window ends at 10: 5 events inside
    obs = synth.obs([synth.stream("r", phase="p", sent=5.0, tokens=10, itl=1.0)], phases=[synth.phase("p", 0.0, 10.0)])
    verdict = sla.judge(obs, "throughput", {"min_tokens_per_s": 0.1}, "p")
    assert verdict.evidence["tokens"] == 5
    assert verdict.evidence["completed_requests"] == 0  # it completed after the window


def test_no_window_or_no_streams_is_inconclusive(synth: Any) -> None:
    streams = [synth.stream("r")]
    open_window = synth.obs(streams, phases=[synth.phase("load", 0.0, None)])
    assert sla.judge(open_window, "throughput", {"min_tokens_per_s": 1}, "load").status == "inconclusive"
    assert sla.judge(synth.obs(streams), "throughput", {"min_tokens_per_s": 1}).status == "inconclusive"
    empty = synth.obs([], phases=[synth.phase("load", 0.0, 10.0)])
    verdict = sla.judge(empty, "throughput", {"min_tokens_per_s": 1}, "load")
    assert verdict.status == "inconclusive"
    assert verdict.figure is None


def test_exactly_one_floor_must_be_given() -> None:
    from chaos.model.observations import Observations

    with pytest.raises(ExperimentInvalid, match="exactly one of min_tokens_per_s, min_requests_per_s"):
        sla.judge(Observations(), "throughput", {"min_tokens_per_s": 1, "min_requests_per_s": 1})
    with pytest.raises(ExperimentInvalid, match="exactly one"):
        sla.judge(Observations(), "throughput", {})
