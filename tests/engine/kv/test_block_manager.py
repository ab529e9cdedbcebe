"""Block tables, owners and their references; the pool reported as tier hbm."""

from __future__ import annotations

import pytest

from engine.errors import EngineIntegrityError
from engine.kv.block_manager import BlockManager

ALL = frozenset({0})
TOKENS = list(range(64))  # token ids for up to 16 blocks of 4


def chain(n: int) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in range(1, n + 1)]


def test_full_hit_is_capped_so_the_last_token_is_computed() -> None:
    bm = BlockManager(8, block_tokens=4, bytes_per_block=64)
    bm.open("a", [])
    assert bm.grow("a", 8)
    bm.cache("a", chain(2), 0, 2, ALL, TOKENS)
    bm.release("a")
    # 8 tokens = 2 full blocks, but a hit may cover at most (8 - 1) // 4 = 1 of them.
    assert len(bm.longest_prefix(chain(2), 8)) == 1
    assert len(bm.longest_prefix(chain(2), 9)) == 2
    bm.check_integrity()


def test_grow_is_all_or_nothing() -> None:
    bm = BlockManager(3, block_tokens=4, bytes_per_block=64)
    bm.open("a", [])
    assert bm.grow("a", 8)
    assert not bm.grow("a", 13)  # needs 4 blocks, the pool has 3
    assert len(bm.table("a")) == 2
    bm.check_integrity()


def test_a_held_block_is_not_reused_after_its_sequence_frees_it() -> None:
    bm = BlockManager(2, block_tokens=4, bytes_per_block=64)
    bm.open("seq", [])
    assert bm.grow("seq", 8)
    held = bm.table("seq")[1:]
    bm.hold("commit", held)
    bm.release("seq")
    assert bm.take("other", 2) is None  # one block is still being copied out
    other = bm.take("other2", 1)
    assert other is not None and other[0] is not held[0]
    bm.release("commit")
    assert bm.take("third", 1) == held
    bm.check_integrity()


def test_hand_over_moves_references() -> None:
    bm = BlockManager(4, block_tokens=4, bytes_per_block=64)
    bm.open("seq", [])
    loaded = bm.take("load", 2)
    assert loaded is not None
    bm.hand_over("load", "seq")
    assert bm.table("seq") == loaded and not bm.holds("load")
    bm.check_integrity()


def test_integrity_catches_a_reference_without_owner() -> None:
    bm = BlockManager(2, block_tokens=4, bytes_per_block=64)
    bm.open("a", [])
    bm.grow("a", 4)
    bm.pool.touch(bm.table("a"))  # taken behind the manager's back
    with pytest.raises(EngineIntegrityError):
        bm.check_integrity()


def test_stats_report_tier_hbm() -> None:
    bm = BlockManager(4, block_tokens=4, bytes_per_block=100)
    bm.open("a", [])
    bm.grow("a", 8)
    bm.cache("a", chain(2), 0, 2, ALL, TOKENS)
    bm.release("a")
    bm.open("b", bm.longest_prefix(chain(2), 9), lookup_blocks=2)
    s = bm.stats()
    assert s.name == "hbm" and s.capacity_bytes == 400 and s.used_bytes == 200
    assert s.counters["hit_blocks_total"] == 2 and s.counters["lookup_blocks_total"] == 2


def test_privatize_swaps_in_fresh_blocks_and_keeps_the_shared_ones_cached() -> None:
    bm = BlockManager(6, block_tokens=4, bytes_per_block=64)
    bm.open("a", [])
    bm.grow("a", 12)
    bm.cache("a", chain(3), 0, 3, ALL, TOKENS)
    shared = list(bm.table("a"))
    bm.open("b", bm.longest_prefix(chain(3), 13))
    pairs = bm.privatize("b", 1, 3)
    assert [old for old, _ in pairs] == [shared[1].block_id, shared[2].block_id]
    mine = bm.table("b")
    assert mine[0] is shared[0] and all(b.key is None and b.ref_cnt == 1 for b in mine[1:])
    assert all(b.ref_cnt == 1 for b in shared[1:])  # a still holds them, indexed
    bm.release("a")
    assert len(bm.longest_prefix(chain(3), 13)) == 3
    bm.check_integrity()
    bm.take("x", bm.num_free)
    with pytest.raises(EngineIntegrityError, match="free blocks"):
        bm.privatize("b", 0, 1)


def test_truncate_drops_the_tail() -> None:
    bm = BlockManager(4, block_tokens=4, bytes_per_block=64)
    bm.open("a", [])
    bm.grow("a", 16)
    bm.cache("a", chain(4), 0, 4, ALL, TOKENS)
    bm.truncate("a", 1)
    assert len(bm.table("a")) == 1 and bm.num_free == 3
    assert len(bm.longest_prefix(chain(4), 17)) == 4  # still cached, free
    bm.check_integrity()
