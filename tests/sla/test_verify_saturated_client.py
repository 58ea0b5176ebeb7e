"""`judge_all`'s saturated-client rule: a slow load generator is never blamed on the server, and
never excuses a server that is slower than the generator's own lag could explain."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from chaos.execution.verify import judge_all
from chaos.experiment.loader import parse_experiment
from chaos.model.observations import ErrorInfo

pytestmark = pytest.mark.timeout(30)

EXPERIMENT = """
name: saturation
phases:
  - {name: baseline, duration: 5s}
  - {name: fault, duration: 5s}
  - {name: recovery, duration: 5s}
sla:
  - {kind: ttft, phases: [fault], quantile: p50, budget: 100ms}
  - {kind: recovery, phases: [recovery]}
  - {kind: errors, budget: 0%}
"""


def lag(p99_ms: float) -> dict[str, Any]:
    return {"p50_ms": 1.0, "p99_ms": p99_ms, "max_ms": p99_ms * 2, "samples": 500,
            "threshold_ms": 20.0, "saturated": p99_ms > 20.0}


def observations(synth: Any, fault_ttft: float, recovery_ttft: float) -> Any:
    """Baseline TTFT ~50 ms; the fault and recovery phases at the given TTFTs (plus the same noise)."""
    rng = np.random.default_rng(5)
    streams = []
    for phase, start, centre in (("baseline", 0, 0.05), ("fault", 5, fault_ttft), ("recovery", 10, recovery_ttft)):
        streams += [
            synth.stream(f"{phase}{i}", phase=phase, sent=start + i * 0.1, ttft=centre + rng.uniform(0, 0.004))
            for i in range(40)
        ]
    phases = [synth.phase("baseline", 0, 5), synth.phase("fault", 5, 10), synth.phase("recovery", 10, 15)]
    return synth.obs(streams, phases=phases)


def by_name(verdicts: list[Any]) -> dict[str, Any]:
    return {v.name: v for v in verdicts}


def test_failure_within_the_client_lag_is_inconclusive(synth: Any) -> None:
    # TTFT 110 ms vs a 100 ms budget, recovery at 92 ms vs 1.5 x 50 ms (+ recovery's 10 ms slack): both a
    # few ms over, with a client 30 ms late
    verdicts = by_name(judge_all(parse_experiment(EXPERIMENT), observations(synth, 0.110, 0.092), client_lag=lag(30.0)))
    for name in ("ttft", "recovery"):
        assert verdicts[name].status == "inconclusive", verdicts[name]
        assert verdicts[name].evidence["inconclusive_cause"] == "load generator saturated"
    assert verdicts["errors"].status == "pass"


def test_failure_beyond_the_client_lag_stays_a_failure(synth: Any) -> None:
    # 400 ms TTFT and a recovery median 300 ms late: a client 30 ms late cannot explain either
    verdicts = by_name(judge_all(parse_experiment(EXPERIMENT), observations(synth, 0.400, 0.300), client_lag=lag(30.0)))
    assert verdicts["ttft"].status == "fail"
    assert verdicts["recovery"].status == "fail"
    assert verdicts["recovery"].evidence["excess_s"] == pytest.approx(0.300 - 0.05 * 1.5, abs=0.005)
    assert "inconclusive_cause" not in verdicts["recovery"].evidence


def test_a_healthy_client_never_downgrades_a_failure(synth: Any) -> None:
    verdicts = by_name(judge_all(parse_experiment(EXPERIMENT), observations(synth, 0.110, 0.092), client_lag=lag(5.0)))
    assert verdicts["ttft"].status == "fail"
    assert verdicts["recovery"].status == "fail"


def test_non_timing_failures_are_never_excused(synth: Any) -> None:
    obs = observations(synth, 0.05, 0.05)
    obs.streams[3].error = ErrorInfo("http", "server error", 500)
    verdicts = by_name(judge_all(parse_experiment(EXPERIMENT), obs, client_lag=lag(500.0)))
    assert verdicts["errors"].status == "fail"


def test_goodput_and_fluidity_failures_under_a_saturated_client_are_inconclusive(synth: Any) -> None:
    # every fault-phase TTFT is 110 ms against a 100 ms objective: a client 30 ms late could be why
    exp = parse_experiment(EXPERIMENT.replace(
        "  - {kind: errors, budget: 0%}\n",
        "  - {kind: goodput, phases: [fault], ttft: 100ms, min_share: 90%}\n"
        "  - {kind: fluidity, phases: [fault], pace: 20ms, ttft: 100ms, max_missed_run: 1}\n"))
    obs = observations(synth, 0.110, 0.080)
    saturated = by_name(judge_all(exp, obs, client_lag=lag(30.0)))
    healthy = by_name(judge_all(exp, obs, client_lag=lag(5.0)))
    for name in ("goodput", "fluidity"):
        assert healthy[name].status == "fail", healthy[name]
        assert saturated[name].status == "inconclusive", saturated[name]
        assert saturated[name].evidence["inconclusive_cause"] == "load generator saturated"


def test_goodput_and_fluidity_misses_far_beyond_the_client_lag_stay_failures(synth: Any) -> None:
    # 400 ms TTFTs against a 100 ms objective: 300 ms past it, a client 30 ms late cannot explain
    exp = parse_experiment(EXPERIMENT.replace(
        "  - {kind: errors, budget: 0%}\n",
        "  - {kind: goodput, phases: [fault], ttft: 100ms, min_share: 90%}\n"
        "  - {kind: fluidity, phases: [fault], pace: 20ms, ttft: 100ms, max_missed_run: 1}\n"))
    verdicts = by_name(judge_all(exp, observations(synth, 0.400, 0.080), client_lag=lag(30.0)))
    assert (verdicts["goodput"].status == "fail"
            and verdicts["goodput"].evidence["excess_s"] == pytest.approx(0.3, abs=0.005))
    assert (verdicts["fluidity"].status == "fail"
            and verdicts["fluidity"].evidence["excess_s"] == pytest.approx(0.3, abs=0.005))


def test_a_long_stall_among_many_slightly_late_tokens_stays_a_failure(synth: Any) -> None:
    # container-freeze on a busy box: every stream's tokens run a few ms past a 50 ms pace (slack
    # gone, a miss every few tokens) and one 2 s freeze stops each stream: 40 deadlines in a row.
    # The median late token is a few ms late, which a 30 ms client lag could explain; the freeze
    # is 1.5 s past a 10-deadline budget, which it cannot.
    exp = parse_experiment(EXPERIMENT.replace(
        "  - {kind: errors, budget: 0%}\n",
        "  - {kind: fluidity, phases: [fault], pace: 50ms, ttft: 500ms, max_missed_run: 10}\n"))
    gaps = [0.052] * 59
    gaps[30] = 2.0
    streams = [synth.stream(f"fault{i}", phase="fault", sent=5 + i * 0.1, ttft=0.4, tokens=60, gaps=gaps)
               for i in range(20)]
    obs = synth.obs(streams, phases=[synth.phase("baseline", 0, 5), synth.phase("fault", 5, 10),
                                     synth.phase("recovery", 10, 15)])
    verdict = by_name(judge_all(exp, obs, client_lag=lag(30.0)))["fluidity"]
    assert verdict.status == "fail", verdict
    assert verdict.evidence["decided_by"] == "missed_run"
    assert verdict.evidence["excess_s"] == pytest.approx((verdict.figure - 10) * 0.05)
    assert verdict.evidence["excess_s"] > 1.0
