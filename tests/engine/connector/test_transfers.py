"""Loads from and commits to a real store (the embedded DRAM tier), on the fake model whose
K/V bytes are known: what the store gets and what comes back into the pool are checked."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.connector.store_link import COUNTERS
from engine.connector.transfer import PayloadBuffer
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import SequenceStatus
from engine.kv.cache import KVCache, KVCacheShape
from tests.engine.engine_harness import (
    BT,
    GREEDY,
    WrappedStore,
    dram_store,
    fake_engine,
    run_checked,
)
from tests.engine.fake_model import expected_block, greedy_continuation

LAYERS = 2


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 17 + i * 3) % 90 + 1 for i in range(n)]


def payload_k(raw: bytes) -> torch.Tensor:
    """K of every layer of one stored block, ``[layers, BT]`` (head 0, dim 0)."""
    t = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
    rows = t.view(LAYERS, 2, BT, 1, 4)
    assert torch.equal(rows[:, 1], -rows[:, 0])  # V is -K in the fake model
    return rows[:, 0, :, 0, 0]


def test_finished_blocks_reach_the_store_in_its_payload_layout(store: WrappedStore) -> None:
    p = prompt(22)
    with fake_engine(store) as eng:
        (s,) = run_checked(eng, [p])
    tokens = p + s.output_ids
    full = (len(tokens) - 1) // BT  # the last sampled token has no K/V
    prompt_commit, end_commit = store.commits  # at the first token, at the end
    assert sorted(prompt_commit) == list(range(len(p) // BT))
    commit = {**prompt_commit, **end_commit}
    assert sorted(commit) == list(range(full))
    for i, raw in commit.items():
        assert torch.equal(payload_k(raw), expected_block(tokens, i, BT, LAYERS))


def test_a_fresh_engine_loads_the_prefix_from_the_store(store: WrappedStore) -> None:
    p = prompt(22)
    with fake_engine(store) as first:
        (a,) = run_checked(first, [p])
    follow = p + a.output_ids + prompt(10, 3)
    with fake_engine(store) as second:
        before = len(store.commits)
        (b,) = run_checked(second, [follow])
        stored = (len(p) + len(a.output_ids) - 1) // BT
        assert b.stats.hit_tokens == {"hbm": 0, "dram": stored * BT, "ssd": 0}
        assert b.stats.computed_tokens == len(follow) - stored * BT
        assert b.output_ids == greedy_continuation(follow, GREEDY.max_new_tokens)
        # The loaded blocks hold the first engine's K/V, and the commit sent only the rest.
        keys = second.kv.keys(b)
        for i, block in enumerate(second.blocks.pool.longest_prefix(keys[:stored])):
            got = torch.stack(
                [second.cache.k[layer][block.block_id, :, 0, 0] for layer in range(LAYERS)]
            )
            assert torch.equal(got, expected_block(follow, i, BT, LAYERS))
    assert min(set().union(*store.commits[before:])) == stored


def test_get_into_returning_fewer_blocks_admits_only_those(store: WrappedStore) -> None:
    p = prompt(30)
    with fake_engine(store) as first:
        run_checked(first, [p])
    store.short_get = 2
    with fake_engine(store) as second:
        (b,) = run_checked(second, [p])
    assert b.stats.hit_tokens["dram"] == 2 * BT
    assert b.stats.computed_tokens == len(p) - 2 * BT
    assert b.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)


def test_a_load_past_its_deadline_is_recomputed(store: WrappedStore) -> None:
    p = prompt(30)
    with fake_engine(store) as first:
        run_checked(first, [p])
    store.get_gate.clear()  # the loader's get_into stalls until the gate opens below
    with fake_engine(store, load_timeout_s=1.0) as second:
        try:
            (b,) = run_checked(second, [p])
            assert b.stats.load_gave_up == 1
            assert b.stats.hit_tokens["dram"] == 0 and b.stats.computed_tokens == len(p)
            assert b.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)
            # Once b's own blocks are committed and let go, the given-up job still holds
            # its blocks (the prompt's 7 full blocks, short of the last token's) while the
            # loader is inside get_into: they must not be reused before it is out.
            assert second.drain(10)
            assert not second.loader.wait_idle(0) and second.loader.unfinished == 1
            assert sum(blk.ref_cnt for blk in second.blocks.pool.blocks) == (len(p) - 1) // BT
        finally:
            store.get_gate.set()  # a failed check above must not leave close() waiting
        assert second.loader.wait_idle(10)  # its get done, the job is handed back
        assert second.loader.unfinished == 0
        second.drain(5)
        second.check_integrity()
        assert second.kv.num_free == second.kv.num_blocks  # all free


def test_the_link_reports_every_counter_from_the_start(store: WrappedStore) -> None:
    with fake_engine(store) as eng:
        fresh = eng.link.counters()
        (a,) = run_checked(eng, [prompt(22)])
        eng.drain(5)
        after = eng.link.counters()
    assert fresh == dict.fromkeys(COUNTERS, 0)  # present before anything moved
    # An empty store: every whole block the request computed is new to it (its prompt and
    # answer, less the last answer token, whose K/V is never computed).
    assert after["store_errors_total"] == 0
    assert after["committed_blocks_total"] == (22 + len(a.output_ids) - 1) // BT == 6


def test_a_dead_store_costs_misses_and_a_revived_one_is_used_again(
    store: WrappedStore,
) -> None:
    p = prompt(26)
    store.dead = True
    with fake_engine(store) as eng:
        (a,) = run_checked(eng, [p])
        assert a.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)
        eng.drain(5)
        assert eng.link.counters()["store_errors_total"] > 0
        store.dead = False
        (b,) = run_checked(eng, [p + a.output_ids + prompt(5, 1)])
    assert b.stats.hit_tokens["hbm"] > 0  # the pool still serves what it holds
    assert store.commits  # and the store takes the blocks again once it is back


@settings(max_examples=25)
@given(
    lens=st.lists(st.integers(1, 40), min_size=2, max_size=6),
    shared=st.integers(0, 24),
    pool_blocks=st.integers(19, 32),
    budget=st.integers(1, 48),
    short=st.one_of(st.none(), st.integers(0, 3)),
)
def test_random_traffic_with_a_store_keeps_the_pool_whole(
    lens: list[int], shared: int, pool_blocks: int, budget: int, short: int | None
) -> None:
    """Loads, short loads, preemption and pending copies, all at once: integrity holds at
    every step and every reference is returned at the end."""
    head = prompt(shared, 99)
    prompts = [head + prompt(n, i) for i, n in enumerate(lens)]
    inner = dram_store()
    store = WrappedStore(inner)
    store.short_get = short
    params = SamplingParams(max_new_tokens=8)
    try:
        for _ in range(2):  # the second engine starts with an empty pool: store hits
            with fake_engine(store, pool_blocks=pool_blocks, budget=budget, max_seqs=3) as eng:
                seqs = run_checked(eng, prompts, params, staggered=True)
                for p, s in zip(prompts, seqs, strict=True):
                    assert s.output_ids == greedy_continuation(p, params.max_new_tokens)
                    assert sum(s.stats.hit_tokens.values()) + s.stats.computed_tokens == len(p)
                eng.drain(10)
                eng.check_integrity()
                assert eng.kv.num_free == eng.kv.num_blocks  # all free
    finally:
        inner.close()


def test_running_requests_keep_computing_while_one_loads(store: WrappedStore) -> None:
    p = prompt(30)
    with fake_engine(store) as first:
        run_checked(first, [p])
    store.get_gate.clear()  # the load stays in flight until the gate opens
    with fake_engine(store) as eng:
        busy = eng.add_request(prompt(9, 5), SamplingParams(max_new_tokens=200))
        try:
            while not busy.output_ids:
                eng.step()
            loading = eng.add_request(p, GREEDY)
            eng.step()
            assert loading.status is SequenceStatus.LOADING
            before = len(busy.output_ids)
            for _ in range(10):
                eng.step()
            assert loading.status is SequenceStatus.LOADING
            assert len(busy.output_ids) - before == 10  # a token per step meanwhile
        finally:
            store.get_gate.set()  # a failed check above must not leave close() waiting
        while not loading.is_finished:
            eng.step()
        assert loading.stats.hit_tokens["dram"] == (len(p) - 1) // BT * BT  # 7 full blocks
        assert loading.stats.load_gave_up == 0
        assert loading.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)


def test_cpu_payload_rows_are_page_aligned_for_the_ssd_tier() -> None:
    """The rows a store load lands in: page aligned (the SSD tier then reads into them
    directly; torch's allocator aligns to 64 bytes, which forced its staging copy), and
    they stay valid after the buffer grows."""
    shape = KVCacheShape(num_layers=2, num_blocks=4, block_tokens=16, kv_heads=2, head_dim=32,
                         dtype=torch.bfloat16)
    buf = PayloadBuffer(KVCache(shape, torch.device("cpu")), layers=[0, 1])
    assert buf.rows(0).shape == (0, 2, 2, 16, 2, 32)  # a load of nothing
    small = buf.rows(1)
    small.fill_(3)
    rows = buf.rows(8)  # grows: a new allocation
    assert rows.data_ptr() % 4096 == 0 and small.data_ptr() % 4096 == 0
    assert rows.shape == (8, 2, 2, 16, 2, 32)
    assert (small == 3).all()  # the old rows' memory outlives the buffer's swap
    row_bytes = shape.bytes_per_block
    assert all((rows[i].data_ptr() - rows.data_ptr()) == i * row_bytes for i in range(8))
