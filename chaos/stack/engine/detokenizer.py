"""Incremental detokenization that never emits a partial UTF-8 character.

The TGI / vLLM "slow path" algorithm (reference/llm-serving.md §5): keep ``prefix_offset`` and
``read_offset`` into the id list; decode ``ids[prefix:read]`` and ``ids[prefix:]``; when the second
is longer and does not end in U+FFFD, emit the difference and advance both offsets, otherwise hold
the tokens back. A U+FFFD in the *middle* is treated as genuinely invalid output and let through.

Pure: it holds only its own ids and offsets, so the server can run it in its event loop.
"""

from __future__ import annotations

from collections.abc import Iterable

from .tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # everything emitted so far

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def push(self, token_ids: Iterable[int]) -> str:
        """Add generated ids; return the newly complete text ('' while a character is incomplete)."""
        self.ids.extend(int(t) for t in token_ids)
        if len(self.ids) == self.read_offset:
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT):
            delta = new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """End of stream: return whatever is still held back.

        Held-back ids are an incomplete character (``push`` emits everything else). When the stream
        ends there, e.g. ``max_tokens`` cut a character in half, the fragment is dropped rather than
        sent as U+FFFD: a client must never see a partial character. A U+FFFD earlier in the held
        text (genuinely invalid output) still goes through.
        """
        if self.read_offset == len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        delta = new_text.removeprefix(prefix_text).rstrip(REPLACEMENT)
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
