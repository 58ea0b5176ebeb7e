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
