"""`ttft` to the first token or to the first visible output, and `itl` within reasoning or content, on synthetic
reasoning streams: a long reasoning phase passes the first and fails the second; a stall inside the reasoning
phase fails `itl` within reasoning and leaves it within content passing; streams without reasoning keep
today's figures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import sla
from chaos.model.observations import ErrorInfo, StreamRecord
from sla.definitions import definition_line, e2e_ns, output_tokens, tpot_ns, ttst_ns

pytestmark = pytest.mark.timeout(30)


def reasoning(synth: Any, id: str, *, think: int, sent: float = 0.0, gaps: list[float] | None = None,
              tokens: int = 20, **extra: Any) -> StreamRecord:
    """A stream whose first ``think`` token events are reasoning, the rest content."""
    st = synth.stream(id, sent=sent, tokens=tokens, gaps=gaps, **extra)
    stamps = st.t_content
    out: StreamRecord = replace(st, t_reasoning=stamps[:think], t_content=stamps[think:],
                                t_first_content=stamps[think] if len(stamps) > think else None,
                                reasoning_text="r" * think)
    return out


def test_ttft_to_token_counts_reasoning_and_to_output_waits_for_the_answer(synth: Any) -> None:
    # 0.1 s to the first reasoning token, 30 reasoning tokens 40 ms apart: the answer starts 1.3 s in
    streams = [reasoning(synth, f"r{i}", think=30, sent=0.05 * i, tokens=40, itl=0.04) for i in range(40)]
    obs = synth.obs(streams)
    token = sla.judge(obs, "ttft", {"quantile": "p50", "budget": "500ms"})
    output = sla.judge(obs, "ttft", {"quantile": "p50", "budget": "500ms", "to": "output"})
    assert token.status == "pass" and token.figure == pytest.approx(0.1)
    assert output.status == "fail" and output.figure == pytest.approx(0.1 + 30 * 0.04)
    assert token.evidence["to"] == "token" and "t_first_token - t_sent" in token.evidence["definition"]
    assert output.evidence["to"] == "output" and "t_first_output - t_sent" in output.evidence["definition"]
    assert "AIPerf Time to First Output Token (TTFO)" in output.evidence["definition"]
    # each shows the other clock beside its own
    assert token.evidence["reasoning_streams"] == 40
    assert token.evidence["ttfo"]["p50"] == pytest.approx(1.3)
    assert output.evidence["ttft_any_token"]["p50"] == pytest.approx(0.1)
    for st in streams:
        assert st.ttft_ns is not None and st.ttfo_ns is not None and st.ttft_ns < st.ttfo_ns


def test_a_reasoning_stream_cut_before_its_answer_has_a_first_token_and_no_output(synth: Any) -> None:
    cut = reasoning(synth, "cut", think=30, tokens=30, itl=0.05, finish=None, done=False,
                    error=ErrorInfo("read", "connection reset", cause="reset"))
    assert cut.t_first_token is not None and cut.t_first_output is None
    healthy = [reasoning(synth, f"r{i}", think=2, sent=0.1 * i, tokens=10) for i in range(20)]
    obs = synth.obs([*healthy, cut])
    token = sla.judge(obs, "ttft", {"quantile": "p99", "budget": "1s"})
    output = sla.judge(obs, "ttft", {"quantile": "p99", "budget": "1s", "to": "output"})
    assert token.samples == 21 and token.evidence["no_content"] == 0
    # to output it waited 1.55 s for an answer that never came: censored past the budget, counted over it
    assert output.samples == 21 and output.evidence["censored_over_budget"] == 1


def test_a_stream_whose_only_output_was_a_tool_call_is_not_empty(synth: Any) -> None:
    st = synth.stream("tool", tokens=0, ttft=None)
    stamps = [synth.ns(0.2), synth.ns(0.25), synth.ns(0.3)]
    st = replace(st, t_tool_calls=stamps, finish_reason="tool_calls", t_end=stamps[-1] + 1000,
                 tool_calls={"0": {"id": "c", "name": "f", "arguments": "{}"}})
    assert st.t_first_output == st.t_first_token == stamps[0]
    verdict = sla.judge(synth.obs([st]), "ttft", {"quantile": "p50", "budget": "1s", "to": "output"})
    assert verdict.samples == 1 and verdict.figure == pytest.approx(0.2) and verdict.evidence["no_content"] == 0
    assert output_tokens(st) == 3 and e2e_ns(st) == stamps[-1] - st.t_sent


def test_a_stall_inside_the_reasoning_phase_fails_itl_within_reasoning_only(synth: Any) -> None:
    stalled = [0.02] * 5 + [2.0] + [0.02] * 14  # the 6th reasoning gap: 2 s, then 10 reasoning and 10 content
    streams = [reasoning(synth, f"r{i}", think=16, sent=0.1 * i, tokens=30, itl=0.02) for i in range(20)]
    streams.append(reasoning(synth, "stalled", think=16, sent=0.5, tokens=21, gaps=stalled))
    obs = synth.obs(streams)
    params = {"quantile": "p90", "budget": "100ms", "max_stall": "500ms"}
    within_reasoning = sla.judge(obs, "itl", {**params, "within": "reasoning"})
    within_content = sla.judge(obs, "itl", {**params, "within": "content"})
    merged = sla.judge(obs, "itl", params)
    assert within_reasoning.status == "fail" and within_reasoning.evidence["decided_by"] == "max_stall"
    assert within_reasoning.evidence["longest_stall_stream"] == "stalled"
    assert within_reasoning.figure == pytest.approx(2.0) and within_reasoning.evidence["within"] == "reasoning"
    assert within_content.status == "pass" and within_content.evidence["longest_stall_s"] == pytest.approx(0.02)
    assert merged.status == "fail" and merged.evidence["within"] == "all"  # the default sees the stall too
    assert within_reasoning.samples == 20 * 15 + 15 and within_content.samples == 20 * 13 + 4


def test_streams_without_reasoning_keep_todays_figures(synth: Any) -> None:
    streams = [synth.stream(f"r{i}", sent=0.1 * i, tokens=11, itl=0.03) for i in range(10)]
    obs = synth.obs(streams)
    assert sla.judge(obs, "itl", {"budget": "1s"}).samples == sla.judge(obs, "itl", {"budget": "1s",
                                                                                      "within": "content"}).samples
    assert sla.judge(obs, "itl", {"budget": "1s", "within": "reasoning"}).samples == 0
    token = sla.judge(obs, "ttft", {"quantile": "p50", "budget": "1s"})
    assert token.figure == sla.judge(obs, "ttft", {"quantile": "p50", "budget": "1s", "to": "output"}).figure
    st = streams[0]
    assert ttst_ns(st) == st.t_content[1] - st.t_content[0] and tpot_ns(st) == pytest.approx(0.03e9)
    assert "reasoning_streams" not in token.evidence


def test_the_definitions_say_which_first_token() -> None:
    assert definition_line("ttft").startswith("ttft = t_first_token - t_sent")
    assert definition_line("ttfo").startswith("ttfo = t_first_output - t_sent")
    assert "within" in definition_line("itl")


@pytest.mark.parametrize("params, message", [
    ({"budget": "1s", "to": "content"}, "expected one of token, output"),
    ({"budget": "1s", "within": "tools"}, "expected one of all, reasoning, content"),
])
def test_unknown_choices_are_refused_naming_the_right_ones(params: dict[str, Any], message: str) -> None:
    kind = "ttft" if "to" in params else "itl"
    with pytest.raises(Exception, match=message):
        sla.spec_for(kind, params)
