"""Continuous batching, pool prefix hits and preemption, on the fake model (no store)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.sampling_params import SamplingParams
from engine.errors import ContextTooLong, EngineInputError, PoolTooSmall
from tests.engine.engine_harness import BT, GREEDY, fake_engine, run_checked
from tests.engine.fake_model import greedy_continuation


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 13 + i * 5) % 90 + 1 for i in range(n)]


def test_batched_outputs_follow_the_model() -> None:
    with fake_engine() as eng:
        prompts = [prompt(n, s) for s, n in enumerate([3, 17, 30, 8])]
        seqs = run_checked(eng, prompts)
        for p, s in zip(prompts, seqs, strict=True):
            assert s.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)
            assert s.stats.computed_tokens == len(p)
            assert s.finish_reason == "length"


def test_second_request_hits_the_shared_prefix_in_the_pool() -> None:
    with fake_engine() as eng:
        base = prompt(21)
        (first,) = run_checked(eng, [base])
        follow = base + first.output_ids + prompt(9, 7)
        (second,) = run_checked(eng, [follow])
        # The first sequence computed 21 + 5 tokens: 6 full blocks are cached.
        assert second.stats.hit_tokens == {"hbm": 6 * BT, "dram": 0, "ssd": 0}
        assert second.stats.computed_tokens == len(follow) - 6 * BT
        assert second.output_ids == greedy_continuation(follow, GREEDY.max_new_tokens)


def test_a_full_hit_still_computes_the_last_token() -> None:
    with fake_engine() as eng:
        p = prompt(4 * BT)
        run_checked(eng, [p])
        (again,) = run_checked(eng, [p])
        assert again.stats.hit_tokens["hbm"] == 3 * BT
        assert again.stats.computed_tokens == BT
        assert again.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)


def test_preemption_when_the_pool_runs_out() -> None:
    params = SamplingParams(max_new_tokens=12)
    with fake_engine(pool_blocks=12, budget=64) as eng:
        prompts = [prompt(24, s) for s in range(3)]  # 9 blocks each at the end, 12 in all
        seqs = run_checked(eng, prompts, params)
        # The count follows the scheduler's choice of victims (not modelled here): it agrees
        # with the sequences' own, and is not 0, as no two of them fit the pool together.
        preempted = eng.scheduler.counters["preemptions_total"]
        assert preempted == sum(s.stats.preemptions for s in seqs) > 0
        for p, s in zip(prompts, seqs, strict=True):
            assert s.output_ids == greedy_continuation(p, params.max_new_tokens)
            assert sum(s.stats.hit_tokens.values()) + s.stats.computed_tokens == len(p)


def test_eos_stops_a_request() -> None:
    p = prompt(5)
    stop = greedy_continuation(p, 3)[2]
    with fake_engine(eos=(stop,)) as eng:
        (s,) = run_checked(eng, [p])
        assert s.output_ids == greedy_continuation(p, 3) and s.finish_reason == "stop"


def test_bad_requests_are_refused_up_front() -> None:
    with fake_engine(pool_blocks=4, context=64) as eng:
        with pytest.raises(ContextTooLong):
            eng.add_request(prompt(65), GREEDY)
        with pytest.raises(PoolTooSmall):  # the prompt alone needs 5 blocks of 4
            eng.add_request(prompt(17), SamplingParams(max_new_tokens=1))
        with pytest.raises(EngineInputError):
            eng.add_request([], GREEDY)
        assert not eng.has_unfinished


def test_a_request_is_admitted_on_its_prompt_and_stops_where_the_pool_ends() -> None:
    """No ``max_tokens`` (the server asks for the rest of the context): admitted against
    what the prompt needs, not refused; alone, it grows until the whole pool holds it and
    then stops with ``length``."""
    endless = SamplingParams(max_new_tokens=4096 - 12)
    with fake_engine(pool_blocks=4, context=4096) as eng:
        (s,) = run_checked(eng, [prompt(12)], endless)
        # 16 tokens fill the pool; the 17th is sampled, never computed.
        assert s.finish_reason == "length" and s.num_tokens == 4 * BT + 1
        assert s.output_ids == greedy_continuation(prompt(12), 5)
        assert all(b.ref_cnt == 0 for b in eng.blocks.pool.blocks)


def test_long_requests_share_a_small_pool_by_preemption() -> None:
    endless = SamplingParams(max_new_tokens=1000)
    with fake_engine(pool_blocks=6, budget=64) as eng:
        prompts = [prompt(9, s) for s in range(3)]
        seqs = run_checked(eng, prompts, endless)
        for p, s in zip(prompts, seqs, strict=True):
            assert s.finish_reason == "length" and s.num_tokens == 6 * BT + 1
            assert s.output_ids == greedy_continuation(p, 6 * BT + 1 - len(p))
        assert eng.scheduler.counters["preemptions_total"] > 0
        assert all(b.ref_cnt == 0 for b in eng.blocks.pool.blocks)


def test_max_model_len_caps_the_context_below_the_model() -> None:
    with fake_engine(context=4096, max_model_len=32) as eng:
        assert eng.max_context_tokens == 32
        with pytest.raises(ContextTooLong):
            eng.add_request(prompt(33), GREEDY)
        (s,) = run_checked(eng, [prompt(20)], SamplingParams(max_new_tokens=100))
        assert s.finish_reason == "length" and s.num_tokens == 32
    with pytest.raises(EngineInputError, match=r"max_model_len 4097 .* 4096"):
        fake_engine(context=4096, max_model_len=4097)


@settings(max_examples=40)
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=7),
    shared=st.integers(0, 24),
    new=st.lists(st.integers(1, 10), min_size=7, max_size=7),
    pool_blocks=st.integers(19, 40),
    budget=st.integers(1, 48),
    max_seqs=st.integers(1, 5),
)
def test_random_admission_preemption_and_finishing_keep_the_pool_whole(
    lens: list[int], shared: int, new: list[int], pool_blocks: int, budget: int, max_seqs: int
) -> None:
    head = prompt(shared, 99)
    prompts = [head + prompt(n, i) for i, n in enumerate(lens)]
    with fake_engine(pool_blocks=pool_blocks, budget=budget, max_seqs=max_seqs) as eng:
        seqs = []
        for p, n in zip(prompts, new, strict=False):
            seqs.append(eng.add_request(p, SamplingParams(max_new_tokens=n)))
            eng.step()  # arrivals interleave with steps
            eng.check_integrity()
        while eng.has_unfinished:
            eng.step()
            eng.check_integrity()
        for p, n, s in zip(prompts, new, seqs, strict=False):
            assert s.output_ids == greedy_continuation(p, n)
            assert sum(s.stats.hit_tokens.values()) + s.stats.computed_tokens == len(p)
        assert all(b.ref_cnt == 0 for b in eng.blocks.pool.blocks)
