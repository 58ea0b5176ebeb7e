"""`goodput` on synthetic observations: requests must meet every objective at once."""

from __future__ import annotations

from typing import Any

import pytest

import sla
from chaos.model.observations import ErrorInfo, Hangup, StreamRecord
from sla.goodput import Objectives, request_outcome

pytestmark = pytest.mark.timeout(30)


def test_each_quantile_passes_but_few_requests_meet_both_objectives(synth: Any) -> None:
    # A third of the requests have a slow first token, another third slow decoding. The p50 of
    # TTFT and the p50 of the gaps are both fine; only a third of the requests are good.
    streams = []
    for i in range(120):
        slow_first, slow_decode = i % 3 == 0, i % 3 == 1
        streams.append(synth.stream(f"r{i}", sent=i * 0.05, ttft=0.9 if slow_first else 0.05,
                                    tokens=11, itl=0.08 if slow_decode else 0.01))
    obs = synth.obs(streams)
    assert sla.judge(obs, "ttft", {"quantile": "p50", "budget": "200ms"}).status == "pass"
    assert sla.judge(obs, "itl", {"quantile": "p50", "budget": "50ms"}).status == "pass"
    verdict = sla.judge(obs, "goodput", {"ttft": "200ms", "tpot": "50ms", "min_share": "90%"})
    assert verdict.status == "fail"
    assert verdict.figure == pytest.approx(1 / 3)
    assert verdict.unit == "fraction"
    assert verdict.evidence["misses_by_reason"] == {"ttft": 40, "tpot": 40}
    assert verdict.evidence["upper"] < 0.9
    assert "n_eff" in verdict.evidence and verdict.evidence["n"] == 120


def test_healthy_requests_pass_and_the_rate_is_judged_over_the_window(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", sent=i * 0.05, ttft=0.05, tokens=11, itl=0.01) for i in range(200)]
    obs = synth.obs(streams, phases=[synth.phase("load", 0.0, 10.0)])
    share = sla.judge(obs, "goodput", {"ttft": "200ms", "e2e": "1s", "min_share": "95%"}, "load")
    assert share.status == "pass" and share.figure == 1.0
    rate = sla.judge(obs, "goodput", {"ttft": "200ms", "min_rate": "15/s"}, "load")
    assert rate.status == "pass" and rate.unit == "requests/s"
    assert rate.figure == pytest.approx(20.0)  # 200 good in a 10 s window
    too_much = sla.judge(obs, "goodput", {"ttft": "200ms", "min_rate": "25/s"}, "load")
    assert too_much.status == "fail"  # 20 requests/s were sent: no share of them makes 25/s


def test_errors_incomplete_streams_and_censored_waits_are_misses(synth: Any, err: dict[str, Any]) -> None:
    # one bad request in every four, sent interleaved with the good ones
    good = [synth.stream(f"ok{i}", sent=i * 0.04, ttft=0.05) for i in range(45)]
    failed = [synth.stream(f"e{i}", sent=0.01 + i * 0.16, ttft=None, status=503, error=err["503"], finish=None,
                           done=False) for i in range(5)]
    cut = [synth.stream(f"c{i}", sent=0.81 + i * 0.16, ttft=0.05, finish=None, done=False) for i in range(5)]
    waited = [StreamRecord(id=f"w{i}", phase="load", t_sent=synth.ns(1.21 + i * 0.1), t_end=synth.ns(3.3 + i * 0.1),
                           error=ErrorInfo("timeout", "no byte")) for i in range(5)]
    verdict = sla.judge(synth.obs(good + failed + cut + waited), "goodput", {"ttft": "1s", "min_share": "99%"})
    assert verdict.status == "fail"
    assert verdict.evidence["judged"] == 60 and verdict.evidence["good"] == 45
    reasons = verdict.evidence["misses_by_reason"]
    assert reasons["error:http"] == 5 and reasons["incomplete"] == 5 and reasons["ttft"] == 5
    assert reasons["error:timeout"] == 5
    # the same misses all at the end of the phase (a burst) are worth fewer samples
    burst = [synth.stream(f"b{i}", sent=5 + i * 0.01, ttft=None, status=503, error=err["503"], finish=None, done=False)
             for i in range(15)]
    clustered = sla.judge(synth.obs(good + burst), "goodput", {"ttft": "1s", "min_share": "99%"})
    assert clustered.evidence["n_eff"] < verdict.evidence["n_eff"]


def test_client_hang_ups_are_unknown_unless_an_objective_was_already_missed(synth: Any) -> None:
    base = StreamRecord(id="h", phase="load", t_sent=0, t_first_content=50_000_000, t_content=[50_000_000],
                        t_end=100_000_000, hangup=Hangup("client.disconnect", "after_tokens", 100_000_000))
    assert request_outcome(base, Objectives(ttft=0.2)) == (None, [])
    slow = StreamRecord(id="h2", phase="load", t_sent=0, t_end=3_000_000_000,
                        hangup=Hangup("client.timeout", "read_timeout", 3_000_000_000))
    assert request_outcome(slow, Objectives(ttft=0.5)) == (False, ["ttft"])
    assert request_outcome(slow, Objectives(e2e=2.0)) == (False, ["e2e"])
    assert request_outcome(slow, Objectives(e2e=5.0)) == (None, [])


def test_single_token_requests_meet_tpot_and_no_objectives_means_complete(synth: Any) -> None:
    one = synth.stream("one", ttft=0.05, tokens=1)
    assert request_outcome(one, Objectives(tpot=0.001)) == (True, [])
    usage = synth.stream("u", ttft=0.05, tokens=5, itl=0.05, usage={"completion_tokens": 20})
    # 4 gaps of 50 ms carried 19 tokens: TPOT is 200 ms / 19, not 50 ms
    assert request_outcome(usage, Objectives(tpot=0.02)) == (True, [])
    verdict = sla.judge(synth.obs([synth.stream(f"r{i}") for i in range(100)]), "goodput", {"min_share": "90%"})
    assert verdict.status == "pass" and verdict.evidence["objectives_s"] == {}


def test_exactly_one_of_min_share_and_min_rate() -> None:
    from chaos.model.errors import ExperimentInvalid
    from chaos.model.observations import Observations

    with pytest.raises(ExperimentInvalid, match="exactly one of min_share, min_rate"):
        sla.judge(Observations(), "goodput", {"ttft": "1s"})
    with pytest.raises(ExperimentInvalid, match="exactly one of"):
        sla.judge(Observations(), "goodput", {"min_share": "90%", "min_rate": "1/s"})
    assert sla.judge(Observations(), "goodput", {"min_share": "90%"}).status == "inconclusive"
