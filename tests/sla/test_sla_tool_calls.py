"""`tool_calls`: streamed tool calls must assemble into calls a client can run.

On synthetic records: whole calls pass; arguments that are no JSON object, a call without id or name,
protocol breaks and a tool_calls finish without a call fail, naming the streams; streams cut mid-call are
left to early_close. Against real processes: the load client reads the builtin stack's calls and the
verdict passes; a planted server (tests/sla/planted_tool_calls.py) that truncates, corrupts or renames its
calls fails it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import sla
from chaos.load.client import make_http_client, stream_request
from chaos.model.observations import ErrorInfo, StreamRecord
from chaos.stack.process import StackProcess
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


# -- real processes ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def builtin() -> Iterator[StackProcess]:
    with StackProcess.start("--reasoning-tokens", "2,4", timeout=60.0) as served:
        yield served


def planted(defect: str) -> StackProcess:
    return StackProcess.start(command=[sys.executable, str(HERE / "planted_tool_calls.py"), "--defect", defect,
                                       "--port", "0", "--reasoning-tokens", "2,4"], timeout=60.0)


def collect(base_url: str, n: int = 6) -> list[StreamRecord]:
    """``n`` chat streams asking for a call of ``search``, read by the load client, two at a time."""
    async def run() -> list[StreamRecord]:
        records = [StreamRecord(id=f"tc-{i}", phase="load", endpoint="chat", max_tokens=16) for i in range(n)]
        async with make_http_client(2) as http:
            for pair in range(0, n, 2):
                await asyncio.gather(*(stream_request(
                    http, base_url + "/chat/completions",
                    {"model": "tiny", "stream": True, "max_tokens": 16, "ignore_eos": True,
                     "messages": [{"role": "user", "content": f"look up {i} \"quoted\" 世界"}], "tools": TOOLS,
                     "tool_choice": "required"}, rec, headers={"X-Request-Id": rec.id})
                    for i, rec in enumerate(records[pair:pair + 2])))
        return records

    return asyncio.run(run())


def test_the_builtin_stacks_calls_assemble_and_pass(builtin: StackProcess, synth: Any) -> None:
    records = collect(builtin.base_url)
    for rec in records:
        assert rec.complete and rec.finish_reason == "tool_calls" and rec.tool_call_errors == 0, rec
        assert rec.tool_calls is not None and rec.tool_calls["0"]["name"] == "search"
        assert rec.t_first_output == rec.t_tool_calls[0]
        if rec.t_reasoning:  # (none when its few reasoning tokens were bytes of a character the answer completes)
            assert rec.t_first_token == rec.t_reasoning[0] and rec.t_reasoning[-1] <= rec.t_first_output
    assert any(rec.t_reasoning for rec in records)
    verdict = sla.judge(synth.obs(records), "tool_calls")
    assert verdict.status == "pass" and verdict.samples == len(records), verdict.evidence


@pytest.mark.parametrize("defect, problem", [("truncate", "invalid_json"), ("corrupt", "invalid_json"),
                                             ("rename", "protocol_errors")])
def test_a_server_that_breaks_its_calls_fails_the_verdict(defect: str, problem: str, synth: Any) -> None:
    with planted(defect) as server:
        records = collect(server.base_url)
    assert all(rec.complete and rec.finish_reason == "tool_calls" for rec in records)  # the streams end cleanly
    verdict = sla.judge(synth.obs(records), "tool_calls")
    assert verdict.status == "fail" and verdict.figure == 1.0, verdict.evidence
    assert verdict.evidence["by_problem"] == {problem: len(records)}
    assert verdict.evidence["bad_ids"] == [rec.id for rec in records]
    print(f"{defect}: {verdict.evidence['reason']}; first: {verdict.evidence['offenders'][0]['calls']}")
