"""`early_close` on synthetic observations: streams cut without [DONE] fail it; hang-ups on purpose do not count."""

from __future__ import annotations

from typing import Any

import pytest

import sla

pytestmark = pytest.mark.timeout(30)


def test_streams_without_done_fail(synth: Any) -> None:
    good = [synth.stream(f"ok{i}") for i in range(7)]
    cut = [synth.stream(f"cut{i}", finish=None, done=False) for i in range(3)]  # EOF mid-stream
    verdict = sla.judge(synth.obs(good + cut), "early_close", {})
    assert verdict.status == "fail"
    assert verdict.figure == pytest.approx(0.3)
    assert verdict.budget == 0.0
    assert verdict.unit == "fraction"
    assert [o["id"] for o in verdict.evidence["offenders"]] == ["cut0", "cut1", "cut2"]
    assert verdict.evidence["offenders"][0]["why"] == ["no_finish_reason", "no_done"]
    assert verdict.evidence["by_reason"] == {"no_finish_reason": 3, "no_done": 3}


def test_done_after_an_in_band_error_is_not_complete(synth: Any) -> None:
    # vLLM and TGI send an error event and then [DONE]: [DONE] alone proves nothing
    streams = [synth.stream("ok"), synth.stream("err", finish="stop", done=True, in_band="Internal server error")]
    verdict = sla.judge(synth.obs(streams), "early_close", {})
    assert verdict.status == "fail"
    assert verdict.evidence["offenders"] == [{"id": "err", "why": ["error_event"], "cause": "error_event"}]


def test_finish_reason_without_done_is_incomplete(synth: Any) -> None:
    verdict = sla.judge(synth.obs([synth.stream("a", finish="length", done=False)]), "early_close", {})
    assert verdict.status == "fail"
    assert verdict.evidence["offenders"][0]["why"] == ["no_done"]


def test_clean_streams_pass_and_hangups_are_counted_apart(synth: Any) -> None:
    streams = [synth.stream(f"ok{i}") for i in range(10)]
    streams += [synth.stream(f"h{i}", tokens=50, hangup_after=0.3) for i in range(5)]
    verdict = sla.judge(synth.obs(streams), "early_close", {})
    assert verdict.status == "pass"
    assert verdict.figure == 0.0
    assert verdict.samples == 10
    assert verdict.evidence["hung_up_excluded"] == 5


def test_budget_allows_a_share(synth: Any, err: dict[str, Any]) -> None:
    streams = [synth.stream(f"ok{i}") for i in range(9)]
    streams.append(synth.stream("reset", finish=None, done=False, error=err["read"]))
    verdict = sla.judge(synth.obs(streams), "early_close", {"budget": "10%"})
    assert verdict.status == "pass"
    assert verdict.figure == pytest.approx(0.1)
    assert verdict.evidence["offenders"][0]["why"] == ["read_error", "no_finish_reason", "no_done"]
    assert verdict.evidence["offenders"][0]["error"] == "connection reset by peer"


def test_http_errors_are_named_once(synth: Any, err: dict[str, Any]) -> None:
    failed = synth.stream("e", ttft=None, status=503, error=err["503"], finish=None, done=False)
    verdict = sla.judge(synth.obs([failed]), "early_close", {})
    assert verdict.status == "fail"
    assert verdict.evidence["offenders"][0]["why"] == ["http_error", "no_finish_reason", "no_done"]


def test_only_hangups_or_too_few_streams_is_inconclusive(synth: Any) -> None:
    only_hangups = synth.obs([synth.stream(f"h{i}", hangup_after=0.2) for i in range(5)])
    verdict = sla.judge(only_hangups, "early_close", {})
    assert verdict.status == "inconclusive"
    assert verdict.figure is None
    few = synth.obs([synth.stream(f"ok{i}") for i in range(5)])
    assert sla.judge(few, "early_close", {"min_samples": 20}).status == "inconclusive"


def test_the_runs_end_rule_applies_an_engine_without_done_is_complete(synth: Any, err: dict[str, Any]) -> None:
    """transformers serve never sends [DONE]: under its profile's rule (recorded in the journal as the
    engine_profile note), a stream with a finish_reason that ended cleanly is complete; a cut one is not."""
    rule = synth.note("engine_profile", 0.0, name="transformers-serve", end={"finish_reason": True, "done": False})
    ended = [synth.stream(f"ok{i}", finish="length", done=False) for i in range(5)]
    cut = synth.stream("cut", finish=None, done=False, error=None)
    failed = synth.stream("reset", finish="length", done=False, error=err["read"])
    obs = synth.obs(ended + [cut, failed], notes=[rule])
    verdict = sla.judge(obs, "early_close", {})
    assert verdict.evidence["by_reason"] == {"no_finish_reason": 1, "read_error": 1}
    assert verdict.figure == pytest.approx(2 / 7)
    assert "not required" in verdict.evidence["end_rule"]
    # the same streams without the note: the strict rule, every one of them incomplete
    assert sla.judge(synth.obs(ended + [cut, failed]), "early_close", {}).figure == pytest.approx(1.0)
