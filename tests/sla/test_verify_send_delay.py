"""Coordinated omission made visible: the saturated-client rule also keys on the open loop's send
delay (the client sending late), phase by phase, and the ttft evidence gives TTFT from the
scheduled time beside TTFT from the send."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from chaos.execution.verify import client_lateness, judge_all
from chaos.experiment.loader import parse_experiment

pytestmark = pytest.mark.timeout(30)

EXPERIMENT = """
name: send-delay
phases:
  - {name: baseline, duration: 5s}
  - {name: fault, duration: 5s}
sla:
  - {kind: ttft, phases: [fault], quantile: p50, budget: 100ms}
  - {kind: errors, budget: 0%}
"""


def client(send_p99_ms: dict[str, float], loop_p99_ms: float = 5.0) -> dict[str, Any]:
    """A client_lag note: the event loop healthy (below the 20 ms threshold) unless told otherwise."""
    return {"p50_ms": 1.0, "p99_ms": loop_p99_ms, "max_ms": loop_p99_ms * 2, "samples": 500, "threshold_ms": 20.0,
            "saturated": loop_p99_ms > 20.0,
            "send_delay": {p: {"p50_ms": v / 4, "p99_ms": v, "max_ms": v * 2, "samples": 40}
                           for p, v in send_p99_ms.items()}}


def observations(synth: Any, fault_ttft: float) -> Any:
    rng = np.random.default_rng(3)
    streams = []
    for phase, start, centre in (("baseline", 0, 0.05), ("fault", 5, fault_ttft)):
        streams += [synth.stream(f"{phase}{i}", phase=phase, sent=start + i * 0.1, ttft=centre + rng.uniform(0, 0.004))
                    for i in range(40)]
    return synth.obs(streams, phases=[synth.phase("baseline", 0, 5), synth.phase("fault", 5, 10)])


def verdict(synth: Any, fault_ttft: float, lag: dict[str, Any]) -> Any:
    verdicts = judge_all(parse_experiment(EXPERIMENT), observations(synth, fault_ttft), client_lag=lag)
    return next(v for v in verdicts if v.sla == "ttft")


def test_a_late_sending_client_makes_a_near_miss_inconclusive(synth: Any) -> None:
    # 110 ms against 100 ms, sent up to 40 ms late (p99) in that phase: the client can explain it
    v = verdict(synth, 0.110, client({"fault": 40.0}))
    assert v.status == "inconclusive", v
    assert v.evidence["inconclusive_cause"] == "load generator saturated"
    assert "send delay p99 40.0ms > 20ms" in v.evidence["saturated_because"]


def test_a_late_sending_client_never_excuses_a_large_failure(synth: Any) -> None:
    assert verdict(synth, 0.400, client({"fault": 40.0})).status == "fail"


def test_the_send_delay_is_judged_in_the_verdicts_own_phase(synth: Any) -> None:
    # late only in the baseline: the fault phase's near miss is the server's
    assert verdict(synth, 0.110, client({"baseline": 40.0})).status == "fail"


def test_an_on_time_client_changes_nothing(synth: Any) -> None:
    assert verdict(synth, 0.110, client({"fault": 3.0})).status == "fail"
    assert client_lateness(client({"fault": 3.0}), "fault") == (False, 0.005, "")
    saturated, late_s, why = client_lateness(client({"fault": 3.0}, loop_p99_ms=30.0), None)
    assert saturated and late_s == pytest.approx(0.030) and why.startswith("event-loop lag p99 30.0ms")


def test_ttft_evidence_gives_the_schedule_delay_and_ttft_from_the_schedule(synth: Any) -> None:
    streams = []
    for i in range(40):
        st = synth.stream(f"s{i}", phase="fault", sent=5 + i * 0.1, ttft=0.05)
        assert st.t_sent is not None
        st.t_scheduled = st.t_sent - (0 if i % 2 else 30_000_000)  # half of them sent 30 ms late
        streams.append(st)
    obs = synth.obs(streams, phases=[synth.phase("fault", 5, 10)])
    v = next(v for v in judge_all(parse_experiment(EXPERIMENT), obs) if v.sla == "ttft")
    assert v.evidence["ttft"]["p99"] == pytest.approx(0.05, abs=1e-6)  # from the send: the delay hidden
    assert v.evidence["schedule_delay"]["p99"] == pytest.approx(0.030, abs=1e-6)
    assert v.evidence["ttft_from_scheduled"]["p99"] == pytest.approx(0.080, abs=1e-6)
    closed = synth.obs([synth.stream(f"c{i}", phase="fault", sent=5 + i * 0.1) for i in range(10)],
                       phases=[synth.phase("fault", 5, 10)])
    assert "schedule_delay" not in next(v for v in judge_all(parse_experiment(EXPERIMENT), closed)
                                        if v.sla == "ttft").evidence
