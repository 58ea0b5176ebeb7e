"""What the load client records of reasoning and tool-call chunks (vLLM's and OpenAI's shapes): the bytes of
a stream fed to its parser with the stamps of their reads (pure, no socket), then the record's first-token
and first-output stamps, its reasoning text and its assembled calls, and what a shard or a clock offset
does to the new fields."""

from __future__ import annotations

import json
from typing import Any

import pytest

from chaos.load.client import _Failed, _Stream
from chaos.load.clock import shift_record
from chaos.load.shard_records import stream_record
from chaos.model.observations import StreamRecord, from_json, to_json


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


def feed(reads: list[bytes], max_tokens: int = 32) -> StreamRecord:
    """Each read at t = 100, 200, ... ns after a send at t = 0, then [DONE] and the end of the body."""
    record = StreamRecord(id="r", phase="p", endpoint="chat", max_tokens=max_tokens, t_sent=0)
    state = _Stream(record)
    t = 0
    for raw in [*reads, b"data: [DONE]\n\n"]:
        t += 100
        state.feed(t, raw)
    state.finish(t)
    return record


def call(index: Any = 0, id: str | None = None, name: str | None = None, arguments: Any = None) -> dict[str, Any]:
    fragment: dict[str, Any] = {"index": index} if index is not None else {}
    if id is not None:
        fragment.update(id=id, type="function")
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    if function or name is not None:
        fragment["function"] = function
    return fragment


def test_reasoning_then_content_stamps_first_token_before_first_output() -> None:
    record = feed([chunk({"role": "assistant", "content": ""}), chunk({"reasoning_content": "let me "}),
                   chunk({"reasoning_content": "think"}), chunk({"content": "Hi"}), chunk({"content": "!"}, "stop")])
    assert record.t_reasoning == [200, 300] and record.t_content == [400, 500]
    assert record.reasoning_text == "let me think" and record.text == "Hi!"
    assert record.t_first_token == 200 and record.t_first_output == record.t_first_content == 400
    assert (record.ttft_ns, record.ttfo_ns) == (200, 400)
    assert record.t_tokens == [200, 300, 400, 500] and record.token_events == 4
    assert record.gaps_ns == [100, 100, 100] and record.gaps_within("reasoning") == [100]
    assert record.gaps_within("content") == [100] and record.finish_reason == "stop"


def test_the_newer_reasoning_field_counts_and_the_two_together_count_once() -> None:
    record = feed([chunk({"reasoning": "a"}), chunk({"reasoning_content": "b", "reasoning": "b"}),
                   chunk({"reasoning_content": None, "content": "c"}, "stop")])
    assert record.reasoning_text == "ab" and record.t_reasoning == [100, 200] and record.text == "c"


def test_a_stream_without_reasoning_keeps_todays_figures() -> None:
    record = feed([chunk({"role": "assistant", "content": ""}), chunk({"content": "a"}),
                   chunk({"content": "b"}, "stop")])
    assert record.t_first_token == record.t_first_output == record.t_first_content == 200
    assert record.ttft_ns == record.ttfo_ns == 200 and record.gaps_ns == [100] and record.tool_calls is None


def test_tool_call_fragments_assemble_by_index_into_json_arguments() -> None:
    record = feed([
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [call(0, id="call_a", name="search", arguments="")]}),
        chunk({"tool_calls": [call(0, arguments='{"q": "new')]}),
        chunk({"tool_calls": [call(0, arguments=' york"}'), call(1, id="call_b", name="clock", arguments="{}")]}),
        chunk({}, "tool_calls"),
    ])
    assert record.t_tool_calls == [200, 300, 400] and record.tool_call_errors == 0
    assert record.tool_calls == {"0": {"id": "call_a", "name": "search", "arguments": '{"q": "new york"}'},
                                 "1": {"id": "call_b", "name": "clock", "arguments": "{}"}}
    assert json.loads(record.tool_calls["0"]["arguments"]) == {"q": "new york"}
    # a stream whose only output was a tool call is not empty: it has a first token and a first output
    assert record.t_content == [] and record.t_first_output == record.t_first_token == 200
    assert record.finish_reason == "tool_calls"


@pytest.mark.parametrize("fragment, what", [
    (call(None, arguments="x"), "a fragment without an index"),
    (call("0", arguments="x"), "an index that is not an integer"),
    (call(0, name="other"), "a name changed mid-call"),
    (call(0, id="call_z"), "an id changed mid-call"),
    (call(0, arguments={"q": 1}), "arguments that are not a string"),
    ("not an object", "a fragment that is not an object"),
])
def test_protocol_breaks_are_counted_and_left_out(fragment: Any, what: str) -> None:
    record = feed([chunk({"tool_calls": [call(0, id="call_a", name="search", arguments='{"q": ')]}),
                   chunk({"tool_calls": [fragment]}), chunk({"tool_calls": [call(0, arguments='"x"}')]}, "tool_calls")])
    assert record.tool_call_errors == 1, what
    assert record.tool_calls is not None and record.tool_calls["0"]["name"] == "search"
    assert record.tool_calls["0"]["id"] == "call_a" and len(record.t_tool_calls) == 3


def test_a_repeated_name_is_tolerated_and_tool_calls_that_are_not_a_list_are_a_break() -> None:
    record = feed([chunk({"tool_calls": [call(0, id="call_a", name="f", arguments="{")]}),
                   chunk({"tool_calls": [call(0, name="f", arguments="}")]}),
                   chunk({"tool_calls": {"index": 0}}), chunk({"tool_calls": []}, "tool_calls")])
    assert record.tool_call_errors == 1 and record.tool_calls == {"0": {"id": "call_a", "name": "f", "arguments": "{}"}}
    assert len(record.t_tool_calls) == 2


def test_reasoning_and_arguments_share_the_content_budget() -> None:
    with pytest.raises(_Failed, match="content overflow"):
        feed([chunk({"reasoning_content": "x" * 5000})], max_tokens=1)
    with pytest.raises(_Failed, match="content overflow"):
        feed([chunk({"tool_calls": [call(0, id="c", name="f", arguments="y" * 5000)]})], max_tokens=1)
    record = feed([chunk({"tool_calls": [call(i, id=f"c{i}", name="f", arguments="{}") for i in range(70)]})])
    assert record.tool_calls is not None and len(record.tool_calls) == 64 and record.tool_call_errors == 6


def test_the_new_fields_survive_the_journal_a_shard_and_a_clock_offset() -> None:
    record = feed([chunk({"reasoning_content": "r"}), chunk({"tool_calls": [call(0, id="c", name="f", arguments="{}")]},
                                                             "tool_calls")])
    assert from_json(to_json(record)) == record
    assert stream_record(json.loads(to_json(record))) == record
    moved = shift_record(record, 1000)
    assert moved.t_reasoning == [1100] and moved.t_tool_calls == [1200] and moved.ttft_ns == record.ttft_ns
