"""`errors` on synthetic observations: 5xx and in-band errors fail it, hang-ups do not count."""

from __future__ import annotations

from typing import Any

import pytest

import sla

pytestmark = pytest.mark.timeout(30)


def test_server_errors_fail_with_a_breakdown(synth: Any, err: dict[str, Any]) -> None:
    streams = [synth.stream(f"ok{i}") for i in range(17)]
    streams += [
        synth.stream(f"e{i}", ttft=None, status=503, error=err["503"], finish=None, done=False) for i in range(2)
    ]
    streams.append(synth.stream("band", in_band="Internal server error"))
    verdict = sla.judge(synth.obs(streams), "errors", {})
    assert verdict.status == "fail"
    assert verdict.figure == pytest.approx(3 / 20)
    assert verdict.unit == "fraction"
    assert verdict.evidence["by_kind"] == {"http": 2, "in_band": 1}
    assert verdict.evidence["by_status"] == {"503": 2, "200": 1}
    assert [f["id"] for f in verdict.evidence["first"]] == ["e0", "e1", "band"]
    assert verdict.evidence["first"][2]["message"] == "Internal server error"


def test_transport_errors_count_under_their_kind(synth: Any, err: dict[str, Any]) -> None:
    streams = [synth.stream("ok"), synth.stream("t", ttft=None, status=None, error=err["timeout"], finish=None)]
    verdict = sla.judge(synth.obs(streams), "errors", {"budget": "60%"})
    assert verdict.status == "pass"
    assert verdict.figure == pytest.approx(0.5)
    assert verdict.evidence["by_kind"] == {"timeout": 1}
    assert verdict.evidence["by_status"] == {"none": 1}


def test_clean_run_with_hangups_passes(synth: Any) -> None:
    streams = [synth.stream(f"ok{i}") for i in range(10)] + [synth.stream("h", hangup_after=0.05)]
    verdict = sla.judge(synth.obs(streams), "errors", {})
    assert verdict.status == "pass"
    assert verdict.figure == 0.0
    assert verdict.samples == 10
    assert verdict.evidence["hung_up_excluded"] == 1


def test_no_streams_is_inconclusive(synth: Any) -> None:
    verdict = sla.judge(synth.obs([synth.stream("h", hangup_after=0.05)]), "errors", {})
    assert verdict.status == "inconclusive"
    assert verdict.figure is None
