"""What one streamed response may carry before the load client cuts it, stated in one place.

A target that streams tiny events as fast as it can (751,554 events for a 16-token request, 757 MB
in the runner after 20 s) or never ends its response head (read until the request timeout, the load
loop lagging 14-16 s behind every other stream's stamps) must not grow the runner or distort the
run. Every bound here is a multiple of what the request asked for (``max_tokens``), far above what
an engine that honours it sends; past one the stream ends as a ``protocol`` error with cause
``content_overflow`` (or ``header_overflow`` for the head) and its connection is closed. The record
keeps exact counts up to the cut (``events``, ``bytes_received``). docs/contracts.md lists them.

Margins, for an engine streaming one token per event:
- events: one per token, plus a chat role event, a separate finish event, a usage event and
  ``[DONE]`` (4), plus events without content (an empty delta while a detokenizer holds back half a
  character, a keep-alive ``data:`` event during a long prefill): ``EVENTS_PER_TOKEN`` leaves three
  such events for every token, ``EVENT_SLACK`` 64 more before the first (a keep-alive every 15 s is
  16 minutes of prefill). SSE comments (``: ping``) are not events; the byte budget bounds them.
- bytes: a vLLM chat chunk is 250-400 bytes with a long model name, one with logprobs about 1.6 KB
  (20 alternatives); ``BODY_BYTES_PER_TOKEN`` 4 KiB is 2.5 times that, and the floor of 2 MiB keeps
  small requests clear of any engine's framing and above the SSE parser's own bound on one event
  (1 MiB, ``chaos.load.sse``), which still names a runaway line first. Counted after a
  Content-Encoding is undone.
- text: the longest token of the builtin vocabulary decodes to 61 bytes, of common LLM vocabularies
  to at most ~128 characters; ``TEXT_CHARS_PER_TOKEN`` 256 is twice that.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BODY_BYTES_BASE", "BODY_BYTES_FLOOR", "BODY_BYTES_PER_TOKEN", "EVENTS_PER_TOKEN", "EVENT_SLACK",
    "HEADER_VALUE_CHARS", "HEAD_BYTES", "HEAD_FIELDS", "TEXT_CHARS_BASE", "TEXT_CHARS_PER_TOKEN",
    "UNKNOWN_MAX_TOKENS", "ContentLimits", "head_message",
]

EVENTS_PER_TOKEN = 4
EVENT_SLACK = 64
BODY_BYTES_FLOOR = 2 << 20  # 2 MiB
BODY_BYTES_BASE = 64 << 10  # 64 KiB
BODY_BYTES_PER_TOKEN = 4 << 10  # 4 KiB
TEXT_CHARS_BASE = 4 << 10  # 4,096 characters
TEXT_CHARS_PER_TOKEN = 256
# a request without max_tokens (the engine's default: up to its context) is bounded as one of this many
UNKNOWN_MAX_TOKENS = 131_072
HEAD_BYTES = 64 << 10  # a response head (status line and header fields, interim 1xx heads included): 64 KiB
HEAD_FIELDS = 100  # header fields in one response head, interim heads included
HEADER_VALUE_CHARS = 256  # what a record keeps of one header value (Server, Via, Content-Type, ...)


@dataclass(frozen=True)
class ContentLimits:
    """The bounds of one stream: ``events`` SSE events, ``body_bytes`` body bytes (decoded), ``text_chars``
    characters of content; ``max_tokens`` is what they were derived from."""

    max_tokens: int
    events: int
    body_bytes: int
    text_chars: int  # content, reasoning and tool-call arguments together: all are tokens max_tokens allows

    @classmethod
    def for_tokens(cls, max_tokens: int | None) -> ContentLimits:
        """The bounds of a request asking for ``max_tokens`` (None or below 1: not asked,
        ``UNKNOWN_MAX_TOKENS``). Pure."""
        tokens = max_tokens if max_tokens is not None and max_tokens > 0 else UNKNOWN_MAX_TOKENS
        return cls(
            max_tokens=tokens,
            events=EVENTS_PER_TOKEN * tokens + EVENT_SLACK,
            body_bytes=max(BODY_BYTES_FLOOR, BODY_BYTES_BASE + BODY_BYTES_PER_TOKEN * tokens),
            text_chars=TEXT_CHARS_BASE + TEXT_CHARS_PER_TOKEN * tokens,
        )

    def events_message(self, events: int) -> str:
        return (f"content overflow: {events} SSE events for max_tokens {self.max_tokens}, past the limit of "
                f"{self.events} ({EVENTS_PER_TOKEN} x max_tokens + {EVENT_SLACK}); the stream was cut")

    def bytes_message(self) -> str:
        return (f"content overflow: the body passed {self.body_bytes} bytes for max_tokens {self.max_tokens} "
                f"(max(2 MiB, 64 KiB + {BODY_BYTES_PER_TOKEN} B x max_tokens)); the stream was cut")

    def text_message(self) -> str:
        return (f"content overflow: the text (content, reasoning and tool-call arguments together) passed "
                f"{self.text_chars} characters for max_tokens "
                f"{self.max_tokens} ({TEXT_CHARS_BASE} + {TEXT_CHARS_PER_TOKEN} x max_tokens); the stream was cut")


def head_message(what: str) -> str:
    """Why a response head was refused: ``what`` passed its bound."""
    return f"header overflow: the response head passed {what}; the stream was cut"
