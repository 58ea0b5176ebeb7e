"""Continuous-batching scheduler: FCFS admission under a token budget, chunked prefill, prefix-cache
hits at admission, preemption by recompute."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .block_manager import BlockManager, extend_hashes
from .types import SamplingParams, TokenOutput

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    on_output: Callable[[TokenOutput], None]
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    state: str = WAITING
    num_computed: int = 0  # tokens whose K/V are in the cache (prefix hits included)
    num_scheduled: int = 0  # tokens this step computes (a prefill chunk, or 1 for a decode)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    preemptions: int = 0
    utf8_state: int = 0  # tiny model only: UTF-8 DFA state of the output bytes so far
    arrival: float = field(default_factory=time.monotonic)
    first_scheduled: float | None = None  # monotonic s of its first admission (queue time ends)
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of its full blocks so far

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def prefilling(self) -> bool:
        """More than the newest token lacks K/V: a (chunk of a) prefill, not a decode."""
        return self.num_computed < self.num_tokens - 1

    def hashes(self, block_size: int) -> list[bytes]:
        """The chained hashes of every full block of its tokens (computed once per block)."""
        if len(self.block_hashes) < self.num_tokens // block_size:
            extend_hashes(self.block_hashes, self.all_ids(), block_size)
        return self.block_hashes


@dataclass
class SchedulerOutput:
    prefills: list[Sequence]  # each computes ``num_scheduled`` tokens from ``num_computed``
    decodes: list[Sequence]
    preempted: list[Sequence]
    too_long: list[Sequence]  # cannot grow even with the whole pool: finish with "length"
    admitted: list[Sequence] = field(default_factory=list)  # first admission this step (no preemption before)


class Scheduler:
    """Every step: the running sequences' decodes first, then their unfinished prefill chunks, then
    new admissions, all under ``max_num_batched_tokens`` (a prefill longer than what is left of it
    is computed in chunks over several steps, as vLLM's chunked prefill). A sequence's blocks
    for its whole prompt are allocated at admission, starting with its prefix-cache hits."""

    def __init__(self, bm: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.bm = bm
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order (oldest first)
        self.num_preemptions = 0

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is and free its blocks."""
        if seq.state == RUNNING:
            self.running.remove(seq)
        elif seq.state == WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        seq.state = FINISHED
        self.bm.free(seq.request_id)

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.bm.free(seq.request_id)
        seq.state = WAITING
        seq.num_computed = 0
        seq.num_scheduled = 0
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput([], [], [], [])
        self._grow_running(out)
        if out.preempted:
            return out  # no prefill in a step that had to preempt
        budget = self.max_num_batched_tokens - len(out.decodes)
        for seq in self.running:  # unfinished prefills, oldest first
            if seq.prefilling and budget > 0:
                seq.num_scheduled = min(seq.num_tokens - seq.num_computed, budget)
                budget -= seq.num_scheduled
                out.prefills.append(seq)
        self._admit(out, budget)
        return out

    def _grow_running(self, out: SchedulerOutput) -> None:
        """Decodes: every running sequence past its prefill needs a slot for its newest token;
        preempt the newest running ones until it has one."""
        bm = self.bm
        queue = deque(self.running)
        while queue:
            seq = queue.popleft()
            while not bm.append_slot(seq.request_id, seq.num_tokens):
                if queue:
                    victim = queue.pop()  # newest running
                    self._preempt(victim)
                    out.preempted.append(victim)
                    continue
                if bm.blocks_needed(seq.num_tokens) > bm.num_total:
                    out.too_long.append(seq)
                else:
                    self._preempt(seq)
                    out.preempted.append(seq)
                break
            else:
                seq.num_scheduled = 0
                if not seq.prefilling:
                    seq.num_scheduled = 1
                    out.decodes.append(seq)

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        """New prefills: FCFS under ``max_num_seqs`` and the token budget, prefix hits first."""
        bm = self.bm
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            n = seq.num_tokens
            cached = bm.match_prefix(seq.hashes(bm.block_size), n) if bm.prefix_caching else []
            if not bm.can_allocate(n, cached):
                if not self.running and not out.prefills and bm.blocks_needed(n) > bm.num_total:
                    self.waiting.popleft()
                    out.too_long.append(seq)
                    continue
                break
            self.waiting.popleft()
            bm.allocate(seq.request_id, n, cached)
            seq.num_computed = len(cached) * bm.block_size
            seq.num_scheduled = min(n - seq.num_computed, budget)
            budget -= seq.num_scheduled
            seq.state = RUNNING
            if seq.first_scheduled is None:
                seq.first_scheduled = time.monotonic()
                seq.num_cached_tokens = seq.num_computed
                out.admitted.append(seq)
            self.running.append(seq)
            out.prefills.append(seq)
