"""A Mooncake trace replayed open loop at its timestamps: what each request sends and when.

The trace is read by every load process (``chaos.load.workloads.trace.read_mooncake``); worker i of N
replays requests i, i+N, i+2N, ... at their own timestamps, so the processes together replay the whole
trace on one schedule. Request k is sent ``(t_ms - t_first) / speed`` after the load's start (t_first: the
trace's first timestamp, so its first request goes at once), its prompt made from its ``hash_ids`` to its
``input_length`` in the target's tokens (``PromptMaker.from_blocks``: equal hash ids, equal token blocks) and
its ``max_tokens`` its ``output_length``.
"""

from __future__ import annotations

from pathlib import Path

from chaos.load.workloads import WorkloadSettings
from chaos.load.workloads.tokens import PromptMaker, TokenCounter
from chaos.load.workloads.trace import TraceRequest, read_mooncake

__all__ = ["MooncakeReplay"]


class MooncakeReplay:
    """One worker's share of a Mooncake trace: ``offset_ns(n)`` and ``prompt(n)`` of its n-th request."""

    def __init__(self, settings: WorkloadSettings, *, seed: int, worker_index: int, workers: int,
                 tokenizer: TokenCounter | None) -> None:
        assert settings.path is not None, "a trace workload has a path (the loader checks it)"
        every = read_mooncake(Path(settings.path), block_tokens=settings.block_tokens)  # in time order (checked)
        self.requests: list[TraceRequest] = every[worker_index::max(1, workers)]
        self.t_first_ms = every[0].t_ms if every else 0.0  # every process counts from the same request
        self.speed = settings.speed
        self.maker = PromptMaker(tokenizer, seed, settings.block_tokens)

    def __len__(self) -> int:
        return len(self.requests)

    def offset_ns(self, n: int) -> int:
        """When request ``n`` of this worker is due, in ns after the load's start."""
        return int((self.requests[n].t_ms - self.t_first_ms) * 1e6 / self.speed)

    def prompt(self, n: int) -> tuple[str, int | None, int]:
        """Request ``n``'s prompt text, its length in tokens (None without a tokenizer) and its max_tokens."""
        request = self.requests[n]
        text, tokens = self.maker.from_blocks(request.hash_ids, request.input_length)
        return text, tokens, max(1, request.output_length)
