"""Eviction policies: the contract every policy keeps, and LRU against a reference model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.errors import InvalidArgument
from kvstore.eviction import POLICIES, LRUPolicy, make_policy

accesses = st.lists(st.integers(0, 30), max_size=300)


@pytest.mark.parametrize("name", sorted(POLICIES))
@given(seq=accesses, cap=st.integers(0, 12))
def test_contract(name: str, seq: list[int], cap: int) -> None:
    p = make_policy(name, cap)
    held: set[int] = set()
    for k in seq:
        evicted = p.access(k)
        held.add(k)
        held -= set(evicted)
        assert set(p) == held
        assert len(p) <= cap
        p.check_integrity()
    victim = p.peek_victim()
    if victim is not None:
        assert p.pop_victim() == victim
        assert victim not in p


@given(seq=accesses, cap=st.integers(1, 12))
def test_lru_matches_reference(seq: list[int], cap: int) -> None:
    p, ref = LRUPolicy(cap), []
    for k in seq:
        if k in ref:
            ref.remove(k)
        ref.append(k)
        expect = ref[:-cap] if len(ref) > cap else []
        ref = ref[-cap:]
        assert p.access(k) == expect
    assert list(p) == ref


@given(seq=accesses, cap=st.integers(0, 12))
def test_access_many_equals_access(seq: list[int], cap: int) -> None:
    a, b = LRUPolicy(cap), LRUPolicy(cap)
    ev = [e for k in seq for e in a.access(k)]
    assert b.access_many(seq) == ev
    assert list(a) == list(b)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_touch_never_admits_and_remove_is_not_eviction(name: str) -> None:
    p = make_policy(name, 4)
    assert p.touch("x") is False and "x" not in p
    p.access("x")
    assert p.touch("x") is True
    assert p.remove("x") is True and p.remove("x") is False
    assert len(p) == 0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_resize_evicts_to_fit(name: str) -> None:
    p = make_policy(name, 10)
    for k in range(10):
        p.access(k)
    assert len(p.resize(4)) == 6 and len(p) == 4
    p.resize(math.inf)
    for k in range(100, 200):
        assert p.access(k) == []


def test_s3fifo_keeps_reused_keys_over_one_hit_wonders() -> None:
    p = make_policy("s3fifo", 10)
    for k in range(5):
        p.access(k)
        p.access(k)  # reused
    for k in range(100, 140):  # a scan of one-hit wonders
        p.access(k)
    assert all(k in p for k in range(5))


def test_unknown_policy_and_bad_capacity() -> None:
    with pytest.raises(InvalidArgument, match="unknown eviction policy"):
        make_policy("fifo9", 1)
    with pytest.raises(InvalidArgument):
        LRUPolicy(-1)
    with pytest.raises(InvalidArgument):
        LRUPolicy(1.5)
