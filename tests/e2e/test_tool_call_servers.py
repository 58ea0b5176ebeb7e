"""`tool_calls` against real processes: the load client reads the builtin stack's streamed calls and the
verdict passes; a planted server (tests/e2e/planted_tool_calls.py) that truncates, corrupts or renames its
calls fails it, while its streams end cleanly."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import sla
from chaos.load.client import make_http_client, stream_request
from chaos.model.observations import Observations, StreamRecord
from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)

HERE = Path(__file__).parent
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]


def observed(records: list[StreamRecord]) -> Observations:
    return Observations(experiment="tool-calls", t0=min(r.t_sent or 0 for r in records), streams=records)


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


def test_the_builtin_stacks_calls_assemble_and_pass(builtin: StackProcess) -> None:
    records = collect(builtin.base_url)
    for rec in records:
        assert rec.complete and rec.finish_reason == "tool_calls" and rec.tool_call_errors == 0, rec
        assert rec.tool_calls is not None and rec.tool_calls["0"]["name"] == "search"
        assert rec.t_first_output == rec.t_tool_calls[0]
        if rec.t_reasoning:  # (none when its few reasoning tokens were bytes of a character the answer completes)
            assert rec.t_first_token == rec.t_reasoning[0] and rec.t_reasoning[-1] <= rec.t_first_output
    assert any(rec.t_reasoning for rec in records)
    verdict = sla.judge(observed(records), "tool_calls")
    assert verdict.status == "pass" and verdict.samples == len(records), verdict.evidence


@pytest.mark.parametrize("defect, problem", [("truncate", "invalid_json"), ("corrupt", "invalid_json"),
                                             ("rename", "protocol_errors")])
def test_a_server_that_breaks_its_calls_fails_the_verdict(defect: str, problem: str) -> None:
    with planted(defect) as server:
        records = collect(server.base_url)
    assert all(rec.complete and rec.finish_reason == "tool_calls" for rec in records)  # the streams end cleanly
    verdict = sla.judge(observed(records), "tool_calls")
    assert verdict.status == "fail" and verdict.figure == 1.0, verdict.evidence
    assert verdict.evidence["by_problem"] == {problem: len(records)}
    assert verdict.evidence["bad_ids"] == [rec.id for rec in records]
    print(f"{defect}: {verdict.evidence['reason']}; first: {verdict.evidence['offenders'][0]['calls']}")
