"""`recovery` on synthetic observations: a TTFT distribution still shifted after revert fails it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sla

pytestmark = pytest.mark.timeout(30)


def run(synth: Any, after_scale: float, after_shift: float = 0.0, n_base: int = 30, n_after: int = 30) -> Any:
    rng = np.random.default_rng(11)
    base = [
        synth.stream(f"b{i}", phase="baseline", sent=i * 0.1, ttft=0.05 + rng.exponential(0.05)) for i in range(n_base)
    ]
    fault = [synth.stream(f"f{i}", phase="fault", sent=10 + i * 0.1, ttft=2.0) for i in range(10)]
    after = [
        synth.stream(
            f"a{i}",
            phase="recovery",
            sent=20 + i * 0.1,
            ttft=after_shift + (0.05 + rng.exponential(0.05)) * after_scale,
        )
        for i in range(n_after)
    ]
    phases = [synth.phase("baseline", 0, 10), synth.phase("fault", 10, 20), synth.phase("recovery", 20, 30)]
    return synth.obs(base + fault + after, phases=phases)


def test_ttft_still_shifted_after_revert_fails(synth: Any) -> None:
    verdict = sla.judge(run(synth, after_scale=4.0), "recovery", {}, "recovery")
    assert verdict.status == "fail"
    assert verdict.figure is not None and verdict.figure > 1.5
    assert verdict.unit == "ratio"
    assert verdict.evidence["baseline_phase"] == "baseline"  # the first phase by default
    assert verdict.evidence["significant"] is True
    assert verdict.evidence["p_value"] < 0.05


def test_recovered_distribution_passes(synth: Any) -> None:
    verdict = sla.judge(run(synth, after_scale=1.0), "recovery", {}, "recovery")
    assert verdict.status == "pass"
    assert verdict.figure == pytest.approx(1.0, abs=0.5)


def test_significant_but_small_shift_passes(synth: Any) -> None:
    # +10 ms on every stream is detectable with 300 samples a side, but well under max_ratio
    verdict = sla.judge(run(synth, 1.0, after_shift=0.01, n_base=300, n_after=300), "recovery", {}, "recovery")
    assert verdict.evidence["significant"] is True
    assert verdict.status == "pass"


def millisecond_phases(synth: Any, base_ms: float, after_ms: float, n: int = 150) -> Any:
    """Two phases of millisecond TTFTs around the given medians (the soak's gpu-throttle shape)."""
    rng = np.random.default_rng(5)
    base = [synth.stream(f"b{i}", phase="baseline", sent=i * 0.02, ttft=base_ms / 1e3 * rng.uniform(0.7, 1.3))
            for i in range(n)]
    after = [synth.stream(f"a{i}", phase="recovery", sent=10 + i * 0.02, ttft=after_ms / 1e3 * rng.uniform(0.7, 1.3))
             for i in range(n)]
    return synth.obs(base + after, phases=[synth.phase("baseline", 0, 4), synth.phase("recovery", 10, 14)])


def test_a_few_milliseconds_of_host_drift_is_within_the_slack_and_a_real_shift_is_not(synth: Any) -> None:
    # the soak: an unchanged stack's median moved 5.9 -> 10.7 ms beside two busy neighbours (1.8x, p 1e-12)
    drift = millisecond_phases(synth, 5.9, 10.7)
    verdict = sla.judge(drift, "recovery", {}, "recovery")
    assert verdict.status == "pass" and verdict.figure is not None and verdict.figure > 1.5
    assert verdict.evidence["significant"] is True and 0 < verdict.evidence["excess_s"] < verdict.evidence["slack_s"]
    # without the slack the same data fails: the slack, not the ratio, decides it
    assert sla.judge(drift, "recovery", {"slack": "0ms"}, "recovery").status == "fail"
    # a stack still 10x slower at millisecond scale fails with the slack
    shifted = sla.judge(millisecond_phases(synth, 5.9, 59.0), "recovery", {}, "recovery")
    assert shifted.status == "fail" and shifted.evidence["excess_s"] > 0.04


def test_unscoped_recovery_judges_the_last_phase_against_a_named_baseline(synth: Any) -> None:
    verdict = sla.judge(run(synth, after_scale=4.0), "recovery", {"baseline": "baseline", "max_ratio": 10.0})
    assert verdict.evidence["judged_phase"] == "recovery"
    assert verdict.status == "pass"  # shifted, but within the ratio allowed


def test_too_few_samples_or_no_second_phase_is_inconclusive(synth: Any) -> None:
    verdict = sla.judge(run(synth, after_scale=4.0, n_after=5), "recovery", {}, "recovery")
    assert verdict.status == "inconclusive"
    assert "at least 8" in verdict.evidence["reason"]
    same = sla.judge(run(synth, after_scale=1.0), "recovery", {}, "baseline")
    assert same.status == "inconclusive"
