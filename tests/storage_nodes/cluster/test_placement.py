"""Rendezvous placement: determinism, balance, and how little moves on a membership
change (the issue asks for a measurement: adding a node moves ~1/N of the copies)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage_nodes.cluster.errors import ClusterConfigError
from storage_nodes.cluster.placement import Rendezvous, balanced_capacity_blocks

_RNG = random.Random(1)
KEYS = [_RNG.randbytes(16) for _ in range(20_000)]
members_st = st.lists(
    st.integers(1024, 65535).map(lambda p: f"10.0.0.{p % 250}:{p}"),
    min_size=1,
    max_size=12,
    unique=True,
)


def names(p: Rendezvous, key: bytes, r: int) -> list[str]:
    return [p.members[i] for i in p.top(key, r)]


@given(members=members_st, key=st.binary(min_size=16, max_size=16), seed=st.integers(0, 1000))
def test_ranking_is_a_deterministic_permutation_independent_of_member_order(
    members: list[str], key: bytes, seed: int
) -> None:
    p = Rendezvous(members)
    ranking = p.ranking(key)
    assert sorted(ranking) == list(range(len(members)))
    shuffled = members[:]
    random.Random(seed).shuffle(shuffled)
    q = Rendezvous(shuffled)
    assert [q.members[i] for i in q.ranking(key)] == [p.members[i] for i in ranking]
    p.check_integrity()


@given(
    members=members_st.filter(lambda m: len(m) >= 2),
    key=st.binary(min_size=16, max_size=16),
    r=st.integers(1, 3),
)
def test_adding_a_node_changes_at_most_one_replica_per_key(
    members: list[str], key: bytes, r: int
) -> None:
    old, new_member = members[:-1], members[-1]
    r = min(r, len(old))
    before = names(Rendezvous(old), key, r)
    after = names(Rendezvous(members), key, r)
    if new_member in after:
        assert len(set(before) - set(after)) == 1  # the new node displaced exactly one
    else:
        assert after == before


@pytest.mark.parametrize(("n", "r"), [(3, 2), (4, 2), (8, 2), (5, 3)])
def test_adding_a_node_moves_about_one_nth_of_the_copies(n: int, r: int) -> None:
    old = Rendezvous([f"127.0.0.1:{7000 + i}" for i in range(n)])
    new = Rendezvous([f"127.0.0.1:{7000 + i}" for i in range(n + 1)])
    moved = sum(len(set(names(new, k, r)) - set(names(old, k, r))) for k in KEYS)
    fraction = moved / (r * len(KEYS))
    # The new node should take its fair share of copies, 1/(N+1), and nothing else moves.
    assert abs(fraction - 1 / (n + 1)) < 0.02, fraction


def test_removing_a_node_moves_only_its_keys() -> None:
    members = [f"127.0.0.1:{7000 + i}" for i in range(5)]
    full, less = Rendezvous(members), Rendezvous(members[:2] + members[3:])
    for k in KEYS[:5000]:
        before, after = names(full, k, 2), names(less, k, 2)
        if members[2] not in before:
            assert before == after


@pytest.mark.parametrize(("n", "r"), [(3, 2), (6, 2), (4, 1)])
def test_load_is_balanced(n: int, r: int) -> None:
    p = Rendezvous([f"node-{i}:1" for i in range(n)])
    counts = [0] * n
    for k in KEYS:
        for i in p.top(k, r):
            counts[i] += 1
    expected = len(KEYS) * r / n
    assert max(abs(c - expected) for c in counts) < 0.05 * expected, counts


def test_bad_membership_is_refused() -> None:
    with pytest.raises(ClusterConfigError):
        Rendezvous([])
    with pytest.raises(ClusterConfigError):
        Rendezvous(["a:1", "a:1"])


@given(caps=st.lists(st.integers(0, 10_000), min_size=1, max_size=8), r=st.integers(1, 8))
def test_balanced_capacity_is_conservative(caps: list[int], r: int) -> None:
    b = balanced_capacity_blocks(caps, r)
    assert 0 <= b <= sum(caps) // min(r, len(caps))
    if r >= len(caps):  # every node holds every block: the smallest node is the limit
        assert b == min(caps)


def test_balanced_capacity_lets_the_fullest_node_fit() -> None:
    # Fill 3 nodes (R=2) with the reported capacity: at 3 standard deviations each node
    # overflows in ~0.13 % of placements, so over 200 seeded placements (600 node
    # fills) expect about one overflow, and far fewer than with the raw Σ/R.
    p = Rendezvous(["a:1", "b:1", "c:1"])
    rng = random.Random(5)

    def overflows(blocks: int) -> int:
        bad = 0
        for _ in range(200):
            counts = [0, 0, 0]
            for _ in range(blocks):
                for i in p.top(rng.randbytes(16), 2):
                    counts[i] += 1
            bad += max(counts) > 256
        return bad

    assert overflows(balanced_capacity_blocks([256, 256, 256], 2)) <= 5
    assert overflows(3 * 256 // 2) >= 100  # the raw capacity overflows most of the time
