"""`integrity` on synthetic observations: U+FFFD, bad framing and wrong text fail it; a clean CJK run passes."""

from __future__ import annotations

from typing import Any

import pytest

import sla

pytestmark = pytest.mark.timeout(30)

REFERENCE = "流式输出 🙂 ストリーミング — naïve café"


def test_replacement_character_fails(synth: Any) -> None:
    streams = [synth.stream("ok", text=REFERENCE), synth.stream("broken", text="流式\ufffd输出")]
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "fail"
    assert verdict.figure == 1.0
    assert verdict.unit == "count"
    assert verdict.evidence["problems"]["replacement_char"] == 1
    assert verdict.evidence["offenders"] == [{"id": "broken", "problems": ["replacement_char"]}]


def test_bad_utf8_json_and_sse_fail_even_on_hung_up_streams(synth: Any) -> None:
    streams = [
        synth.stream("u", utf8_errors=2, hangup_after=0.1),
        synth.stream("j", json_errors=1),
        synth.stream("s", sse_errors=1),
    ]
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "fail"
    assert verdict.figure == 3.0
    problems = verdict.evidence["problems"]
    assert (problems["utf8_errors"], problems["json_errors"], problems["sse_errors"]) == (1, 1, 1)
    assert verdict.evidence["utf8_error_bytes"] == 2


def test_text_different_from_the_reference_fails_with_a_diff(synth: Any) -> None:
    wrong = REFERENCE.replace("🙂", "🙃")
    streams = [
        synth.stream("same", text=REFERENCE, expected=REFERENCE),
        synth.stream("diff", text=wrong, expected=REFERENCE),
    ]
    verdict = sla.judge(synth.obs(streams), "integrity", {})
    assert verdict.status == "fail"
    assert verdict.evidence["problems"]["text_mismatch"] == 1
    diff = verdict.evidence["first_diff"]
    assert diff["id"] == "diff"
    assert diff["at"] == REFERENCE.index("🙂")
    assert "🙂" in diff["expected"] and "🙃" in diff["got"]


def test_cut_streams_must_carry_a_prefix_of_the_reference(synth: Any) -> None:
    prefix_ok = synth.stream("h1", text=REFERENCE[:5], expected=REFERENCE, hangup_after=0.1)
    cut_ok = synth.stream("c1", text=REFERENCE[:9], expected=REFERENCE, finish=None, done=False)
    assert sla.judge(synth.obs([prefix_ok, cut_ok]), "integrity", {}).status == "pass"
    garbled = synth.stream("h2", text="流式输入", expected=REFERENCE, hangup_after=0.1)
    verdict = sla.judge(synth.obs([prefix_ok, garbled]), "integrity", {})
    assert verdict.status == "fail"
    assert verdict.evidence["problems"]["prefix_mismatch"] == 1


def test_clean_multibyte_run_passes_and_reports_splits(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", text=REFERENCE, expected=REFERENCE, split_chars=i) for i in range(5)]
    verdict = sla.judge(synth.obs(streams), "integrity", {"require_reference": True})
    assert verdict.status == "pass"
    assert verdict.figure == 0.0
    assert verdict.evidence["split_chars"] == 0 + 1 + 2 + 3 + 4
    assert verdict.evidence["compared_with_reference"] == 5


def test_required_reference_missing_is_inconclusive(synth: Any) -> None:
    streams = [synth.stream("r0", text="ok", expected="ok"), synth.stream("r1", text="ok")]
    verdict = sla.judge(synth.obs(streams), "integrity", {"require_reference": True})
    assert verdict.status == "inconclusive"
    assert "r1" in verdict.evidence["reason"]
    assert sla.judge(synth.obs(streams), "integrity", {}).status == "pass"
    assert sla.judge(synth.obs([]), "integrity", {}).status == "inconclusive"
