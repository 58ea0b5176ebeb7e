"""Request validation and chunk shapes of the builtin server (pure, no sockets)."""

from __future__ import annotations

import pytest

from chaos.stack import protocol
from chaos.stack.protocol import RequestInvalid

SERVED = ("tiny",)


def test_completion_defaults() -> None:
    req = protocol.parse_completion({"model": "tiny", "prompt": "hi"}, SERVED)
    assert (req.max_tokens, req.temperature, req.top_p, req.stream, req.include_usage) == (16, 1.0, 1.0, False, False)
    assert req.prompt == "hi" and not req.chat


def test_completion_token_prompt_and_single_batch() -> None:
    assert protocol.parse_completion({"model": "tiny", "prompt": [1, 2, 3]}, SERVED).prompt == (1, 2, 3)
    assert protocol.parse_completion({"model": "tiny", "prompt": ["x"]}, SERVED).prompt == "x"


def test_chat_flattens_content_parts_and_maps_developer() -> None:
    req = protocol.parse_chat(
        {"model": "tiny", "messages": [{"role": "developer",
                                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
         "max_completion_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
        SERVED,
    )
    assert req.messages == ({"role": "system", "content": "ab"},)
    assert req.max_tokens == 3 and req.include_usage and req.chat
    assert protocol.parse_chat({"model": "tiny", "messages": [{"role": "user", "content": "x"}]},
                               SERVED).max_tokens is None


@pytest.mark.parametrize(
    ("body", "param", "status"),
    [
        ({"prompt": "x"}, "model", 400),
        ({"model": "nope", "prompt": "x"}, "model", 404),
        ({"model": 3, "prompt": "x"}, "model", 400),
        ({"model": "tiny"}, "prompt", 400),
        ({"model": "tiny", "prompt": {"a": 1}}, "prompt", 400),
        ({"model": "tiny", "prompt": ["a", "b"]}, "prompt", 400),
        ({"model": "tiny", "prompt": "x", "max_tokens": 0}, "max_tokens", 400),
        ({"model": "tiny", "prompt": "x", "max_tokens": "5"}, "max_tokens", 400),
        ({"model": "tiny", "prompt": "x", "max_tokens": True}, "max_tokens", 400),
        ({"model": "tiny", "prompt": "x", "temperature": 3}, "temperature", 400),
        ({"model": "tiny", "prompt": "x", "top_p": 0}, "top_p", 400),
        ({"model": "tiny", "prompt": "x", "stream": "yes"}, "stream", 400),
        ({"model": "tiny", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options", 400),
        ({"model": "tiny", "prompt": "x", "n": 2}, "n", 400),
        ({"model": "tiny", "prompt": "x", "stop": ["\n"]}, "stop", 400),
        ({"model": "tiny", "prompt": "x", "seed": 1.5}, "seed", 400),
    ],
)
def test_completion_rejects(body: dict, param: str, status: int) -> None:
    with pytest.raises(RequestInvalid) as info:
        protocol.parse_completion(body, SERVED)
    assert (info.value.param, info.value.status) == (param, status)
    assert info.value.message  # says what was wrong


@pytest.mark.parametrize(
    ("messages", "param"),
    [([], "messages"), ("hi", "messages"), ([{"role": "wizard", "content": "x"}], "messages[0].role"),
     ([{"role": "user", "content": 5}], "messages[0].content"), (["x"], "messages[0]")],
)
def test_chat_rejects(messages: object, param: str) -> None:
    with pytest.raises(RequestInvalid) as info:
        protocol.parse_chat({"model": "tiny", "messages": messages}, SERVED)
    assert info.value.param == param and info.value.status == 400


@pytest.mark.parametrize("body", [b"{", b"[1]", b"\xff\xfe", b""])
def test_parse_body_rejects_non_objects(body: bytes) -> None:
    with pytest.raises(RequestInvalid) as info:
        protocol.parse_body(body)
    assert info.value.status == 400 and info.value.code == "invalid_json"


def test_resolve_max_tokens() -> None:
    assert protocol.resolve_max_tokens(None, 10, 100, "prompt") == 90
    assert protocol.resolve_max_tokens(5, 10, 100, "prompt") == 5
    with pytest.raises(RequestInvalid, match="maximum context length is 100"):
        protocol.resolve_max_tokens(5, 100, 100, "prompt")
    with pytest.raises(RequestInvalid, match="at most 90") as info:
        protocol.resolve_max_tokens(91, 10, 100, "prompt")
    assert info.value.param == "max_tokens"


def test_chunk_shapes() -> None:
    c = protocol.completion_chunk("cmpl-1", 7, "tiny", "a", None)
    assert c["object"] == "text_completion" \
        and c["choices"][0] == {"index": 0, "text": "a", "logprobs": None, "finish_reason": None}
    u = protocol.usage_chunk("cmpl-1", 7, "tiny", True, protocol.usage(3, 4))
    assert u["choices"] == [] and u["usage"]["total_tokens"] == 7 and u["object"] == "chat.completion.chunk"
    assert protocol.error_body("m", "t", None, 400) == {"error": {"message": "m", "type": "t", "param": None,
                                                                  "code": 400}}
