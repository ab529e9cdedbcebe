"""The pool's index events: replaying them rebuilds exactly the pool's prefix index, each
stored block carries its parent's key and its own tokens, and the registry fans out."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.block_manager import BlockManager
from engine.kv.events import BlockEventListener, BlockEventListeners, NullBlockEventListener
from kvstore.keys import Key

BT = 4
ALL = frozenset({0})


class Recorder(BlockEventListener):
    """Keeps the index the events describe, and checks each event against it."""

    def __init__(self) -> None:
        self.index: dict[Key, tuple[Key | None, tuple[int, ...]]] = {}
        self.log: list[tuple[str, object]] = []

    def stored(self, key: Key, parent: Key | None, token_ids: Sequence[int]) -> None:
        assert key not in self.index, "a key announced twice without a removal"
        self.index[key] = (parent, tuple(token_ids))
        self.log.append(("stored", key))

    def removed(self, key: Key) -> None:
        del self.index[key]  # KeyError: a removal of a key never announced
        self.log.append(("removed", key))

    def cleared(self) -> None:
        self.index.clear()
        self.log.append(("cleared", None))


def chain_of(tokens: list[int]) -> list[Key]:
    """Chain keys as the engine builds them: each covers every token before its end."""
    return [bytes(tokens[: (i + 1) * BT]) for i in range(len(tokens) // BT)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=24),
                          st.booleans()), min_size=1, max_size=25))
def test_replayed_events_rebuild_the_index(requests: list[tuple[list[int], bool]]) -> None:
    bm = BlockManager(6, block_tokens=BT, bytes_per_block=64)
    rec = Recorder()
    bm.pool.events.register(rec)
    for n, (tokens, reset) in enumerate(requests):
        keys = chain_of(tokens)
        hit = bm.longest_prefix(keys, len(tokens))
        if len(keys) > bm.pool.num_blocks:
            continue
        bm.open(n, hit)
        if not bm.grow(n, len(tokens)):
            bm.release(n)
            continue
        bm.cache(n, keys, len(hit), len(keys), ALL, tokens)
        bm.release(n)
        if reset:
            assert bm.pool.reset_index()
        bm.check_integrity()
        assert set(rec.index) == {b.key for b in bm.pool.blocks if b.key is not None}
        for key, (parent, toks) in rec.index.items():
            assert toks == tuple(key[-BT:])  # the block's own tokens
            assert parent == (key[:-BT] or None)  # the key before it in the chain


def test_reset_is_refused_while_a_block_is_in_use() -> None:
    bm = BlockManager(4, block_tokens=BT, bytes_per_block=64)
    rec = Recorder()
    bm.pool.events.register(rec)
    tokens = list(range(8))
    bm.open("a", [])
    assert bm.grow("a", 8)
    bm.cache("a", chain_of(tokens), 0, 2, ALL, tokens)
    assert not bm.pool.reset_index()
    assert len(rec.index) == 2 and ("cleared", None) not in rec.log
    bm.release("a")
    assert bm.pool.reset_index()
    assert rec.index == {} and rec.log[-1] == ("cleared", None)
    assert bm.pool.num_empty == 4
    bm.check_integrity()


def test_a_duplicate_block_is_not_announced() -> None:
    bm = BlockManager(4, block_tokens=BT, bytes_per_block=64)
    rec = Recorder()
    bm.pool.events.register(rec)
    tokens = list(range(4))
    for owner in ("a", "b"):  # both compute the same block before either indexes it
        bm.open(owner, [])
        assert bm.grow(owner, 4)
    bm.cache("a", chain_of(tokens), 0, 1, ALL, tokens)
    bm.cache("b", chain_of(tokens), 0, 1, ALL, tokens)
    assert rec.log == [("stored", bytes(tokens))]


def test_the_registry_fans_out_in_order_and_refuses_doubles() -> None:
    reg = BlockEventListeners()
    a, b = Recorder(), Recorder()
    reg.register(a)
    reg.register(b)
    with pytest.raises(ValueError):
        reg.register(a)
    reg.stored(b"k", None, [1, 2])
    reg.unregister(a)
    reg.removed(b"k")
    assert a.index == {b"k": (None, (1, 2))} and b.index == {}
    assert len(reg) == 1
    NullBlockEventListener().stored(b"k", None, [1])  # hears nothing, raises nothing
