"""The pool's block states, its prefix index and LRU reuse (tail first)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.errors import EngineIntegrityError
from engine.kv.block_pool import BlockPool, NoFreeBlocks

ALL = frozenset({0, 1})


def keys(n: int, tag: str = "a") -> list[bytes]:
    return [f"{tag}{i:015d}".encode() for i in range(n)]


def cached_chain(pool: BlockPool, chain: list[bytes]) -> list:
    blocks = pool.allocate(len(chain))
    for b, k in zip(blocks, chain, strict=True):
        assert pool.cache(b, k, ALL, parent=None, token_ids=[])
    return blocks


def test_freed_chain_stays_hittable_and_is_evicted_tail_first() -> None:
    pool = BlockPool(4)
    chain = keys(3)
    blocks = cached_chain(pool, chain)
    pool.free(reversed(blocks))
    assert pool.longest_prefix(chain) == blocks
    (taken,) = pool.allocate(2)[1:]  # the empty block, then the chain's tail
    assert taken is blocks[2]
    assert pool.longest_prefix(chain) == blocks[:2]
    assert pool.counters["evicted_blocks_total"] == 1
    pool.check_integrity()


def test_touch_revives_a_free_cached_block_and_protects_it() -> None:
    pool = BlockPool(2)
    blocks = cached_chain(pool, keys(2))
    pool.free(reversed(blocks))
    pool.touch(blocks[:1])
    assert pool.num_free == 1
    (other,) = pool.allocate(1)
    assert other is blocks[1]
    with pytest.raises(NoFreeBlocks):
        pool.allocate(1)
    pool.check_integrity()


def test_allocate_too_many_takes_nothing() -> None:
    pool = BlockPool(3)
    pool.allocate(2)
    with pytest.raises(NoFreeBlocks):
        pool.allocate(2)
    assert pool.num_free == 1
    pool.check_integrity()


def test_duplicate_key_keeps_the_first_block() -> None:
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    assert pool.cache(a, b"k" * 16, ALL, parent=None, token_ids=[])
    assert not pool.cache(b, b"k" * 16, ALL, parent=None, token_ids=[])
    pool.free([a, b])
    assert pool.longest_prefix([b"k" * 16]) == [a]
    assert pool.num_empty == 1  # b went back empty: nothing points at it
    pool.check_integrity()


def test_double_free_and_stale_refs_are_caught() -> None:
    pool = BlockPool(2)
    (a,) = pool.allocate(1)
    pool.free([a])
    with pytest.raises(EngineIntegrityError):
        pool.free([a])
    a.ref_cnt = 1  # a reference nobody took
    with pytest.raises(EngineIntegrityError):
        pool.check_integrity()


def test_eviction_forgets_layers_and_stored_layers() -> None:
    pool = BlockPool(1)
    (a,) = pool.allocate(1)
    pool.cache(a, b"k" * 16, ALL, parent=None, token_ids=[])
    a.stored_layers = ALL
    pool.free([a])
    (again,) = pool.allocate(1)
    assert again is a and a.key is None and not a.stored_layers and not a.layers
    pool.check_integrity()


def test_a_block_records_the_layers_it_holds() -> None:
    pool = BlockPool(2)
    a, b = pool.allocate(2)
    with pytest.raises(EngineIntegrityError, match="no layer"):
        pool.cache(a, b"k" * 16, frozenset(), parent=None, token_ids=[])
    assert pool.cache(a, b"k" * 16, frozenset({1}), parent=None, token_ids=[])
    assert a.layers == {1}
    a.stored_layers = frozenset({0, 1})  # the store cannot hold what the block lacks
    with pytest.raises(EngineIntegrityError, match="lacks"):
        pool.check_integrity()
    a.stored_layers = frozenset({1})
    b.layers = frozenset({0})  # no key, no layers
    with pytest.raises(EngineIntegrityError, match="without a key"):
        pool.check_integrity()
    b.layers = frozenset()
    pool.check_integrity()


@given(st.lists(st.tuples(st.sampled_from("aft"), st.integers(0, 7)), max_size=60))
def test_random_operations_keep_the_pool_consistent(ops: list[tuple[str, int]]) -> None:
    pool = BlockPool(6)
    held: list = []
    counter = 0
    for op, arg in ops:
        if op == "a" and arg <= pool.num_free:
            new = pool.allocate(arg)
            for b in new:
                if counter % 2 == 0:
                    pool.cache(b, counter.to_bytes(16, "big"), ALL, parent=None, token_ids=[])
                counter += 1
            held.extend(new)
        elif op == "f" and held:
            pool.free([held.pop(arg % len(held))])
        elif op == "t":
            hit = pool.longest_prefix([(arg * 2).to_bytes(16, "big")])
            pool.touch(hit)
            held.extend(hit)
        pool.check_integrity()
        assert pool.num_free == pool.num_blocks - len({id(b) for b in held})
