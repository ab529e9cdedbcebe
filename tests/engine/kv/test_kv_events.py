"""The KV event hook: what the pool's index does is what a listener sees, in order; each
stored block carries its parent's chain key and its own tokens (what vLLM's events and a
router matching prompts need), however the block came to be indexed."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import EngineIntegrityError
from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import BlockPool, KVBlock
from engine.kv.kv_events import KVEventListener, KVEventListeners
from kvstore.keys import Key
from tests.engine.engine_harness import BT, WrappedStore, dram_store, fake_engine, run_checked

ALL = frozenset({0, 1})


class Recorder(KVEventListener):
    """Replays the events into the index they describe (key -> block id), keeping what each
    stored block was announced with (key -> (parent, token ids))."""

    def __init__(self) -> None:
        self.index: dict[Key, int] = {}
        self.announced: dict[Key, tuple[Key | None, tuple[int, ...]]] = {}
        self.log: list[tuple[str, int | None]] = []

    def block_stored(self, block_id: int, key: Key, layers: frozenset[int],
                     parent: Key | None, token_ids: Sequence[int]) -> None:
        assert key not in self.index, "stored twice without a removal"
        self.index[key] = block_id
        self.announced[key] = (parent, tuple(token_ids))
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
                key = next_key.to_bytes(16, "big")
                parent = (next_key - 1).to_bytes(16, "big") if next_key else None
                pool.cache(block, key, ALL, parent=parent, token_ids=[next_key, n])
                assert rec.announced[key] == (parent, (next_key, n))
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
    pool.cache(blocks[0], b"k" * 16, ALL, parent=None, token_ids=[1])
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

        def block_stored(self, block_id: int, key: Key, layers: frozenset[int],
                         parent: Key | None, token_ids: Sequence[int]) -> None:
            calls.append(self.name)

    registry = KVEventListeners()
    a, b = Named("a"), Named("b")
    registry.add(a)
    registry.add(b)
    with pytest.raises(ValueError):
        registry.add(a)  # twice would hear every event twice
    registry.block_stored(0, b"x" * 16, ALL, None, [1])
    registry.remove(a)
    registry.block_stored(1, b"y" * 16, ALL, b"x" * 16, [2])
    assert calls == ["a", "b", "b"] and len(registry) == 1
    with pytest.raises(ValueError):
        registry.remove(a)


def chain_of(tokens: list[int]) -> list[Key]:
    """Stand-in chain keys: each block's key is every token up to its end, so a key names
    its parent (``key[:-BT]``) and its own tokens (``key[-BT:]``)."""
    return [bytes(tokens[: (i + 1) * BT]) for i in range(len(tokens) // BT)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=24),
                          st.booleans()), min_size=1, max_size=25))
def test_block_tables_announce_each_block_with_its_parent_and_tokens(
        requests: list[tuple[list[int], bool]]) -> None:
    bm = BlockManager(6, block_tokens=BT, bytes_per_block=64)
    rec = Recorder()
    registry = KVEventListeners()
    registry.add(rec)
    bm.pool.events = registry
    for n, (tokens, reset) in enumerate(requests):
        keys = chain_of(tokens)
        hit = bm.longest_prefix(keys, len(tokens))
        bm.open(n, hit)
        if not bm.grow(n, len(tokens)):
            bm.release(n)
            continue
        bm.cache(n, keys, len(hit), len(keys), ALL, tokens)
        bm.release(n)
        if reset:
            assert bm.pool.reset_prefix_cache()
        bm.check_integrity()
        assert rec.index == pool_index(bm.pool)
        for key in rec.index:
            parent, toks = rec.announced[key]
            assert toks == tuple(key[-BT:]) and parent == (key[:-BT] or None)


def test_caching_more_blocks_than_the_tokens_cover_is_an_integrity_error() -> None:
    bm = BlockManager(4, block_tokens=BT, bytes_per_block=64)
    bm.open("a", [])
    assert bm.grow("a", 2 * BT)
    with pytest.raises(EngineIntegrityError):
        bm.cache("a", chain_of(list(range(2 * BT))), 0, 2, ALL, list(range(2 * BT - 1)))


def assert_announced_as_chain(rec: Recorder, keys: list[Key], tokens: list[int]) -> None:
    """Every block of this chain that was announced came with its chain parent and its
    own slice of the request's tokens."""
    for i, key in enumerate(keys):
        if key in rec.announced:
            assert rec.announced[key] == (keys[i - 1] if i else None,
                                          tuple(tokens[i * BT:(i + 1) * BT]))


def test_an_engine_reports_its_computed_blocks_and_their_eviction() -> None:
    rec = Recorder()
    with fake_engine(pool_blocks=6) as eng:
        eng.kv.events.add(rec)
        (a,) = run_checked(eng, [list(range(1, 4 * BT + 2))])
        stored = [bid for kind, bid in rec.log if kind == "stored"]
        assert len(stored) >= 4
        assert list(rec.index) == eng.kv.keys(a)[: len(rec.index)]
        assert_announced_as_chain(rec, eng.kv.keys(a), a.token_ids)
        # Another prompt of the whole pool evicts a's blocks: each one reported removed.
        run_checked(eng, [list(range(100, 100 + 5 * BT + 1))])
        assert any(kind == "removed" for kind, _ in rec.log)
        assert rec.index == pool_index(eng.blocks.pool)


def test_blocks_loaded_from_the_store_are_announced_with_their_tokens() -> None:
    store = dram_store()
    prompt = list(range(1, 6 * BT + 2))
    try:
        # WrappedStore: an engine's close leaves the inner store open for the next one.
        with fake_engine(WrappedStore(store)) as first:
            run_checked(first, [prompt])  # its commit reaches the store when it closes
        rec = Recorder()
        with fake_engine(WrappedStore(store)) as second:
            second.kv.events.add(rec)
            (a,) = run_checked(second, [prompt])
            loaded = a.stats.hit_tokens["dram"] // BT
            assert loaded >= 5, a.stats  # the store served the prompt's blocks
            keys = second.kv.keys(a)
            assert set(keys[:loaded]) <= set(rec.announced)
            assert_announced_as_chain(rec, keys, a.token_ids)
    finally:
        store.close()
