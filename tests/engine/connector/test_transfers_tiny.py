"""The transfer cases of ``test_transfers`` on the real ``tiny`` model (float32) instead of
the stand-in: a pool so small that committed blocks are reused while their commit waits,
and random traffic with store loads, short loads and preemption keeping the pool whole."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.connector.store_link import KVStoreLink, NullStoreLink, StoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel
from kvstore.keys import chain_keys
from tests.engine.engine_harness import WrappedStore, dram_store, run_checked

BT = 64
PARAMS = SamplingParams(max_new_tokens=4, ignore_eos=True)


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 500) for _ in range(n)]


def tiny_engine(lm: LoadedModel, link: StoreLink | None, *, pool_blocks: int, budget: int,
                block_tokens: int = BT, max_seqs: int = 8) -> LLMEngine:
    config = EngineConfig(pool_tokens=pool_blocks * block_tokens, block_tokens=block_tokens,
                          max_batched_tokens=budget, max_num_seqs=max_seqs,
                          attention_backend="torch")
    link = link or NullStoreLink(engine_namespace(lm.spec, block_tokens))
    return LLMEngine(lm.model, config, link)


def pool_kv(eng: LLMEngine, tokens: list[int], n_blocks: int) -> torch.Tensor:
    """K and V of chain blocks ``[0, n_blocks)`` of ``tokens`` as the pool holds them, in
    the store's payload layout ``[blocks, layers, 2, BT, kv_heads, head_dim]``."""
    keys = chain_keys(eng.ns, tokens)[:n_blocks]
    blocks = eng.blocks.pool.longest_prefix(keys)
    assert len(blocks) == n_blocks
    cache = eng.cache.storage  # [layers, 2, num_blocks, BT, kv_heads, head_dim]
    return torch.stack([cache[:, :, b.block_id] for b in blocks])


def test_a_stalled_store_holds_no_pool_blocks(tiny: LoadedModel) -> None:
    """A pool of exactly one request: A's commit is held in the store, and B's waits in
    the committer's queue behind it. B's bytes were copied out when it finished, so C gets
    the whole pool at once; the store must then hold B's K/V (as a run of B alone computes
    it), not C's, and C's answer is the one it gets alone."""
    pa, pb, pc = ids(509, 1), ids(509, 2), ids(509, 3)  # 509 + 4 - 1 computed: 8 blocks
    inner = dram_store(64 << 20)
    store = WrappedStore(inner)
    store.commit_gate.clear()
    ns = engine_namespace(tiny.spec, BT)
    eng = tiny_engine(tiny, KVStoreLink(store, ns, "test"), pool_blocks=8, budget=512)
    try:
        (a,) = eng.generate([pa], PARAMS)
        (b,) = eng.generate([pb], PARAMS)
        c = eng.add_request(pc, PARAMS)
        for _ in range(50):
            if c.is_finished:
                break
            eng.step()
            eng.check_integrity()
        # All still in the store's way: two commits a request (its prompt's, its answer's).
        assert c.is_finished and eng.committer.unfinished == 6
        store.commit_gate.set()
        eng.drain(30)
        eng.check_integrity()
        assert eng.kv.num_free == eng.kv.num_blocks  # all free
    finally:
        store.commit_gate.set()  # a failed check above must not leave close() waiting
        eng.close()
        inner.close()
    tokens_b = pb + b.output_ids
    assert sorted(store.commits[2]) == list(range(7)) and sorted(store.commits[3]) == [7]
    commit_b = {**store.commits[2], **store.commits[3]}  # B's prompt, then its answer
    committed_b = torch.stack([
        torch.frombuffer(bytearray(commit_b[i]), dtype=torch.float32)
        for i in range(8)
    ])
    with tiny_engine(tiny, None, pool_blocks=16, budget=512) as alone:
        (b_alone,) = alone.generate([pb], PARAMS)
        (c_alone,) = alone.generate([pc], PARAMS)
        want_b = pool_kv(alone, tokens_b, 8).reshape(8, -1)
    assert b_alone.output_ids == b.output_ids  # same batch shapes: the same tokens
    torch.testing.assert_close(committed_b, want_b, rtol=1e-4, atol=1e-5)
    assert c.output_ids == c_alone.output_ids
    assert a.output_ids and c.stats.computed_tokens == len(pc)


@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lens=st.lists(st.integers(1, 120), min_size=2, max_size=5),
    shared=st.integers(0, 48),
    pool_blocks=st.integers(11, 24),
    budget=st.integers(8, 96),
    max_seqs=st.integers(1, 3),
    short=st.one_of(st.none(), st.integers(0, 2)),
    seed=st.integers(0, 1000),
)
def test_random_traffic_on_the_tiny_model_keeps_the_pool_whole(
    tiny: LoadedModel, lens: list[int], shared: int, pool_blocks: int, budget: int,
    max_seqs: int, short: int | None, seed: int,
) -> None:
    """16-token blocks so short prompts span many; the pool holds one request's worst case
    (48 + 120 + 4 tokens: 11 blocks) and little more, so requests preempt each other, loads
    come back short and commits hold blocks, all at once. Integrity holds at every step,
    every prompt token is a hit or computed, every logit is finite (a short load's rows
    that were not copied hold NaN: admitting one shows) and every reference is returned at
    the end."""
    bt = 16
    head = ids(shared, seed)
    prompts = [head + ids(n, seed + 1 + i) for i, n in enumerate(lens)]
    inner = dram_store(16 << 20)
    store = WrappedStore(inner)
    store.short_get = short
    ns = engine_namespace(tiny.spec, bt)
    try:
        for _ in range(2):  # the second engine starts with an empty pool: store hits
            with tiny_engine(tiny, KVStoreLink(store, ns, "test"), pool_blocks=pool_blocks,
                             budget=budget, block_tokens=bt, max_seqs=max_seqs) as eng:
                eng.runner.logits_observers.append(_finite)
                seqs = run_checked(eng, prompts, PARAMS, staggered=True)
                for p, s in zip(prompts, seqs, strict=True):
                    assert len(s.output_ids) == PARAMS.max_new_tokens
                    assert sum(s.stats.hit_tokens.values()) + s.stats.computed_tokens == len(p)
                assert eng.drain(30)
                eng.check_integrity()
                assert eng.kv.num_free == eng.kv.num_blocks  # all free
    finally:
        inner.close()


def _finite(seqs: object, logits: torch.Tensor) -> None:
    assert torch.isfinite(logits).all()


@pytest.fixture(autouse=True)
def _fail_on_store_errors(caplog: pytest.LogCaptureFixture):  # type: ignore[no-untyped-def]
    """A real store that never fails: any store warning here is a bug."""
    yield
    assert not [r for r in caplog.records if r.name == "engine.store"]
