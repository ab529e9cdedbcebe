"""Property tests of the replay plan over random layer layouts, windows, block sizes,
prompt and hit lengths: every position a query can see has KV in every layer, the full
layers never recompute what the cache holds, and the replay's size is bounded by keep."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_replay import (
    PlanInputError,
    ReplayPlan,
    ReplayPolicy,
    longest_exact_hit,
    plan_replay,
    resolve_policy,
    window_is_cached,
)
from tests.bounded_replay.strategies import Case, cases, hybrid_windows

HYBRID = [128, None] * 4


def make(case: Case, window_cached: bool | None = None) -> ReplayPlan:
    cached = (not case.policy.is_bounded) if window_cached is None else window_cached
    return plan_replay(case.policy, case.prompt_tokens, case.hit_blocks, case.block_tokens,
                       window_cached=cached)


def positions(plan: ReplayPlan, layer: int, kind: str) -> list[tuple[int, int]]:
    ranges = plan.loads if kind == "load" else plan.writes
    return [(r.start_tokens, r.end_tokens) for r in ranges if layer in r.layers]


def covered(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """[lo, hi) lies inside the union of ``spans``."""
    at = lo
    for a, b in sorted(spans):
        if a > at:
            break
        at = max(at, b)
    return at >= hi


def check_plan(policy: ReplayPolicy, plan: ReplayPlan) -> None:
    L, B, hit = plan.prompt_tokens, plan.block_tokens, plan.hit_tokens
    s = plan.replay_start_tokens
    assert 0 <= s <= hit < L
    assert plan.computed_tokens == L - s == plan.replayed_tokens + plan.new_tokens
    stored = {layer for g in policy.stored_layer_groups for layer in g}
    for r in plan.loads:  # whole blocks of the hit, and only layers the store keeps
        assert r.start_tokens % B == 0 and r.end_tokens % B == 0
        assert 0 <= r.start_tokens < r.end_tokens <= hit
        assert set(r.layers) <= stored or not policy.is_bounded
    for r in plan.writes:  # the model's input is [s, L): nothing is written outside it
        assert s <= r.start_tokens and r.end_tokens == L
    for layer, w in enumerate(policy.layout.layer_windows):
        loads, writes = positions(plan, layer, "load"), positions(plan, layer, "write")
        if w is None:
            # Full attention: the cache's KV below h·B, computed from h·B; never both.
            assert covered(loads, 0, hit) and writes == [(hit, L)]
            assert all(b <= hit for _, b in loads)
            continue
        ks = plan.sliding_kv_start_tokens
        assert covered(loads + writes, ks, L), "a position after kv_start has no KV"
        assert all(a >= ks for a, _ in writes)
        if not plan.is_replay:
            # Nothing masked that a cold prefill's first new token would see.
            assert ks <= max(0, hit - w + 1)


@given(cases())
def test_every_visible_position_has_kv(case: Case) -> None:
    check_plan(case.policy, make(case))


@given(cases(hybrid_windows))
def test_bounded_replay_computes_keep_plus_new_tokens(case: Case) -> None:
    if not case.policy.is_bounded:
        return
    plan = make(case, window_cached=False)
    check_plan(case.policy, plan)
    hit, new = case.hit_blocks * case.block_tokens, case.prompt_tokens - plan.hit_tokens
    assert plan.computed_tokens == min(case.policy.keep_tokens, hit) + new
    assert plan.replayed_tokens == min(case.policy.keep_tokens, hit)
    assert plan.sliding_kv_start_tokens == plan.replay_start_tokens
    if case.policy.keep_tokens >= hit:
        assert plan.replay_start_tokens == 0  # the whole hit replayed: a cold prefill
    # The replay writes into these hit blocks, and no more than keep allows.
    touched = range(plan.replay_start_tokens // case.block_tokens, case.hit_blocks)
    assert plan.replay_blocks == (touched if plan.is_replay else range(case.hit_blocks,
                                                                        case.hit_blocks))
    assert len(plan.replay_blocks) <= case.policy.max_replay_blocks(case.block_tokens)


@given(cases())
def test_exact_mode_is_the_same_plan_with_an_empty_replay(case: Case) -> None:
    exact = resolve_policy(case.policy.layout.layer_windows, cache_all_layers=True)
    plan = plan_replay(exact, case.prompt_tokens, case.hit_blocks, case.block_tokens,
                       window_cached=True)
    check_plan(exact, plan)
    assert plan.replayed_tokens == 0 and not plan.replay_blocks
    assert plan.computed_tokens == case.prompt_tokens - case.hit_blocks * case.block_tokens
    if case.policy.is_bounded:  # a bounded hit whose window the pool holds: no replay
        cached = make(case, window_cached=True)
        assert cached.loads == plan.loads and cached.writes == plan.writes
        assert cached.sliding_kv_start_tokens == plan.sliding_kv_start_tokens


@given(cases(hybrid_windows))
def test_exact_mode_loads_sliding_kv_only_for_the_last_window(case: Case) -> None:
    exact = resolve_policy(case.policy.layout.layer_windows, cache_all_layers=True)
    plan = plan_replay(exact, case.prompt_tokens, case.hit_blocks, case.block_tokens,
                       window_cached=True)
    sliding = [r for r in plan.loads if set(r.layers) == set(exact.layout.sliding_layers)]
    span = sum(r.num_tokens for r in sliding)
    # At most the window plus one partial block on each side.
    assert span <= exact.layout.max_window_tokens - 1 + 2 * case.block_tokens
    with pytest.raises(PlanInputError):
        if case.hit_blocks:
            plan_replay(exact, case.prompt_tokens, case.hit_blocks, case.block_tokens)
        else:
            raise PlanInputError("no hit: nothing to refuse")


@given(cases(hybrid_windows), st.data())
def test_longest_exact_hit_is_the_longest_with_a_cached_window(case: Case,
                                                              data: st.DataObject) -> None:
    exact = resolve_policy(case.policy.layout.layer_windows, cache_all_layers=True)
    h, B = case.hit_blocks, case.block_tokens
    has = data.draw(st.lists(st.booleans(), min_size=h, max_size=h))
    got = longest_exact_hit(exact, h, B, has)
    assert window_is_cached(exact, got, B, has)
    lay = exact.layout
    for longer in range(got + 1, h + 1):  # brute force: every longer hit lacks a block
        w0 = lay.window_first_block(longer, B)
        assert not all(has[i] for i in range(w0, longer))
    plan_replay(exact, case.prompt_tokens, got, B, window_cached=True)


def test_the_hybrid_preset_at_64k() -> None:
    p = resolve_policy(HYBRID, 140)
    plan = plan_replay(p, 65536 + 1024, 1024, 64)
    assert plan.replay_start_tokens == 65536 - 140
    assert plan.computed_tokens == 140 + 1024 and plan.replayed_tokens == 140
    assert plan.replay_blocks == range(1021, 1024)
    assert [(r.layers, r.start_tokens, r.end_tokens) for r in plan.writes] == [
        ((1, 3, 5, 7), 65536, 66560), ((0, 2, 4, 6), 65396, 66560)]


@pytest.mark.parametrize(("length", "hit"), [(0, 0), (64, 1), (100, 2), (10, -1)])
def test_hits_that_leave_nothing_to_compute_are_refused(length: int, hit: int) -> None:
    with pytest.raises(PlanInputError):
        plan_replay(resolve_policy(HYBRID, 140), length, hit, 64)
