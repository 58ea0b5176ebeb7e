"""`tool_calls`: streamed tool calls must assemble into calls a client can run.

On synthetic records: whole calls pass; arguments that are no JSON object, a call without id or name,
protocol breaks and a tool_calls finish without a call fail, naming the streams; streams cut mid-call are
left to early_close. Against real processes: tests/e2e/test_tool_call_servers.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import sla
from chaos.model.observations import ErrorInfo, StreamRecord
from sla.tool_calls import tool_call_problems

pytestmark = pytest.mark.timeout(60)

HERE = Path(__file__).parent
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]


def tool_stream(synth: Any, sid: str, arguments: str = '{"q": "x"}', **call: Any) -> StreamRecord:
    st = synth.stream(sid, tokens=0, ttft=None, finish="tool_calls")
    stamps = [synth.ns(0.1), synth.ns(0.2)]
    entry = {"id": f"call_{sid}", "name": "search", "arguments": arguments, **call}
    out: StreamRecord = replace(st, t_tool_calls=stamps, tool_calls={"0": entry}, t_end=stamps[-1] + 1000)
    return out


def test_whole_calls_pass_and_streams_without_calls_are_not_judged(synth: Any) -> None:
    streams = [tool_stream(synth, f"t{i}") for i in range(5)] + [synth.stream("plain")]
    verdict = sla.judge(synth.obs(streams), "tool_calls")
    assert verdict.status == "pass" and verdict.samples == 5 and verdict.figure == 0.0
    assert verdict.evidence["calls"] == 5 and verdict.evidence["fragments"] == 10


@pytest.mark.parametrize("broken, problem", [
    ({"arguments": '{"q": "trunc'}, "invalid_json"),
    ({"arguments": '"q": "x"}'}, "invalid_json"),
    ({"arguments": "[1, 2]"}, "not_an_object"),
    ({"id": ""}, "missing_id"),
    ({"name": ""}, "missing_name"),
])
def test_a_call_that_does_not_assemble_fails_naming_the_stream(synth: Any, broken: dict[str, Any],
                                                                problem: str) -> None:
    streams = [tool_stream(synth, f"t{i}") for i in range(9)] + [tool_stream(synth, "bad", **broken)]
    verdict = sla.judge(synth.obs(streams), "tool_calls")
    assert verdict.status == "fail" and verdict.figure == pytest.approx(0.1)
    assert verdict.evidence["bad_ids"] == ["bad"] and verdict.evidence["by_problem"] == {problem: 1}
    assert verdict.evidence["offenders"][0]["calls"]["0"]["name"] == broken.get("name", "search")
    # a tolerated share passes
    assert sla.judge(synth.obs(streams), "tool_calls", {"budget": "10%"}).status == "pass"


def test_protocol_breaks_and_a_finish_without_a_call_fail(synth: Any) -> None:
    broke = replace(tool_stream(synth, "broke"), tool_call_errors=2)
    empty = replace(synth.stream("empty", tokens=0, ttft=None), finish_reason="tool_calls")
    assert tool_call_problems(broke) == ["protocol_errors"] and tool_call_problems(empty) == ["no_call"]
    verdict = sla.judge(synth.obs([broke, empty, tool_stream(synth, "ok")]), "tool_calls")
    assert verdict.status == "fail" and verdict.evidence["bad"] == 2
    assert verdict.evidence["by_problem"] == {"protocol_errors": 1, "no_call": 1}


def test_a_stream_cut_mid_call_is_left_to_early_close_and_none_at_all_is_inconclusive(synth: Any) -> None:
    cut = replace(tool_stream(synth, "cut", arguments='{"q": "hal'), finish_reason=None, done_seen=False,
                  error=ErrorInfo("read", "reset", cause="reset"))
    verdict = sla.judge(synth.obs([cut, tool_stream(synth, "ok")]), "tool_calls")
    assert verdict.status == "pass" and verdict.evidence["incomplete_excluded"] == 1
    none = sla.judge(synth.obs([synth.stream("plain"), cut]), "tool_calls")
    assert none.status == "inconclusive" and "no complete stream carried a tool call" in none.evidence["reason"]
