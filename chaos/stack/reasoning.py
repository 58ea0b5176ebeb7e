"""Reasoning streams of the builtin server, and which delta field each generated token goes out in.

With ``--reasoning-tokens LO[,HI]`` a chat request's first N generated tokens (N drawn per request
within [LO, HI], seeded by the stack's seed and the request's ``X-Request-Id``, never more than
``max_tokens - 1`` so some output follows) are streamed as ``delta.reasoning_content`` (vLLM's shape),
the rest as ``delta.content`` (or as a forced tool call's arguments: ``chaos.stack.tool_calls``). They
are the same tokens from the same forward passes: only the field they are sent in changes, so a
reasoning phase costs exactly what the same number of content tokens costs. The request's
``chat_template_kwargs: {"enable_thinking": false}`` (how vLLM's Qwen3 and DeepSeek templates switch
thinking off) turns it off for that request. The usage record then says
``completion_tokens_details.reasoning_tokens``. The completions endpoint has no reasoning phase.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from .protocol import RequestInvalid
from .tool_calls import ToolCall, ToolCallStream

__all__ = ["ChatDeltas", "parse_reasoning_tokens", "reasoning_budget", "thinking_enabled"]

Shaped = tuple[dict[str, Any], str | None]  # a chat delta's body and its finish_reason


def parse_reasoning_tokens(text: str) -> tuple[int, int]:
    """``"N"`` or ``"LO,HI"`` → ``(lo, hi)``; ``ValueError`` saying what is allowed."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or any(v < 0 for v in values) or (len(values) == 2 and values[0] > values[1]):
        raise ValueError(f"--reasoning-tokens takes N or LO,HI (integers, 0 <= LO <= HI), found {text!r}")
    return (values[0], values[-1])


def thinking_enabled(data: Mapping[str, Any]) -> bool:
    """Whether a chat request leaves thinking on: ``chat_template_kwargs.enable_thinking`` false turns it
    off; ``RequestInvalid`` (400) for a malformed ``chat_template_kwargs``."""
    kwargs = data.get("chat_template_kwargs")
    if kwargs is None:
        return True
    if not isinstance(kwargs, dict):
        raise RequestInvalid(f"'chat_template_kwargs' must be an object, found {json.dumps(kwargs)[:80]}",
                             param="chat_template_kwargs", code="invalid_type")
    enabled = kwargs.get("enable_thinking", True)
    if not isinstance(enabled, bool):
        raise RequestInvalid("'chat_template_kwargs.enable_thinking' must be true or false, found "
                             f"{json.dumps(enabled)[:80]}", param="chat_template_kwargs.enable_thinking",
                             code="invalid_type")
    return enabled


def reasoning_budget(tokens: tuple[int, int], seed: int, request_key: str, max_tokens: int, enabled: bool) -> int:
    """How many of a request's first tokens are reasoning: drawn in ``tokens`` from ``seed`` and the
    request's key (the same request id gets the same N in every run), at most ``max_tokens - 1``. Pure."""
    lo, hi = tokens
    if not enabled or hi <= 0:
        return 0
    n = random.Random(f"reasoning:{seed}:{request_key}").randint(lo, hi)
    return max(0, min(n, max_tokens - 1))


class ChatDeltas:
    """The chat deltas of one request's generated text: reasoning for its first ``reasoning`` tokens, then
    content, or a forced tool call's argument fragments."""

    def __init__(self, reasoning: int, tool: ToolCall | None, call_id: str, report: bool = False) -> None:
        self.reasoning = reasoning
        self.report = report  # the server reasons: usage says how many tokens were reasoning (0 included)
        self.reasoned = 0  # tokens that went out as reasoning (usage's reasoning_tokens)
        self.call = ToolCallStream(tool, call_id) if tool is not None else None

    def shape(self, text: str, tokens: int, finish_reason: str | None) -> list[Shaped]:
        """The delta bodies for newly complete ``text``, ``tokens`` the request's generated tokens so far
        (this delta's included), the last one with the finish reason. A delta that ends within the first
        ``reasoning`` tokens is reasoning (a character the detokenizer held back across the boundary goes
        out with the token that completed it)."""
        out: list[Shaped] = []
        thinking = tokens <= self.reasoning
        self.reasoned = min(tokens, self.reasoning)
        if text:
            if thinking:
                out.append(({"reasoning_content": text}, None))
            elif self.call is None:
                out.append(({"content": text}, None))
            else:
                if not self.call.started:
                    out.append((self.call.head(), None))
                out.append((self.call.fragment(text), None))
        if finish_reason is None:
            return out
        if self.call is None:
            if out:
                out[-1] = (out[-1][0], finish_reason)
            else:
                out.append(({}, finish_reason))
            return out
        if not self.call.started:  # no output token came (the end of the stream within the reasoning)
            out.append((self.call.head(), None))
        out.append((self.call.close(), "tool_calls"))  # the arguments are whole, however the engine stopped
        return out

    def usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        """``usage``, with ``completion_tokens_details.reasoning_tokens`` where the server reasons."""
        if not self.report:
            return usage
        return {**usage, "completion_tokens_details": {"reasoning_tokens": self.reasoned}}

    def message(self, shaped: list[Shaped]) -> dict[str, Any]:
        """A non-streaming answer's ``message`` fields from every delta body shaped for it."""
        content = "".join(body.get("content", "") for body, _ in shaped)
        reasoning = "".join(body.get("reasoning_content", "") for body, _ in shaped)
        out: dict[str, Any] = {"content": content}
        if self.report or reasoning:
            out["reasoning_content"] = reasoning or None
        if self.call is not None:
            out["content"] = content or None  # OpenAI: null beside a tool call
            out["tool_calls"] = [self.call.message()]
        return out
