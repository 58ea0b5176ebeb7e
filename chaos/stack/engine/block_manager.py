"""Block manager for the paged KV cache: ref-counted blocks, per-sequence block tables, prefix caching.

Automatic prefix caching as vLLM V1 does it: every *full* block of a sequence's tokens has a hash
that chains its parent block's hash and its own token ids, so equal hashes mean equal prefixes.
Once a full block's K/V are computed it is entered in the cache under its hash. A new sequence
starts with its prompt's longest run of cached blocks (their ref count goes up; nothing is computed
again) and only the rest is allocated. A block whose ref count drops to 0 keeps its contents and
its hash: it is free (evictable) and still serves hits until a new allocation evicts it, least
recently freed first. Free blocks without cached contents are handed out before cached ones.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence

__all__ = ["ROOT_HASH", "BlockManager", "block_hash", "extend_hashes"]

ROOT_HASH = b""  # the parent of a sequence's first block


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The hash of one full block: its parent's hash and its token ids (SHA-256, 16 bytes).

    A cryptographic hash, not Python's ``hash``: a collision would serve another prompt's K/V.
    """
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()[:16]


def extend_hashes(hashes: list[bytes], token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Append to ``hashes`` the chained hash of every full block of ``token_ids`` it lacks; returns it."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else ROOT_HASH
        hashes.append(block_hash(parent, token_ids[i * block_size:(i + 1) * block_size]))
    return hashes


class BlockManager:
    """Owns block *numbers*; the tensors live in :class:`~.kv_cache.KVCache`.

    Every block is in exactly one place: *held* (ref count > 0: in one or more sequences' tables),
    *free* (ref count 0; either plain or still holding a cached prefix, evictable), or *reserved*
    (taken out of circulation by a KV-pressure fault). ``num_used`` counts held and reserved
    blocks; cached-but-free blocks count as free, as in vLLM V1's ``kv_cache_usage_perc``.
    ``num_used + num_free == num_total`` always.
    """

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_total = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._plain: deque[int] = deque(range(num_blocks))  # free, nothing cached in them
        self._cached_free: OrderedDict[int, None] = OrderedDict()  # free, cached: least recently freed first
        self._ref = [0] * num_blocks
        self._hash_of: dict[int, bytes] = {}  # cached block -> its hash (held or free)
        self._by_hash: dict[bytes, int] = {}  # hash -> the block caching it
        self.tables: dict[str, list[int]] = {}
        self._cached_upto: dict[str, int] = {}  # sequence -> how many of its leading blocks were offered to the cache
        self._reserved: list[int] = []
        self.evictions = 0  # cached blocks whose contents were dropped (reused, reserved or reset)

    # -- counts -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks with ref count 0 (cached or not), not reserved."""
        return len(self._plain) + len(self._cached_free)

    @property
    def num_cached_free(self) -> int:
        """Free blocks still holding a cached prefix (evictable)."""
        return len(self._cached_free)

    @property
    def num_cached(self) -> int:
        """Blocks entered in the prefix cache, held or free."""
        return len(self._by_hash)

    @property
    def num_reserved(self) -> int:
        return len(self._reserved)

    @property
    def num_used(self) -> int:
        """Blocks held by sequences plus reserved ones (cached-but-free blocks are free)."""
        return self.num_total - self.num_free

    @property
    def num_used_by_seqs(self) -> int:
        """Blocks held by sequences (ref count > 0): every block is held, free or reserved."""
        return self.num_used - len(self._reserved)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_blocks_of(self, seq_id: str) -> int:
        return len(self.tables.get(seq_id, ()))

    def ref_count(self, block: int) -> int:
        return self._ref[block]

    # -- prefix cache -----------------------------------------------------------------------------
    def match_prefix(self, hashes: Sequence[bytes], num_tokens: int) -> list[int]:
        """The cached blocks of the longest run of hits from the first block of a sequence of
        ``num_tokens`` tokens whose full blocks hash to ``hashes``. The last token is never served
        from the cache (as in vLLM): its logits are needed to sample the next one."""
        if not self.prefix_caching:
            return []
        limit = min(len(hashes), (num_tokens - 1) // self.block_size)
        out: list[int] = []
        for h in hashes[:limit]:
            block = self._by_hash.get(h)
            if block is None:
                break
            out.append(block)
        return out

    def cache_blocks(self, seq_id: str, hashes: Sequence[bytes], num_computed: int) -> int:
        """Enter the sequence's full blocks whose K/V are computed (``num_computed`` tokens) in the
        cache under ``hashes``; the number newly cached. A block whose content another block already
        caches (both computed at once) stays out of it and is freed as a plain block."""
        table = self.tables.get(seq_id)
        if not self.prefix_caching or not table:
            return 0
        done = self._cached_upto.get(seq_id, 0)
        upto = min(num_computed // self.block_size, len(table), len(hashes))
        added = 0
        for i in range(done, upto):
            block, h = table[i], hashes[i]
            if block in self._hash_of or h in self._by_hash:
                continue
            self._hash_of[block] = h
            self._by_hash[h] = block
            added += 1
        if upto > done:
            self._cached_upto[seq_id] = upto
        return added

    def reset_prefix_cache(self) -> tuple[int, int]:
        """Forget every cached prefix: free cached blocks become plain, held ones keep their contents for
        their holders but serve no further hit. ``(free blocks evicted, held blocks forgotten)``."""
        evicted = len(self._cached_free)
        self._plain.extend(self._cached_free)
        self._cached_free.clear()
        forgotten = len(self._hash_of) - evicted
        self.evictions += evicted
        self._hash_of.clear()
        self._by_hash.clear()
        return evicted, forgotten

    # -- allocation -----------------------------------------------------------------------------
    def _uncache(self, block: int) -> None:
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._by_hash[h]
            self.evictions += 1

    def _take(self, n: int) -> list[int]:
        """``n`` free blocks, plain ones first, then cached ones evicted least recently freed first."""
        out = []
        for _ in range(n):
            if self._plain:
                out.append(self._plain.popleft())
            else:
                block, _ = self._cached_free.popitem(last=False)
                self._uncache(block)
                out.append(block)
        return out

    def _hold(self, block: int) -> None:
        if self._ref[block] == 0:
            self._cached_free.pop(block, None)  # a cache hit on a free block takes it off the free queue
        self._ref[block] += 1

    def _unhold(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if block in self._hash_of:
                self._cached_free[block] = None  # keeps its contents: evictable, most recently freed last
            else:
                self._plain.append(block)

    def can_allocate(self, num_tokens: int, cached: Sequence[int] = ()) -> bool:
        """Whether a new sequence of ``num_tokens`` tokens starting with the ``cached`` blocks fits."""
        from_free = sum(1 for b in cached if self._ref[b] == 0)  # hits on free blocks take them off the free queue
        return self.blocks_needed(num_tokens) - len(cached) + from_free <= self.num_free

    def allocate(self, seq_id: str, num_tokens: int, cached: Sequence[int] = ()) -> list[int]:
        """Give a new sequence enough blocks for ``num_tokens`` tokens: the ``cached`` blocks (prefix
        hits from ``match_prefix``, ref count + 1) and new ones for the rest."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        if not self.can_allocate(num_tokens, cached):
            raise MemoryError(f"need {self.blocks_needed(num_tokens) - len(cached)} new blocks, {self.num_free} free")
        for block in cached:  # first: they must leave the free queue before _take could evict them
            self._hold(block)
        new = self._take(self.blocks_needed(num_tokens) - len(cached))
        for block in new:
            self._hold(block)
        table = [*cached, *new]
        self.tables[seq_id] = table
        if cached:
            self._cached_upto[seq_id] = len(cached)
        return table

    def append_slot(self, seq_id: str, num_tokens: int) -> bool:
        """Grow the sequence's table to hold ``num_tokens`` tokens; False if no block is free."""
        table = self.tables.setdefault(seq_id, [])
        need = self.blocks_needed(num_tokens) - len(table)
        if need <= 0:
            return True
        if need > self.num_free:
            return False
        new = self._take(need)
        for block in new:
            self._hold(block)
        table.extend(new)
        return True

    def fork(self, parent_id: str, child_id: str, num_blocks: int | None = None) -> list[int]:
        """Let ``child_id`` hold the first ``num_blocks`` (default: all) of ``parent_id``'s blocks too
        (ref count + 1 each), as a fork of a sequence shares its prefix."""
        if child_id in self.tables:
            raise ValueError(f"sequence {child_id!r} already has blocks")
        shared = list(self.tables.get(parent_id, ())[:num_blocks])
        for block in shared:
            self._hold(block)
        self.tables[child_id] = shared
        return shared

    def free(self, seq_id: str) -> int:
        """Drop a sequence's hold on its blocks; the number of blocks it held. Blocks nobody else holds
        become free: cached ones keep their contents (evictable), the rest are plain."""
        self._cached_upto.pop(seq_id, None)
        table = self.tables.pop(seq_id, None)
        if not table:
            return 0
        # the tail first, so that a sequence's last blocks are evicted before its first ones (vLLM)
        for block in reversed(table):
            self._unhold(block)
        return len(table)

    def slot(self, seq_id: str, pos: int) -> int:
        table = self.tables[seq_id]
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    # -- reservations (KV-pressure fault) -------------------------------------------------------------
    def reserve(self, n: int) -> int:
        """Take up to ``n`` free blocks out of circulation (evicting cached ones as needed); the number taken."""
        k = max(0, min(int(n), self.num_free))
        self._reserved.extend(self._take(k))
        return k

    def release_reservation(self) -> int:
        k = len(self._reserved)
        self._plain.extend(self._reserved)
        self._reserved.clear()
        return k

    # -- invariants -----------------------------------------------------------------------------
    def check(self, full: bool = False) -> None:
        """Assert the accounting (two C-speed passes over the ref counts); ``full`` also walks every block in
        Python (at idle and in tests)."""
        free, reserved = self.num_free, len(self._reserved)
        num_held = self.num_total - self._ref.count(0)  # blocks with ref > 0
        assert num_held + free + reserved == self.num_total, (num_held, free, reserved, self.num_total)
        in_tables, refs_total = sum(len(t) for t in self.tables.values()), sum(self._ref)
        assert in_tables == refs_total, (in_tables, refs_total)
        if not full:
            return
        refs = Counter(b for t in self.tables.values() for b in t)
        assert all(self._ref[b] == refs.get(b, 0) for b in range(self.num_total)), "ref counts differ from the tables"
        held = set(refs)
        assert len(held) == self.num_used_by_seqs, "held count"
        plain, cached_free, res = set(self._plain), set(self._cached_free), set(self._reserved)
        assert len(plain) == len(self._plain) and len(res) == reserved, "a block is listed twice"
        for a, b, what in ((held, plain, "held and plain free"), (held, cached_free, "held and cached free"),
                           (held, res, "held and reserved"), (plain, cached_free, "free twice"),
                           (plain, res, "free and reserved"), (cached_free, res, "cached free and reserved")):
            assert not a & b, f"block(s) {sorted(a & b)[:5]} {what}"
        assert len(held) + len(plain) + len(cached_free) + len(res) == self.num_total, "a block is nowhere"
        assert all(b in self._hash_of for b in cached_free), "a cached free block has no hash"
        assert not (plain | res) & self._hash_of.keys(), "a plain or reserved block still has a hash"
        assert all(self._by_hash.get(h) == b for b, h in self._hash_of.items()), "hash maps disagree"
        assert len(self._by_hash) == len(self._hash_of), "hash maps differ in size"

    def holders(self) -> list[str]:
        """Sequence ids that currently hold at least one block."""
        return [sid for sid, t in self.tables.items() if t]
