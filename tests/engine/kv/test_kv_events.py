"""The KV event hook: what the pool's index does is what a listener sees, in order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.block_pool import BlockPool, KVBlock
from engine.kv.kv_events import KVEventListener, KVEventListeners
from kvstore.keys import Key
from tests.engine.engine_harness import BT, fake_engine, run_checked

ALL = frozenset({0, 1})


class Recorder(KVEventListener):
    """Replays the events into the index they describe (key -> block id)."""

    def __init__(self) -> None:
        self.index: dict[Key, int] = {}
        self.log: list[tuple[str, int | None]] = []

    def block_stored(self, block_id: int, key: Key, layers: frozenset[int]) -> None:
        assert key not in self.index, "stored twice without a removal"
        self.index[key] = block_id
        self.log.append(("stored", block_id))

    def block_removed(self, block_id: int, key: Key) -> None:
        assert self.index.pop(key) == block_id, "removed a block that was not stored"
        self.log.append(("removed", block_id))

    def all_cleared(self) -> None:
        self.index.clear()
        self.log.append(("cleared", None))


def pool_index(pool: BlockPool) -> dict[Key, int]:
    return {b.key: b.block_id for b in pool.blocks if b.key is not None}


OPS = st.lists(st.tuples(st.sampled_from(["alloc", "cache", "free", "touch", "reset"]),
                         st.integers(0, 7)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_a_listener_rebuilds_the_pool_index_from_the_events(ops: list[tuple[str, int]]) -> None:
    rec = Recorder()
    registry = KVEventListeners()
    registry.add(rec)
    pool = BlockPool(6, registry)
    held: list[KVBlock] = []
    next_key = 0
    for op, n in ops:
        if op == "alloc" and n <= pool.num_free:
            held.extend(pool.allocate(n % 3))
        elif op == "cache" and held:
            block = held[n % len(held)]
            if block.key is None:
                pool.cache(block, next_key.to_bytes(16, "big"), ALL)
                next_key += 1
        elif op == "free" and held:
            pool.free([held.pop(n % len(held))])
        elif op == "touch":
            hit = pool.longest_prefix([k.to_bytes(16, "big") for k in range(n)])
            pool.touch(hit[:1])
            held.extend(hit[:1])
        elif op == "reset":
            assert pool.reset_prefix_cache() == (not held)
        pool.check_integrity()
        assert rec.index == pool_index(pool)


def test_reset_is_refused_while_a_block_is_in_use_and_clears_everything_after() -> None:
    rec = Recorder()
    registry = KVEventListeners()
    registry.add(rec)
    pool = BlockPool(3, registry)
    blocks = pool.allocate(2)
    pool.cache(blocks[0], b"k" * 16, ALL)
    assert not pool.reset_prefix_cache()
    assert rec.log == [("stored", blocks[0].block_id)]
    pool.free(blocks)
    assert pool.reset_prefix_cache()
    assert rec.log[-1] == ("cleared", None) and pool.num_cached == 0
    assert pool.longest_prefix([b"k" * 16]) == []
    pool.check_integrity()


def test_the_registry_calls_every_listener_in_order_and_forgets_removed_ones() -> None:
    calls: list[str] = []

    class Named(Recorder):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def block_stored(self, block_id: int, key: Key, layers: frozenset[int]) -> None:
            calls.append(self.name)

    registry = KVEventListeners()
    a, b = Named("a"), Named("b")
    registry.add(a)
    registry.add(b)
    registry.block_stored(0, b"x" * 16, ALL)
    registry.remove(a)
    registry.block_stored(1, b"y" * 16, ALL)
    assert calls == ["a", "b", "b"] and len(registry) == 1
    with pytest.raises(ValueError):
        registry.remove(a)


def test_an_engine_reports_its_computed_blocks_and_their_eviction() -> None:
    rec = Recorder()
    with fake_engine(pool_blocks=6) as eng:
        eng.kv.events.add(rec)
        (a,) = run_checked(eng, [list(range(1, 4 * BT + 2))])
        stored = [bid for kind, bid in rec.log if kind == "stored"]
        assert len(stored) >= 4
        assert list(rec.index) == eng.kv.keys(a)[: len(rec.index)]
        # Another prompt of the whole pool evicts a's blocks: each one reported removed.
        run_checked(eng, [list(range(100, 100 + 5 * BT + 1))])
        assert any(kind == "removed" for kind, _ in rec.log)
        assert rec.index == pool_index(eng.blocks.pool)
