"""``shared_prefix``: P prefixes of L tokens (or characters), each request one of them and a suffix of its own.

What agents and RAG front-ends send: the same long system prompt (tools, instructions, a document) before
a short question. A prefix cache serves the prefix's blocks again; the suffix is what must be computed.
Pure of the seed: prefix p is the same text in every worker and run with the seed (``PromptMaker``'s
``text_of_tokens`` with the target's tokenizer, exactly L tokens; seeded words of L characters without);
request n of a worker picks its prefix and draws its suffix from (seed, worker, n). The suffix opens with
the request's own id, so no two requests share more than their prefix.

Chat requests carry the prefix as the system message and the suffix as the user's: a chat template puts
the system message first, so the prefix is still the prompt's first tokens (after the template's own).
"""

from __future__ import annotations

import random

from chaos.load.text import synthetic_text
from chaos.load.workloads import WorkloadSettings
from chaos.load.workloads.tokens import PromptMaker, TokenCounter

__all__ = ["SharedPrefix"]


class SharedPrefix:
    """The prompts of one worker's shared-prefix requests: ``prompt(n)`` → (prefix, suffix, group, tokens)."""

    def __init__(self, settings: WorkloadSettings, *, seed: int, worker_index: int,
                 tokenizer: TokenCounter | None) -> None:
        self.settings = settings
        self.seed = seed
        self.worker_index = worker_index
        self.tokenizer = tokenizer
        self._maker = PromptMaker(tokenizer, seed) if settings.prefix_tokens is not None else None
        self._prefixes: dict[int, tuple[str, int | None]] = {}

    def prefix(self, group: int) -> tuple[str, int | None]:
        """Prefix ``group``'s text and its length in tokens (None where not counted). The same in every worker."""
        made = self._prefixes.get(group)
        if made is None:
            if self._maker is not None and self.settings.prefix_tokens is not None:
                made = self._maker.text_of_tokens(self.settings.prefix_tokens, f"shared-prefix-{group}")
            else:

                chars = self.settings.prefix_chars or 0
                made = (synthetic_text(random.Random(f"{self.seed}:prefix:{group}"), chars, "ascii"), None)
            self._prefixes[group] = made
        return made

    def prompt(self, n: int) -> tuple[str, str, int, int | None]:
        """Request ``n``'s (prefix, suffix, prefix group, prompt tokens or None)."""

        rng = random.Random(f"{self.seed}:{self.worker_index}:{n}:shared_prefix")
        group = rng.randrange(self.settings.prefixes)
        prefix, prefix_tokens = self.prefix(group)
        lo, hi = self.settings.suffix_chars
        suffix = f"\n[{self.worker_index}-{n}] " + synthetic_text(rng, rng.randint(lo, hi), "ascii")
        tokens = None
        if prefix_tokens is not None and self.tokenizer is not None:
            tokens = prefix_tokens + len(self.tokenizer.encode(suffix))
        return prefix, suffix, group, tokens
