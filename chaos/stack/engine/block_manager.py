"""Block manager for the paged KV cache: a free list and per-sequence block tables."""

from __future__ import annotations

from collections import deque


class BlockManager:
    """Owns block *numbers*; the tensors live in :class:`~.kv_cache.KVCache`.

    Every block is in exactly one place: the free list, one sequence's table, or the reservation
    (blocks taken out of circulation by a KV-pressure fault). ``num_used`` counts tables and the
    reservation; ``num_used + num_free == num_total`` always.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_total = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self.tables: dict[str, list[int]] = {}
        self._reserved: list[int] = []

    # -- counts -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_reserved(self) -> int:
        return len(self._reserved)

    @property
    def num_used(self) -> int:
        """Blocks not on the free list (sequence tables + reservation)."""
        return self.num_total - len(self._free)

    @property
    def num_used_by_seqs(self) -> int:
        return self.num_used - len(self._reserved)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_of(self, seq_id: str) -> int:
        return len(self.tables.get(seq_id, ()))

    # -- allocation -----------------------------------------------------------------------------
    def can_allocate(self, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) <= len(self._free)

    def allocate(self, seq_id: str, num_tokens: int) -> list[int]:
        """Give a new sequence enough blocks for ``num_tokens`` tokens."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        n = self.blocks_needed(num_tokens)
        if n > len(self._free):
            raise MemoryError(f"need {n} blocks, {len(self._free)} free")
        table = [self._free.popleft() for _ in range(n)]
        self.tables[seq_id] = table
        return table

    def append_slot(self, seq_id: str, num_tokens: int) -> bool:
        """Grow the sequence's table to hold ``num_tokens`` tokens; False if no block is free."""
        table = self.tables.setdefault(seq_id, [])
        need = self.blocks_needed(num_tokens) - len(table)
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        table.extend(self._free.popleft() for _ in range(need))
        return True

    def free(self, seq_id: str) -> int:
        """Return all of a sequence's blocks to the free list; the count freed."""
        table = self.tables.pop(seq_id, None)
        if not table:
            return 0
        self._free.extend(table)
        return len(table)

    def slot(self, seq_id: str, pos: int) -> int:
        table = self.tables[seq_id]
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    # -- reservations (KV-pressure fault) -------------------------------------------------------------
    def reserve(self, n: int) -> int:
        """Take up to ``n`` free blocks out of circulation; the number actually taken."""
        k = max(0, min(int(n), len(self._free)))
        for _ in range(k):
            self._reserved.append(self._free.pop())
        return k

    def release_reservation(self) -> int:
        k = len(self._reserved)
        self._free.extend(self._reserved)
        self._reserved.clear()
        return k

    # -- invariants -----------------------------------------------------------------------------
    def check(self) -> None:
        in_tables = sum(len(t) for t in self.tables.values())
        used, free = self.num_used, self.num_free
        assert used + free == self.num_total, (used, free, self.num_total)
        assert in_tables + len(self._reserved) == used, (in_tables, len(self._reserved), used)

    def holders(self) -> list[str]:
        """Sequence ids that currently hold at least one block."""
        return [sid for sid, t in self.tables.items() if t]
