"""The builtin server's OpenAI wire format over real sockets: strict SSE, the openai client, JSON."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from chaos.stack.process import StackProcess

pytestmark = pytest.mark.timeout(60)

PROMPT = "Streaming 世界 🌍 test"


def _stream(stack: StackProcess, path: str, body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
    with httpx.Client(timeout=30) as client, client.stream("POST", stack.url + path, json=body) as r:
        return r, b"".join(r.iter_raw())


@pytest.mark.parametrize("include_usage", [False, True])
def test_completion_stream_is_strict_sse_and_matches_non_stream(stack: StackProcess, admin: Any, sse: Any,
                                                                include_usage: bool) -> None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    r, raw = _stream(stack, "/v1/completions",
                     {**body, "stream": True, **({"stream_options": {"include_usage": True}} if include_usage else {})})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse.parse(raw)
    text, finish = sse.check(events, chat=False, include_usage=include_usage)
    assert finish == "length"
    if include_usage:
        assert events[-1]["usage"]["completion_tokens"] == 24
    whole = httpx.post(stack.url + "/v1/completions", json=body, timeout=30).json()
    assert whole["object"] == "text_completion" and whole["usage"]["completion_tokens"] == 24
    assert whole["choices"][0]["text"] == text  # greedy and deterministic: same text either way
    assert "\ufffd" not in text


def test_chat_stream_role_first_then_content(stack: StackProcess, admin: Any, sse: Any) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    r, raw = _stream(stack, "/v1/chat/completions", body)
    assert r.status_code == 200
    events = sse.parse(raw)
    text, finish = sse.check(events, chat=True, include_usage=True)
    assert finish in ("length", "stop") and text
    whole = httpx.post(stack.url + "/v1/chat/completions", json={**body, "stream": False, "stream_options": None},
                       timeout=30).json()
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": text}


def test_openai_client_streams_completions_and_chat(stack: StackProcess, admin: Any) -> None:
    client = openai.OpenAI(base_url=stack.base_url, api_key="x", max_retries=0, timeout=30)
    try:
        parts = [c.choices[0].text
                 for c in client.completions.create(model="tiny", prompt=PROMPT, max_tokens=10, stream=True,
                                                    temperature=0)
                 if c.choices]
        assert len(parts) >= 2 and "".join(parts)
        chunks = list(client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage is not None and 1 <= chunks[-1].usage.completion_tokens <= 10
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
        models = client.models.list()
        assert [m.id for m in models.data] == ["tiny"]
    finally:
        client.close()


def test_seeded_sampling_is_reproducible(stack: StackProcess, admin: Any) -> None:
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 16, "temperature": 1.0, "seed": 42, "ignore_eos": True}
    a = httpx.post(stack.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
    b = httpx.post(stack.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
    assert a == b


def test_health_reports_versions_device_and_model(stack: StackProcess) -> None:
    health = httpx.get(stack.url + "/health", timeout=5).json()
    import starlette
    import uvicorn

    assert health["status"] == "ok" and health["model"] == "tiny" and health["device"] == "cpu"
    assert (health["starlette"], health["uvicorn"]) == (starlette.__version__, uvicorn.__version__)
