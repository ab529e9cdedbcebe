"""Store trouble found in review (issue #33): each costs misses or a resend, never an
engine error, a leak or a block written that its job does not hold. Real embedded stores,
misbehaving through ``WrappedStore``; the fake model's K/V are known bytes."""

from __future__ import annotations

import pytest

from kvstore.keys import chain_keys
from tests.engine.engine_harness import (
    BT,
    GREEDY,
    WrappedStore,
    dram_store,
    fake_engine,
    run_checked,
)
from tests.engine.fake_model import greedy_continuation


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 19 + i * 7) % 90 + 1 for i in range(n)]


@pytest.fixture
def store():
    inner = dram_store()
    yield WrappedStore(inner)
    inner.close()


def test_blocks_the_store_dropped_are_not_marked_stored(store: WrappedStore) -> None:
    """The store already holds blocks 3 and 4 of the chain (another engine sent them) and
    drops 1 and 2 of this commit: only what it accepted may count as stored, whatever
    ``inserted + present`` adds up to, so the next request sends 1 and 2 again."""
    p = prompt(22)
    tokens = p + greedy_continuation(p, GREEDY.max_new_tokens)
    with fake_engine(store) as eng:
        keys = chain_keys(eng.ns, tokens[: 6 * BT])
        blank = bytes(eng.ns.block_bytes)
        store.inner.commit(eng.ns, keys[:5], {3: blank, 4: blank})
        store.commit_drop = {1, 2}
        run_checked(eng, [p])
        assert eng.drain(10)
        assert sorted(store.commits[-1]) == list(range(6))
        pool = eng.blocks.pool.longest_prefix(keys)
        assert len(pool) == 6
        assert not pool[1].stored_layers and not pool[2].stored_layers
        store.commit_drop = set()
        run_checked(eng, [tokens + prompt(9, 3)])
        assert eng.drain(10)
        assert {1, 2} <= set(store.commits[-1])
        eng.check_integrity()
