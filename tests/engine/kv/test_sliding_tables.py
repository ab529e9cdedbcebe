"""The hybrid pool's sliding groups (``engine.kv.sliding_tables``) through real engines
over the fake model with Gemma 3 270M's layer pattern: the tokens a pool holds at equal
bytes, the pages a request keeps for its window, and the accounting of every page across
finish, preemption and abort."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.connector.store_link import NullStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.errors import EngineInputError
from engine.kv.namespace import engine_namespace
from tests.engine.engine_harness import run_checked
from tests.engine.fake_model import FakeModel, fake_spec
from tests.engine.kv.test_kv_groups import GEMMA3_270M

WINDOW = 512
CHUNK = 256
BT = 16


def _pool(hybrid: bool, pool_blocks: int = 256, max_seqs: int = 8) -> LLMEngine:
    """An exact-mode engine over the fake model with Gemma 3 270M's 18 layers (every sixth
    full, the rest sliding over 512 tokens); ``pool_blocks`` whole blocks' worth of bytes."""
    model = FakeModel(fake_spec(layers=18, context=1 << 16, windows=GEMMA3_270M))
    cfg = EngineConfig(pool_tokens=pool_blocks * BT, block_tokens=BT, max_batched_tokens=CHUNK,
                       max_num_seqs=max_seqs, attention_backend="torch",
                       cache_all_layers=True, hybrid_pool=hybrid)
    ns = engine_namespace(model.spec, BT, "", cfg.replay_policy(model.spec.layer_windows))
    return LLMEngine(model, cfg, NullStoreLink(ns))


def test_at_equal_bytes_the_hybrid_pool_holds_four_times_the_tokens() -> None:
    """Today's pool of 256 blocks (4,096 tokens, every layer) refuses a 16,384-token prompt;
    the same bytes as 3-layer pages run it whole, keeping the sliding groups to the window
    and a chunk, and still hold its blocks once it finished."""
    prompt = [(7 * i) % 90 + 1 for i in range(4 * 256 * BT)]
    with _pool(hybrid=False) as today:
        today_elems = today.cache.storage.numel()
        assert today_elems == 256 * BT * 18 * 2 * 4  # K and V, 1 KV head of 4
        with pytest.raises(EngineInputError, match="pool"):
            today.add_request(prompt, SamplingParams(max_new_tokens=1))
    with _pool(hybrid=True) as eng:
        assert eng.cache.storage.numel() == today_elems  # the same bytes
        assert eng.kv.num_blocks + 1 == 256 * 6  # pages; one is the null page
        seq = eng.add_request(prompt, SamplingParams(max_new_tokens=1))
        most = 0
        while not seq.is_finished:
            eng.step()
            eng.check_integrity()
            if eng.kv.holds(seq):
                held = eng.kv.sliding.held(seq.seq_id)
                most = max(most, len(held))
                assert len(eng.kv.table(seq)) * BT >= seq.num_computed_tokens
        assert seq.stats.preemptions == 0 and seq.stats.computed_tokens == len(prompt)
        # Window (512 tokens) and one chunk (256) of 16-token blocks, and the block the
        # window's edge falls in: what the sliding groups ever held.
        assert most <= (WINDOW + CHUNK) // BT + 1
        cached = eng.blocks.pool.num_cached
        assert cached * BT >= 4 * 256 * BT  # >= 4x today's 4,096 tokens, all indexed
        eng.check_integrity()


def test_a_pool_hit_reuses_the_last_windows_companions_and_recomputes_nothing() -> None:
    prompt = [(5 * i) % 90 + 1 for i in range(3 * WINDOW + 5)]
    with _pool(hybrid=True) as eng:
        (a,) = run_checked(eng, [prompt], SamplingParams(max_new_tokens=2))
        (b,) = run_checked(eng, [prompt], SamplingParams(max_new_tokens=2))
        assert b.stats.hit_tokens["hbm"] == (len(prompt) - 1) // BT * BT
        assert b.stats.computed_tokens < BT + 1
        assert b.output_ids == a.output_ids


@settings(max_examples=25, deadline=None)
@given(lens=st.lists(st.integers(1, 1400), min_size=1, max_size=5),
       shared=st.integers(0, 900), pool_blocks=st.integers(120, 260),
       aborts=st.lists(st.integers(0, 30), max_size=3))
def test_every_page_comes_back_after_finish_preemption_and_abort(
        lens: list[int], shared: int, pool_blocks: int, aborts: list[int]) -> None:
    """Random prompts sharing a prefix, on pools small enough to preempt, some aborted
    mid-way: integrity after every step, and once all is over every page is free again
    (cached companions nobody holds count as free: they are evicted on demand)."""
    head = [(3 * i) % 80 + 1 for i in range(shared)]
    prompts = [head + [(11 * i + n) % 80 + 1 for i in range(n)] for n in lens]
    with _pool(hybrid=True, pool_blocks=pool_blocks, max_seqs=4) as eng:
        seqs = [eng.add_request(p, SamplingParams(max_new_tokens=3)) for p in prompts]
        step = 0
        while any(not s.is_finished for s in seqs):
            eng.step()
            step += 1
            for i, when in enumerate(aborts):
                if when == step and i < len(seqs) and not seqs[i].is_finished:
                    eng.abort(seqs[i])
            eng.check_integrity()
            assert step < 10_000
        eng.check_integrity()
        assert eng.kv.num_free == eng.kv.num_blocks
        eng.kv.sliding.drop_idle()
        eng.check_integrity()
        assert eng.blocks.num_free == eng.kv.num_blocks  # only the null page is held
