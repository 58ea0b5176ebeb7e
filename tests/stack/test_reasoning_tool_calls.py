"""The builtin server's reasoning streams (``--reasoning-tokens``) and streamed tool calls, over real sockets:
the wire shape vLLM and OpenAI use, read strictly and by the official openai client; the tokens are the
model's own (the same text whichever field carries it); bad tools are a 400 with OpenAI's error body."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)

REASONING = (6, 10)
TOOLS = [{"type": "function", "function": {
    "name": "search", "description": "look something up",
    "parameters": {"type": "object", "properties": {"limit": {"type": "integer"}, "q": {"type": "string"}},
                   "required": ["limit", "q"]}}},
    {"type": "function", "function": {"name": "other"}}]
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "think, then answer 世界"}], "max_tokens": 24,
        "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def reasoning_stack() -> Iterator[StackProcess]:
    with StackProcess.start("--reasoning-tokens", f"{REASONING[0]},{REASONING[1]}", timeout=60.0) as served:
        yield served


def events(stack: StackProcess, body: dict[str, Any], request_id: str = "r-1") -> list[dict[str, Any]]:
    """The stream's chunks (strict SSE: one JSON data line each, [DONE] last)."""
    with httpx.Client(timeout=30) as client, client.stream("POST", stack.base_url + "/chat/completions", json=body,
                                                             headers={"X-Request-Id": request_id}) as r:
        assert r.status_code == 200, r.read()
        raw = b"".join(r.iter_raw()).decode()
    blocks = raw.split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""], blocks[-3:]
    return [json.loads(b[len("data: "):]) for b in blocks[:-2]]


def deltas(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c["choices"][0]["delta"] for c in chunks if c["choices"]]


def test_a_chat_answer_reasons_first_then_answers_with_the_same_tokens(reasoning_stack: StackProcess) -> None:
    chunks = events(reasoning_stack, CHAT)
    shape = [next(k for k in d if k != "role") if d else "" for d in deltas(chunks)][1:]  # after the role chunk
    n = shape.index("content")
    assert n >= 1 and set(shape[:n]) == {"reasoning_content"} and set(shape[n:]) <= {"content", ""}, shape
    usage = chunks[-1]["usage"]
    reasoned = usage["completion_tokens_details"]["reasoning_tokens"]
    assert REASONING[0] <= reasoned <= REASONING[1] and usage["completion_tokens"] == 24
    # the same forward passes: with thinking off the same request (greedy) streams the same text as content
    plain = events(reasoning_stack, {**CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert all("reasoning_content" not in d for d in deltas(plain))
    assert plain[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    text = "".join(d.get("reasoning_content", "") + d.get("content", "") for d in deltas(chunks))
    assert text == "".join(d.get("content", "") for d in deltas(plain)) and text
    # N is drawn per request id: the same id reasons as long again, in every run
    again = events(reasoning_stack, CHAT)
    assert again[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == reasoned


def test_reasoning_never_takes_the_whole_answer_and_spares_completions(reasoning_stack: StackProcess) -> None:
    short = events(reasoning_stack, {**CHAT, "max_tokens": 3}, "r-short")
    assert short[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] <= 2
    assert any(d.get("content") for d in deltas(short))
    body = {"model": "tiny", "prompt": "plain", "max_tokens": 8, "ignore_eos": True}
    done = httpx.post(reasoning_stack.base_url + "/completions", json=body, timeout=30).json()
    assert "completion_tokens_details" not in done["usage"] and done["choices"][0]["text"]


def test_a_required_tool_choice_streams_one_call_whose_arguments_are_a_json_object(
        reasoning_stack: StackProcess) -> None:
    chunks = events(reasoning_stack, {**CHAT, "tools": TOOLS, "tool_choice": "required"}, "r-tool")
    calls = [d["tool_calls"] for d in deltas(chunks) if "tool_calls" in d]
    head = calls[0][0]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "search", "arguments": ""}
    assert all(set(c[0]) == {"index", "function"} and set(c[0]["function"]) == {"arguments"} for c in calls[1:])
    arguments = "".join(c[0]["function"]["arguments"] for c in calls)
    parsed = json.loads(arguments)
    assert isinstance(parsed, dict) and list(parsed) == ["q"] and parsed["q"]  # the first required string
    assert calls[1][0]["function"]["arguments"].startswith('{"q": "') and calls[-1][0]["function"]["arguments"] == '"}'
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "tool_calls" and all(f is None for f in finishes[:-1])
    # reasoning came first, and one fragment per generated token after it
    usage = chunks[-1]["usage"]
    assert len(calls) - 2 <= usage["completion_tokens"] - usage["completion_tokens_details"]["reasoning_tokens"]


def test_the_openai_client_assembles_the_call_and_a_named_choice_picks_its_tool(
        reasoning_stack: StackProcess) -> None:
    client: Any = openai.OpenAI(base_url=reasoning_stack.base_url, api_key="none", max_retries=0)  # typed loosely:
    # the SDK's overloads want its TypedDicts where this sends the same plain JSON a user's code does
    messages = [{"role": "user", "content": "go"}]
    choice = {"type": "function", "function": {"name": "other"}}
    with client.chat.completions.stream(model="tiny", messages=messages, max_tokens=12, tools=TOOLS,
                                        tool_choice=choice, extra_body={"ignore_eos": True}) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "other" and json.loads(call.function.arguments).keys() == {"input"}
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, tools=TOOLS,
                                           tool_choice="required", stream=False, extra_body={"ignore_eos": True})
    message = whole.choices[0].message
    assert message.content is None and whole.choices[0].finish_reason == "tool_calls"
    assert json.loads(message.tool_calls[0].function.arguments)["q"]
    assert (message.model_extra or {}).get("reasoning_content")  # vLLM's field, beside the call


def test_auto_and_none_answer_with_content(reasoning_stack: StackProcess) -> None:
    for choice in ("auto", "none"):
        chunks = events(reasoning_stack, {**CHAT, "tools": TOOLS, "tool_choice": choice})
        assert not any("tool_calls" in d for d in deltas(chunks)) and any(d.get("content") for d in deltas(chunks))


@pytest.mark.parametrize("extra, param", [
    ({"tools": {"a": 1}}, "tools"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"chat_template_kwargs": "off"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"enable_thinking": 0}}, "chat_template_kwargs.enable_thinking"),
])
def test_bad_tools_are_a_400_with_openais_error_body(reasoning_stack: StackProcess, extra: dict[str, Any],
                                                     param: str) -> None:
    r = httpx.post(reasoning_stack.base_url + "/chat/completions", json={**CHAT, **extra}, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"], error


def test_tools_on_completions_stay_refused(reasoning_stack: StackProcess) -> None:
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2, "tools": TOOLS}
    r = httpx.post(reasoning_stack.base_url + "/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_the_flag_is_checked_before_the_engine_loads() -> None:
    from chaos.stack.serve import serve_main

    for bad in ("x", "5,2", "-1", "1,2,3"):
        assert serve_main(["--reasoning-tokens", bad]) == 2
