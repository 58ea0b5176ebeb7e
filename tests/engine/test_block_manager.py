from __future__ import annotations

import pytest

from chaos.stack.engine import BlockManager


def test_allocate_append_free_and_invariant():
    bm = BlockManager(8, 4)
    bm.allocate("a", 5)  # 2 blocks
    assert bm.num_blocks_of("a") == 2 and bm.num_free == 6
    assert bm.append_slot("a", 8) and bm.num_blocks_of("a") == 2
    assert bm.append_slot("a", 9) and bm.num_blocks_of("a") == 3
    bm.check()
    assert bm.free("a") == 3
    assert bm.num_used == 0 and bm.num_free == 8
    bm.check()


def test_exhaustion_and_reservation():
    bm = BlockManager(4, 4)
    assert bm.reserve(3) == 3
    assert bm.num_reserved == 3 and bm.num_used == 3 and bm.num_used_by_seqs == 0
    assert not bm.can_allocate(5)
    bm.allocate("a", 4)
    assert not bm.append_slot("a", 5)
    with pytest.raises(MemoryError):
        bm.allocate("b", 1)
    assert bm.reserve(10) == 0
    bm.check()
    assert bm.release_reservation() == 3
    assert bm.append_slot("a", 5)
    bm.check()


def test_slot_mapping():
    bm = BlockManager(4, 4)
    table = bm.allocate("a", 6)
    assert bm.slot("a", 5) == table[1] * 4 + 1


# -- prefix caching ------------------------------------------------------------------------------
from chaos.stack.engine.block_manager import ROOT_HASH, block_hash, extend_hashes  # noqa: E402

BS = 4


def _hashes(ids: list[int]) -> list[bytes]:
    return extend_hashes([], ids, BS)


def _run(bm: BlockManager, sid: str, ids: list[int]) -> int:
    """Admit ``ids`` as the engine does (prefix hits first), compute it all, cache its full blocks;
    the number of tokens served from the cache."""
    hashes = _hashes(ids)
    hit = bm.match_prefix(hashes, len(ids))
    bm.allocate(sid, len(ids), hit)
    bm.cache_blocks(sid, hashes, len(ids))
    bm.check(full=True)
    return len(hit) * BS


def test_hashes_chain_parent_and_tokens():
    a = _hashes([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert len(a) == 2 and a[0] == block_hash(ROOT_HASH, [1, 2, 3, 4]) and a[1] == block_hash(a[0], [5, 6, 7, 8])
    b = _hashes([9, 2, 3, 4, 5, 6, 7, 8])
    assert b[1] != a[1]  # same tokens in block 1, another parent: another hash
    grown = extend_hashes(list(a[:1]), [1, 2, 3, 4, 5, 6, 7, 8], BS)
    assert grown == a


def test_a_second_sequence_reuses_the_prefix_and_ref_counts_track_holders():
    bm = BlockManager(16, BS, prefix_caching=True)
    prompt = list(range(10, 23))  # 13 tokens: 3 full blocks + 1
    assert _run(bm, "a", prompt) == 0
    a_blocks = list(bm.tables["a"])
    assert _run(bm, "b", prompt) == 12  # 3 full blocks hit; the last token is always computed
    assert bm.tables["b"][:3] == a_blocks[:3] and bm.tables["b"][3] != a_blocks[3]
    assert [bm.ref_count(x) for x in a_blocks] == [2, 2, 2, 1]
    assert bm.num_used == 5 and bm.num_used_by_seqs == 5 and bm.holders() == ["a", "b"]
    bm.free("a")
    assert [bm.ref_count(x) for x in a_blocks[:3]] == [1, 1, 1] and bm.num_cached_free == 0
    bm.free("b")
    bm.check(full=True)
    # free but still cached: counted as free (vLLM V1), holders empty, evictable
    assert bm.num_used == 0 and bm.num_free == 16 and bm.num_cached_free == 3 and bm.holders() == []
    assert _run(bm, "c", [*prompt, 99, 98, 97]) == 12  # a hit on free cached blocks takes them back
    assert bm.num_cached_free == 0 and bm.num_used == 4  # 16 tokens: 3 hit blocks + 1 new


def test_a_prompt_that_is_exactly_full_blocks_keeps_its_last_block_uncached():
    bm = BlockManager(8, BS, prefix_caching=True)
    prompt = list(range(8))  # 2 full blocks
    _run(bm, "a", prompt)
    bm.free("a")
    assert _run(bm, "b", prompt) == 4  # (8 - 1) // 4 = 1 block: the last token's block is recomputed


def test_divergent_suffix_stops_the_match_at_the_first_differing_block():
    bm = BlockManager(32, BS, prefix_caching=True)
    shared = list(range(100, 108))  # 2 blocks
    _run(bm, "a", [*shared, 1, 2, 3, 4, 5])
    assert _run(bm, "b", [*shared, 1, 2, 3, 9, 5]) == 8
    assert _run(bm, "c", [7, *shared[1:], 1, 2, 3, 4, 5]) == 0  # first block differs: nothing after it counts


def test_eviction_takes_plain_blocks_first_then_least_recently_freed_cached():
    bm = BlockManager(6, BS, prefix_caching=True)
    _run(bm, "old", list(range(0, 9)))  # blocks: 2 cached + 1 partial
    _run(bm, "new", list(range(50, 59)))
    bm.free("old")
    bm.free("new")
    assert bm.num_cached_free == 4 and bm.num_free == 6
    evictions = bm.evictions
    bm.allocate("x", 8)  # 2 blocks: the 2 plain ones (the partial blocks), no eviction
    assert bm.evictions == evictions and bm.num_cached_free == 4
    bm.allocate("y", 4)  # 1 more: evicts the least recently freed cached block, one of "old"'s
    assert bm.evictions == evictions + 1 and bm.num_cached_free == 3
    bm.check(full=True)
    bm.free("x")
    bm.free("y")
    assert _run(bm, "new2", list(range(50, 59))) == 8  # "new" is intact
    # "old" lost its tail block first (freed tail first, as vLLM): its head block still hits
    assert _run(bm, "old2", list(range(0, 9))) == 4


def test_reservation_evicts_cached_blocks_and_release_returns_them_plain():
    bm = BlockManager(8, BS, prefix_caching=True)
    _run(bm, "a", list(range(0, 13)))
    bm.free("a")
    assert bm.num_cached_free == 3 and bm.num_free == 8
    assert bm.reserve(7) == 7  # 5 plain + 2 cached evicted
    assert bm.num_reserved == 7 and bm.num_used == 7 and bm.num_used_by_seqs == 0 and bm.num_cached_free == 1
    bm.check(full=True)
    assert bm.reserve(5) == 1 and bm.num_cached_free == 0 and bm.num_free == 0
    assert bm.release_reservation() == 8
    assert bm.num_free == 8 and bm.num_cached_free == 0 and bm.num_cached == 0
    bm.check(full=True)


def test_reset_prefix_cache_evicts_free_cached_blocks_and_forgets_held_ones():
    bm = BlockManager(16, BS, prefix_caching=True)
    _run(bm, "a", list(range(0, 9)))
    _run(bm, "b", list(range(50, 59)))
    bm.free("a")
    assert bm.reset_prefix_cache() == (2, 2)
    assert bm.num_cached == 0 and bm.num_cached_free == 0 and bm.num_used == 3
    bm.check(full=True)
    assert _run(bm, "c", list(range(50, 59))) == 0  # "b" still holds its blocks, but they no longer serve hits
    bm.free("b")
    bm.free("c")
    bm.check(full=True)


def test_without_prefix_caching_nothing_is_cached():
    bm = BlockManager(8, BS)
    assert _run(bm, "a", list(range(9))) == 0
    bm.free("a")
    assert bm.num_cached_free == 0 and _run(bm, "b", list(range(9))) == 0


def test_fork_shares_blocks_and_the_last_holder_frees_them():
    bm = BlockManager(8, BS, prefix_caching=True)
    _run(bm, "a", list(range(9)))
    shared = bm.fork("a", "kept", 2)
    assert [bm.ref_count(b) for b in shared] == [2, 2]
    bm.free("a")
    assert bm.holders() == ["kept"] and bm.num_used_by_seqs == 2  # still held: used, not cached-free
    bm.check(full=True)
    bm.free("kept")
    assert bm.num_used == 0 and bm.num_cached_free == 2


def test_check_catches_a_ref_count_that_disagrees_with_the_tables():
    bm = BlockManager(8, BS, prefix_caching=True)
    _run(bm, "a", list(range(9)))
    bm.tables["a"].append(bm.tables["a"][0])  # a table entry without its ref
    with pytest.raises(AssertionError):
        bm.check()
