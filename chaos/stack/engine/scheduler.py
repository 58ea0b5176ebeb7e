"""Continuous-batching scheduler: FCFS admission under a token budget, preemption by recompute."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .block_manager import BlockManager
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
    num_computed: int = 0  # tokens whose K/V are in the cache
    preemptions: int = 0
    utf8_state: int = 0  # tiny model only: UTF-8 DFA state of the output bytes so far
    arrival: float = field(default_factory=time.monotonic)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


@dataclass
class SchedulerOutput:
    prefills: list[Sequence]
    decodes: list[Sequence]
    preempted: list[Sequence]
    too_long: list[Sequence]  # cannot grow even with the whole pool: finish with "length"


class Scheduler:
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
        seq.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> SchedulerOutput:
        bm = self.bm
        out = SchedulerOutput([], [], [], [])
        # 1. decodes: every running sequence needs a slot for its newest token
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
                out.decodes.append(seq)
        if out.preempted:
            return out  # no admissions in a step that had to preempt
        # 2. prefills: FCFS under max_num_seqs and the token budget
        budget = self.max_num_batched_tokens - len(out.decodes)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = seq.num_tokens
            if out.prefills and n > budget:
                break
            if not bm.can_allocate(n):
                if not self.running and not out.prefills and bm.blocks_needed(n) > bm.num_total:
                    self.waiting.popleft()
                    out.too_long.append(seq)
                    continue
                break
            self.waiting.popleft()
            bm.allocate(seq.request_id, n)
            seq.state = RUNNING
            self.running.append(seq)
            out.prefills.append(seq)
            budget -= n
        return out
