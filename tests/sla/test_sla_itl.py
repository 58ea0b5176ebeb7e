"""`itl` on synthetic observations: a stall or slow decode fails it, steady tokens pass, 50 gaps cannot judge a p99."""

from __future__ import annotations

from typing import Any

import pytest

import sla

pytestmark = pytest.mark.timeout(30)


def test_a_stall_over_max_stall_fails_and_names_the_stream(synth: Any) -> None:
    # an event loop blocked for 3s: one stream's gap is huge, every quantile still looks fine
    streams = [synth.stream(f"r{i}", tokens=21, itl=0.02) for i in range(30)]
    streams.append(synth.stream("stalled", sent=1.0, tokens=21, gaps=[0.02] * 9 + [3.0] + [0.02] * 10))
    verdict = sla.judge(synth.obs(streams), "itl", {"quantile": "p90", "budget": "100ms", "max_stall": "1s"})
    assert verdict.status == "fail"
    assert verdict.evidence["decided_by"] == "max_stall"
    assert verdict.figure == pytest.approx(3.0)  # the stall against its own budget
    assert verdict.budget == pytest.approx(1.0)
    assert verdict.evidence["longest_stall_stream"] == "stalled"
    assert verdict.evidence["longest_stall_s"] == pytest.approx(3.0)
    assert verdict.evidence["longest_stall_ended_at_s"] == pytest.approx(1.0 + 0.1 + 9 * 0.02 + 3.0)
    assert verdict.evidence["gaps_over_max_stall"] == 1


def test_slow_decode_fails_the_quantile(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", tokens=11, itl=0.2) for i in range(10)]
    verdict = sla.judge(synth.obs(streams), "itl", {"quantile": "p90", "budget": "50ms"})
    assert verdict.status == "fail"
    assert verdict.evidence["decided_by"] == "quantile"
    assert verdict.figure == pytest.approx(0.2)
    assert verdict.samples == 100


def test_steady_tokens_pass(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", tokens=21, gaps=[0.015 + 0.001 * (k % 5) for k in range(20)]) for i in range(30)]
    verdict = sla.judge(synth.obs(streams), "itl", {"budget": "100ms", "max_stall": "500ms"})
    assert verdict.status == "pass"
    assert verdict.samples == 600
    assert verdict.unit == "s"
    assert verdict.evidence["gaps"]["p50"] == pytest.approx(0.017)
    assert verdict.evidence["gaps_over_max_stall"] == 0


def test_p99_from_50_gaps_is_inconclusive(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", tokens=11, itl=0.01) for i in range(5)]
    verdict = sla.judge(synth.obs(streams), "itl", {"quantile": "p99", "budget": "100ms"})
    assert verdict.status == "inconclusive"
    assert verdict.samples == 50
    assert verdict.evidence["samples_needed"] == 368


def test_no_gaps_is_inconclusive_even_with_a_stall_budget(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", tokens=1) for i in range(5)]
    verdict = sla.judge(synth.obs(streams), "itl", {"budget": "100ms", "max_stall": "1s"})
    assert verdict.status == "inconclusive"
    assert verdict.samples == 0
    assert verdict.evidence["longest_stall_stream"] is None
