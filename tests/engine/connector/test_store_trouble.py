"""Store trouble found in review (issue #33): each costs misses or a resend, never an
engine error, a leak or a block written that its job does not hold. Real embedded stores,
misbehaving through ``WrappedStore``; the fake model's K/V are known bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.connector import committer as committer_module
from engine.core.sampling_params import SamplingParams
from kvstore.keys import chain_keys
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
BLOCK_BYTES = LAYERS * 2 * BT * 1 * 4 * 4  # the fake model's: 1 head of 4 float32


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(seed * 19 + i * 7) % 90 + 1 for i in range(n)]


def payload_k(raw: bytes) -> torch.Tensor:
    """K of every layer of one stored block, ``[layers, BT]`` (head 0, dim 0)."""
    rows = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).view(LAYERS, 2, BT, 1, 4)
    return rows[:, 0, :, 0, 0]


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
        # The prompt's 5 full blocks went when its prefill completed, the answer's at the end.
        assert [sorted(c) for c in store.commits[-2:]] == [list(range(5)), [5]]
        pool = eng.blocks.pool.longest_prefix(keys)
        assert len(pool) == 6
        assert not pool[1].stored_layers and not pool[2].stored_layers
        store.commit_drop = set()
        before = len(store.commits)
        run_checked(eng, [tokens + prompt(9, 3)])
        assert eng.drain(10)
        assert {1, 2} <= set().union(*store.commits[before:])
        eng.check_integrity()


def test_every_failed_load_is_a_miss_and_none_is_lost(store: WrappedStore) -> None:
    """Two loads fail in the same step with an error the link does not expect: each
    request recomputes; none is stuck loading, no block is leaked, nothing is raised."""
    prompts = [prompt(30, 1), prompt(30, 2)]
    with fake_engine(store) as first:
        run_checked(first, prompts)
    store.get_gate.clear()  # both loads are in flight before either fails
    store.get_error = RuntimeError("test: a client bug")
    with fake_engine(store) as eng:
        seqs = [eng.add_request(p, GREEDY) for p in prompts]
        eng.step()
        assert len(eng.scheduler.loading) == 2
        store.get_gate.set()
        assert eng.loader.wait_idle(10)
        for _ in range(200):
            if all(s.is_finished for s in seqs):
                break
            eng.step()
            eng.check_integrity()
        for p, s in zip(prompts, seqs, strict=True):
            assert s.is_finished and s.stats.computed_tokens == len(p)
            assert s.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)
        assert eng.scheduler.counters["load_errors_total"] == 2
        eng.drain(10)
        eng.check_integrity()
        assert eng.kv.num_free == eng.kv.num_blocks  # all free


def test_every_failed_commit_is_counted_and_none_is_raised(store: WrappedStore) -> None:
    store.commit_error = RuntimeError("test: a client bug")
    with fake_engine(store) as eng:
        prompts = [prompt(22, 1), prompt(22, 2)]
        seqs = run_checked(eng, prompts)
        assert eng.drain(10)
        # Two commits a request: its prompt's (at its first token), its answer's (at its end).
        assert eng.scheduler.counters["commit_errors_total"] == 4
        for p, s in zip(prompts, seqs, strict=True):
            assert s.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)
        store.commit_error = None
        run_checked(eng, [prompt(22, 3)])  # the committer is still there
        assert eng.drain(10) and store.commits
        eng.check_integrity()


def test_a_commit_that_cannot_be_submitted_leaks_nothing(
    store: WrappedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(job: object) -> None:
        raise RuntimeError("test: the committer refuses")

    with fake_engine(store) as eng:
        monkeypatch.setattr(eng.committer, "submit", refuse)
        p = prompt(22)
        (a,) = run_checked(eng, [p])
        assert a.output_ids == greedy_continuation(p, GREEDY.max_new_tokens)
        # The prompt's commit failed at the first token; the end tried the whole chain again.
        assert eng.scheduler.counters["commit_errors_total"] == 2
        eng.check_integrity()
        assert eng.kv.num_free == eng.kv.num_blocks  # all free


def test_a_copy_out_that_fails_leaks_no_staging(
    store: WrappedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("test: the copy kernel fails")

    with fake_engine(store) as eng:
        monkeypatch.setattr(committer_module.kernels, "read_kv_blocks", broken)
        (a,) = run_checked(eng, [prompt(22)])
        assert a.finish_reason == "length"
        assert eng.scheduler.counters["commit_errors_total"] == 2  # the prompt's, the end's
        assert eng.committer.staging.num_jobs == 0
        assert eng.kv.num_free == eng.kv.num_blocks  # all free


def test_a_given_up_sliding_load_holds_the_pool_blocks_it_writes(store: WrappedStore) -> None:
    """Exact mode, hybrid model: a load that copies the sliding layers into the pool's own
    hit blocks holds them until the loader is done, so that after a deadline give-up (or
    an abort) they are never another request's while it may still write into them."""
    hybrid = {"windows": (2 * BT, None), "cache_all_layers": True}
    p = prompt(40)
    with fake_engine(store, **hybrid) as first:  # the store gets both namespaces
        run_checked(first, [p])
    with fake_engine(store, load_timeout_s=0.5, **hybrid) as eng:
        run_checked(eng, [p])  # loads it: the pool's early blocks lack the sliding layers
        keys = chain_keys(eng.ns, p[: 5 * BT])
        lacking = [b for b in eng.blocks.pool.longest_prefix(keys)
                   if not eng.planner.has_sliding(b)][3:5]  # the window of a 5-block hit
        assert len(lacking) == 2
        store.get_gate.clear()  # its sliding load stalls in get_into
        try:
            (b,) = run_checked(eng, [p[: 5 * BT] + prompt(10, 4)])
            assert b.stats.load_gave_up == 1 and eng.loader.unfinished == 1
            assert [blk.ref_cnt for blk in lacking] == [1, 1]  # the job's own references
        finally:
            store.get_gate.set()
        assert eng.loader.wait_idle(10)
        eng.step()
        eng.drain(10)
        eng.check_integrity()
        assert eng.kv.num_free == eng.kv.num_blocks  # all free


def test_a_stalled_store_never_holds_pool_blocks(store: WrappedStore) -> None:
    """A pool of one sequence and a store whose commits hang: A's commit is stuck in the
    store and B's waits behind it, yet C gets the whole pool at once (B's bytes were
    copied out at its finish); the store then gets B's bytes, not C's."""
    params = SamplingParams(max_new_tokens=4)
    pa, pb, pc = prompt(29, 1), prompt(29, 2), prompt(29, 3)  # 8 blocks each at the end
    store.commit_gate.clear()
    eng = fake_engine(store, pool_blocks=8, budget=64)
    try:
        run_checked(eng, [pa], params)
        (b,) = run_checked(eng, [pb], params)
        c = eng.add_request(pc, params)
        for _ in range(50):
            if c.is_finished:
                break
            eng.step()
            eng.check_integrity()
        # Two commits a request (its prompt's at its first token, its answer's at its end).
        assert c.is_finished and eng.committer.unfinished == 6
        store.commit_gate.set()
        assert eng.drain(10)
    finally:
        store.commit_gate.set()  # a failed check above must not leave close() waiting
        eng.close()
    assert c.output_ids == greedy_continuation(pc, params.max_new_tokens)
    tokens_b = pb + b.output_ids
    commit_b = {**store.commits[2], **store.commits[3]}  # B's prompt, then its answer
    assert sorted(store.commits[2]) == list(range(7)) and sorted(store.commits[3]) == [7]
    for i, raw in commit_b.items():
        assert torch.equal(payload_k(raw), expected_block(tokens_b, i, BT, LAYERS))


def test_commits_past_the_staging_bound_are_cut_and_counted(store: WrappedStore) -> None:
    """Staging for 10 blocks and a store that hangs: the first request's two commits (its
    prompt's 5 blocks, its answer's 1) wait in the store, the second's prompt gets the 4
    rows left (its chain's head), its end none (blocks 4 and 5 left out), the third none
    at all (5, then all 6 at its end); the engine never waits, the blocks left out are
    counted, and what was staged arrives."""
    params = SamplingParams(max_new_tokens=4)
    prompts = [prompt(21, s) for s in range(3)]  # 21 + 4 tokens: 6 full blocks each
    store.commit_gate.clear()
    eng = fake_engine(store, commit_staging_bytes=10 * BLOCK_BYTES)
    try:
        for p in prompts:
            (s,) = run_checked(eng, [p], params)
            assert s.output_ids == greedy_continuation(p, params.max_new_tokens)
        assert eng.link.counters()["commit_unsent_blocks_total"] == 1 + 2 + 5 + 6
        store.commit_gate.set()
        assert eng.drain(10)
        eng.check_integrity()
        assert eng.kv.num_free == eng.kv.num_blocks  # all free
    finally:
        store.commit_gate.set()
        eng.close()
    assert [sorted(c) for c in store.commits] == [list(range(5)), [5], list(range(4)), [], [],
                                                  []]


@settings(max_examples=15, deadline=None)
@given(
    lens=st.lists(st.integers(1, 40), min_size=2, max_size=5),
    shared=st.integers(0, 24),
    pool_blocks=st.integers(19, 32),
    budget=st.integers(1, 48),
    aborts=st.lists(st.integers(0, 30), min_size=5, max_size=5),
    staging_blocks=st.integers(0, 12),
)
def test_random_hybrid_traffic_with_aborts_keeps_everything_whole(
    lens: list[int], shared: int, pool_blocks: int, budget: int, aborts: list[int],
    staging_blocks: int,
) -> None:
    """Exact mode on a hybrid model (sliding rows loaded into pool hit blocks), aborts at
    random steps, commits cut by a small staging: integrity at every step, every
    reference back at the end, and the requests left alone answer as the model does."""
    head = prompt(shared, 99)
    prompts = [head + prompt(n, i) for i, n in enumerate(lens)]
    inner = dram_store()
    store = WrappedStore(inner)
    params = SamplingParams(max_new_tokens=6)
    try:
        for _ in range(2):  # the second engine's pool starts empty: store hits
            with fake_engine(store, pool_blocks=pool_blocks, budget=budget, max_seqs=3,
                             windows=(2 * BT, None), cache_all_layers=True,
                             commit_staging_bytes=staging_blocks * BLOCK_BYTES) as eng:
                seqs = [eng.add_request(p, params) for p in prompts]
                step = 0
                while eng.has_unfinished:
                    for s, at in zip(seqs, aborts, strict=False):
                        if at == step:
                            eng.abort(s)
                    eng.step()
                    eng.check_integrity()
                    step += 1
                    assert step < 5000
                for p, s in zip(prompts, seqs, strict=True):
                    if s.finish_reason != "abort":
                        assert s.output_ids == greedy_continuation(p, params.max_new_tokens)
                # An aborted load's blocks go once the loader reports it (drain polls).
                assert eng.loader.wait_idle(10)
                eng.drain(10)
                eng.check_integrity()
                assert eng.kv.num_free == eng.kv.num_blocks  # all free
    finally:
        inner.close()
