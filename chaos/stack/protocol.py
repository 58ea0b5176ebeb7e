"""OpenAI request validation and response-chunk shapes for the builtin server (pure functions).

Everything here takes plain data and returns plain data or raises ``RequestInvalid``, whose fields
map one to one onto OpenAI's error object ``{"error": {"message", "type", "param", "code"}}``.
The server calls these; nothing here touches sockets, the engine or the clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from chaos.model.errors import ChaosError

from .bodies import JsonRefused, loads_bounded

__all__ = [
    "MAX_BODY_BYTES",
    "CompletionRequest",
    "RequestInvalid",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "error_body",
    "parse_body",
    "parse_chat",
    "parse_completion",
    "resolve_max_tokens",
    "usage",
    "usage_chunk",
]

MAX_BODY_BYTES = 1 << 20  # 1 MiB: far above any prompt the builtin context can hold

_ROLES = ("system", "user", "assistant", "developer")  # developer is read as system


class RequestInvalid(ChaosError):
    """A client request the server refuses; carries the HTTP status and OpenAI error fields."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type


@dataclass(frozen=True)
class CompletionRequest:
    """One validated completion or chat request, before tokenization."""

    chat: bool
    model: str
    prompt: str | tuple[int, ...] | None  # completions: text or token ids
    messages: tuple[dict[str, str], ...]  # chat: role/content with content flattened to text
    max_tokens: int | None  # None: up to the end of the context (chat) — see resolve_max_tokens
    temperature: float
    top_p: float
    seed: int | None
    stream: bool
    include_usage: bool
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]


def error_body(message: str, type: str, param: str | None, code: str | int | None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def parse_body(body: bytes) -> dict[str, Any]:
    """Bytes → the top-level JSON object, or ``RequestInvalid`` (400) saying what was wrong.

    Within the JSON budgets of ``chaos.stack.bodies`` (depth, integer digits, no lone surrogates).
    """
    try:
        data = loads_bounded(body)
    except JsonRefused as exc:
        raise RequestInvalid(f"request body refused: {exc.message}; send a JSON object", param=exc.path,
                             code="invalid_json") from None
    if not isinstance(data, dict):
        raise RequestInvalid(f"request body must be a JSON object, found {type(data).__name__}", code="invalid_json")
    return data


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _type_error(param: str, expected: str, value: object) -> RequestInvalid:
    return RequestInvalid(
        f"'{param}' must be {expected}, found {json.dumps(value)[:80]}", param=param, code="invalid_type"
    )


def _model(data: Mapping[str, Any], served: tuple[str, ...]) -> str:
    if "model" not in data:
        raise RequestInvalid("missing required field 'model'", param="model", code="missing_required_parameter")
    model = data["model"]
    if not isinstance(model, str):
        raise _type_error("model", "a string", model)
    if model not in served:
        raise RequestInvalid(
            f"the model {model!r} does not exist; this server serves {', '.join(map(repr, served))}",
            status=404,
            param="model",
            code="model_not_found",
            type="NotFoundError",
        )
    return model


def _common(data: Mapping[str, Any], chat: bool) -> dict[str, Any]:
    """Sampling, streaming and unsupported-feature checks shared by both endpoints."""
    out: dict[str, Any] = {  # checked in this order: the first wrong field is the one named
        "max_tokens": _max_tokens(data, chat),
        "temperature": _in_range(data, "temperature", 1.0, lambda v: 0.0 <= v <= 2.0, "[0, 2]"),
        "top_p": _in_range(data, "top_p", 1.0, lambda v: 0.0 < v <= 1.0, "(0, 1]"),
        "seed": _seed(data),
        "stream": _flag(data, "stream"),
    }
    out["include_usage"] = _include_usage(data, out["stream"])
    out["ignore_eos"] = _flag(data, "ignore_eos")  # vLLM extension, handy for fixed-length benchmarks
    out["stop_token_ids"] = _stop_token_ids(data)  # vLLM extension
    _refuse_unsupported(data, chat)
    return out


def _max_tokens(data: Mapping[str, Any], chat: bool) -> int | None:
    key = "max_tokens"
    max_tokens = data.get("max_tokens")
    if chat and max_tokens is None and data.get("max_completion_tokens") is not None:
        key, max_tokens = "max_completion_tokens", data["max_completion_tokens"]
    if max_tokens is None:
        return None if chat else 16  # OpenAI's documented default for the legacy completions endpoint
    if not _is_int(max_tokens):
        raise _type_error(key, "an integer", max_tokens)
    if max_tokens < 1:
        raise RequestInvalid(f"'{key}' must be at least 1, found {max_tokens}", param=key, code="invalid_value")
    return int(max_tokens)


def _in_range(data: Mapping[str, Any], key: str, default: float, allowed: Callable[[float], bool], shown: str) -> float:
    """A number field (null: the default) that must lie in ``shown``."""
    value = data.get(key, default)
    value = default if value is None else value
    if not _is_number(value):
        raise _type_error(key, "a number", value)
    if not allowed(value):
        raise RequestInvalid(f"'{key}' must lie in {shown}, found {value}", param=key, code="invalid_value")
    return float(value)


def _seed(data: Mapping[str, Any]) -> int | None:
    seed = data.get("seed")
    if seed is None:
        return None
    if not _is_int(seed):
        raise _type_error("seed", "an integer", seed)
    if not 0 <= seed < 2**63:  # torch generators take a 64-bit seed
        raise RequestInvalid(f"'seed' must lie in [0, 2**63), found {seed}", param="seed", code="invalid_value")
    return int(seed)


def _flag(data: Mapping[str, Any], key: str) -> bool:
    """A true/false field; null and absent are false."""
    value = data.get(key, False)
    value = False if value is None else value
    if not isinstance(value, bool):
        raise _type_error(key, "true or false", value)
    return value


def _include_usage(data: Mapping[str, Any], stream: bool) -> bool:
    options = data.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    if not stream:
        raise RequestInvalid("'stream_options' is only allowed when 'stream' is true", param="stream_options",
                             code="invalid_value")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise _type_error("stream_options.include_usage", "true or false", include_usage)
    return include_usage


def _stop_token_ids(data: Mapping[str, Any]) -> tuple[int, ...]:
    stop_ids = data.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) and t >= 0 for t in stop_ids):
        raise _type_error("stop_token_ids", "a list of non-negative integers", stop_ids)
    return tuple(stop_ids)


# fields the builtin server refuses unless they ask for nothing: (key, the values that ask for nothing, why)
_UNSUPPORTED: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("stop", (None, [], ""), "'stop' strings are not supported by the builtin server; use 'stop_token_ids'"),
    ("logprobs", (None, False, 0), "'logprobs' is not supported by the builtin server; omit it"),
    ("echo", (None, False), "'echo' is not supported by the builtin server; omit it"),
)


def _refuse_unsupported(data: Mapping[str, Any], chat: bool) -> None:
    for name in ("n", "best_of"):
        n = data.get(name)
        if n is None:
            continue
        if not _is_int(n):
            raise _type_error(name, "an integer", n)
        if n != 1:
            raise RequestInvalid(f"'{name}' must be 1: the builtin server generates one choice per request, found {n}",
                                 param=name, code="unsupported_value")
    for key, harmless, why in _UNSUPPORTED:
        if data.get(key) not in harmless:
            raise RequestInvalid(why, param=key, code="unsupported_value")
    if not chat and data.get("tools"):  # chat's tools: chaos.stack.tool_calls
        raise RequestInvalid("'tools' are served on /v1/chat/completions only; omit them here", param="tools",
                             code="unsupported_value")


def parse_completion(data: Mapping[str, Any], served: tuple[str, ...]) -> CompletionRequest:
    """Validate a ``POST /v1/completions`` body; raise ``RequestInvalid``."""
    model = _model(data, served)
    if "prompt" not in data:
        raise RequestInvalid("missing required field 'prompt'", param="prompt", code="missing_required_parameter")
    raw = data["prompt"]
    # A one-element batch is accepted (clients often wrap); larger batches would need n choices.
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
        raw = raw[0]
    prompt: str | tuple[int, ...]
    if isinstance(raw, str):
        prompt = raw
    elif isinstance(raw, list) and raw and all(_is_int(t) and t >= 0 for t in raw):
        prompt = tuple(raw)
    elif isinstance(raw, list) and len(raw) > 1 and all(isinstance(p, (str, list)) for p in raw):
        raise RequestInvalid("batched prompts are not supported by the builtin server; send one prompt per request",
                             param="prompt", code="unsupported_value")
    else:
        raise _type_error("prompt", "a string or a non-empty list of token ids", raw)
    common = _common(data, chat=False)
    return CompletionRequest(chat=False, model=model, prompt=prompt, messages=(), **common)


def parse_chat(data: Mapping[str, Any], served: tuple[str, ...]) -> CompletionRequest:
    """Validate a ``POST /v1/chat/completions`` body; raise ``RequestInvalid``."""
    model = _model(data, served)
    if "messages" not in data:
        raise RequestInvalid("missing required field 'messages'", param="messages", code="missing_required_parameter")
    raw = data["messages"]
    if not isinstance(raw, list) or not raw:
        raise _type_error("messages", "a non-empty list of {role, content} objects", raw)
    messages: list[dict[str, str]] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _type_error(where, "an object with 'role' and 'content'", m)
        role = m.get("role")
        if role not in _ROLES:
            raise RequestInvalid(f"'{where}.role' must be one of {', '.join(_ROLES)}, found {json.dumps(role)}",
                                 param=f"{where}.role", code="invalid_value")
        messages.append({"role": "system" if role == "developer" else str(role),
                         "content": _content_text(m.get("content"), f"{where}.content")})
    common = _common(data, chat=True)
    return CompletionRequest(chat=True, model=model, prompt=None, messages=tuple(messages), **common)


def _content_text(content: object, where: str) -> str:
    """OpenAI content: a string, null, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise _type_error(where, "a string or a list of text parts", content)
            texts.append(part["text"])
        return "".join(texts)
    raise _type_error(where, "a string or a list of text parts", content)


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int, param: str) -> int:
    """Check prompt + output fit the context (400 otherwise); default to the rest of the context."""
    if prompt_tokens >= max_model_len:
        raise RequestInvalid(
            f"this model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{prompt_tokens} tokens; shorten the prompt to at most {max_model_len - 1} tokens",
            param=param,
            code="context_length_exceeded",
        )
    room = max_model_len - prompt_tokens
    if requested is None:
        return room
    if requested > room:
        raise RequestInvalid(
            f"'max_tokens' is too large: {requested} + {prompt_tokens} prompt tokens exceeds the "
            f"context of {max_model_len} tokens; ask for at most {room}",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_chunk(rid: str, created: int, model: str, text: str, finish_reason: str | None) -> dict[str, Any]:
    """One ``text_completion`` stream chunk."""
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


def chat_chunk(
    rid: str, created: int, model: str, delta: dict[str, str], finish_reason: str | None
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; the first carries ``delta.role``."""
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def usage_chunk(rid: str, created: int, model: str, chat: bool, use: dict[str, int]) -> dict[str, Any]:
    """The ``stream_options.include_usage`` chunk: empty ``choices`` and the totals."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}


def completion_response(
    rid: str, created: int, model: str, text: str, finish_reason: str, use: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": use,
    }


def chat_response(
    rid: str, created: int, model: str, text: str, finish_reason: str, use: dict[str, int]
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": use,
    }
