"""The KV manager: a request's keys, its records from admission to free, replay copies and
what each block is known to hold, through real (fake-model) engines."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.connector.store_link import PrimaryOnlyLink
from engine.core.sequence import Sequence
from engine.errors import EngineIntegrityError
from engine.kv.request_scope import RequestScope
from kvstore.keys import chain_keys
from tests.engine.engine_harness import (
    BT,
    GREEDY,
    WrappedStore,
    dram_store,
    fake_engine,
    run_checked,
)

HYBRID = {"windows": (2 * BT, None), "replay_keep_tokens": 2 * BT + 12}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 500), max_size=40), st.lists(st.integers(0, 500), max_size=9),
       st.sampled_from([None, "t"]), st.sampled_from([None, "salt"]))
def test_keys_are_the_stores_chain_in_the_requests_namespace(
    prompt: list[int], more: list[int], tenant: str | None, salt: str | None
) -> None:
    with fake_engine() as eng:
        seq = Sequence(list(prompt), GREEDY, RequestScope(tenant, salt))
        ns = seq.namespace(eng.ns)
        assert eng.kv.keys(seq) == chain_keys(ns, prompt[: len(prompt) // BT * BT])
        seq.token_ids.extend(more)  # an answer grows: the memo follows the new blocks
        n = len(seq.token_ids) // BT * BT
        assert eng.kv.keys(seq) == chain_keys(ns, seq.token_ids[:n])
        if tenant or salt:
            assert eng.kv.keys(seq)[:1] != chain_keys(eng.ns, seq.token_ids[:n])[:1] or n == 0


def test_a_running_request_has_records_that_free_drops() -> None:
    with fake_engine() as eng:
        seq = eng.add_request(list(range(1, 5 * BT + 2)), GREEDY)
        eng.step()
        assert eng.kv.holds(seq) and eng.kv.num_cached_blocks(seq) == 4  # 16 of 21 computed
        eng.check_integrity()
        while not seq.is_finished:
            eng.step()
        assert not eng.kv.holds(seq) and eng.kv.num_cached_blocks(seq) == 0
        eng.check_integrity()
        # A record left behind for a request that holds no table is an integrity error.
        eng.kv._num_cached[seq.seq_id] = 1
        with pytest.raises(EngineIntegrityError, match="holds no blocks"):
            eng.check_integrity()


def test_match_is_capped_so_the_last_token_is_computed_and_counts_revived_blocks() -> None:
    with fake_engine(pool_blocks=8) as eng:
        p = list(range(1, 3 * BT + 1))
        run_checked(eng, [p])
        again = Sequence(list(p), GREEDY)
        hit = eng.kv.match(again)
        # 12 tokens: a hit may cover (12 - 1) // 4 = 2 blocks; both are free, cached.
        assert hit.cap_blocks == 2 and len(hit.blocks) == 2
        assert hit.free_after == eng.kv.num_free - 2


def test_mark_stored_skips_a_block_reused_since_the_commit() -> None:
    with fake_engine(pool_blocks=8) as eng:
        (a,) = run_checked(eng, [list(range(1, 3 * BT + 2))])
        keys = eng.kv.keys(a)[:2]
        blocks = eng.blocks.pool.longest_prefix(keys)
        ids = [b.block_id for b in blocks]
        layers = frozenset({0})
        eng.kv.mark_stored(ids, [keys[1], keys[0]], layers)  # keys of other blocks
        assert all(not b.stored_layers for b in blocks)
        eng.kv.mark_stored(ids, keys, layers)
        assert all(b.stored_layers == layers for b in blocks)
        eng.check_integrity()


def test_a_replay_into_shared_pool_blocks_writes_private_copies_stored_as_the_originals(
) -> None:
    inner = dram_store()
    store = WrappedStore(inner)  # an engine's close leaves the inner store open
    try:
        p = list(range(1, 7 * BT + 2))
        with fake_engine(store, link_kind=PrimaryOnlyLink, **HYBRID) as first:
            run_checked(first, [p])  # no window tails: a hit at its end replays
        with fake_engine(store, link_kind=PrimaryOnlyLink, **HYBRID) as eng:
            # A loads 7 blocks (the full layer only): pool blocks without the sliding one.
            (a,) = run_checked(eng, [p])
            assert a.stats.hit_tokens["dram"] == 7 * BT and a.stats.replayed_tokens > 0
            # B hits them in the pool and replays into the last window's: private copies.
            b = eng.add_request(list(p), GREEDY)
            eng.step()
            copies = eng.blocks.counters["private_copies_total"]
            assert copies > 0
            table = eng.kv.table(b)
            plan = b.plan
            assert plan is not None and len(plan.replay_blocks) == copies
            layers = eng.kv.layers_of(b, plan.hit_blocks)
            for i in plan.replay_blocks:
                assert table[i].key is None  # its own block, not the indexed one
                # Held: the full layer (copied), and the sliding one once the replay wrote
                # the block whole (a window tail may send it); stored: as the original, so
                # not resent.
                rewritten = eng.planner.rewritten_blocks(plan, b.num_computed_tokens)
                sliding = eng.planner.sliding_layers if i in rewritten else frozenset()
                assert layers.held[i] == eng.planner.primary_layers | sliding
                assert layers.stored[i] == eng.planner.primary_layers
            eng.check_integrity()
            while not b.is_finished:
                eng.step()
                eng.check_integrity()
    finally:
        inner.close()
