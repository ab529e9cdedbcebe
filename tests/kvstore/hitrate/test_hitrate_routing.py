"""Each routing policy's defining behaviour on tiny hand-made requests (``routing.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.request import Request
from kvstore.hitrate.routing import (
    ROUTINGS,
    CacheAware,
    ConsistentHash,
    KvAware,
    RoundRobin,
    Sticky,
    make_router,
    parse_routings,
    session_key,
)

NOBODY: list[frozenset[int]] = [frozenset(), frozenset(), frozenset()]


def req(keys: list[int], session: str | None = None) -> Request:
    return Request(0.0, len(keys) * 4, keys, 4, session)


def test_round_robin_alternates() -> None:
    r = RoundRobin(3)
    assert [r.route(req([1]), NOBODY) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert r.loads == [3, 2, 2]


def test_sticky_keeps_a_session_on_its_first_replica() -> None:
    r = Sticky(3)
    # New sessions go to the least loaded replica (ties: lowest index) …
    assert r.route(req([1], "a"), NOBODY) == 0
    assert r.route(req([2], "b"), NOBODY) == 1
    # … and stay there whatever the load.
    assert [r.route(req([1, 2], "a"), NOBODY) for _ in range(4)] == [0] * 4
    assert r.route(req([3], "c"), NOBODY) == 2
    assert r.route(req([4], "d"), NOBODY) == 1  # loads 5, 1, 1: the lowest index of the least
    assert r.route(req([9], "b"), NOBODY) == 1


def test_sticky_without_a_session_keys_on_the_first_block() -> None:
    r = Sticky(2)
    assert r.route(req([7, 1]), NOBODY) == 0
    assert r.route(req([8]), NOBODY) == 1
    assert r.route(req([7, 2, 3]), NOBODY) == 0  # same first block: same "session"


def test_cache_aware_goes_where_the_prefix_is() -> None:
    r = CacheAware(3)
    hbm = [frozenset({1}), frozenset({1, 2, 3}), frozenset({2, 3, 4})]
    assert r.route(req([1, 2, 3, 9]), hbm) == 1  # longest prefix: 3 blocks on replica 1
    assert r.route(req([1, 5]), hbm) == 0  # 1 block on 0 and 1; 0 is less loaded
    # Replica 2 holds 2, 3, 4 but not the first block: a prefix of 0, like nobody.
    assert r.route(req([5, 2, 3]), hbm) == 2  # no prefix anywhere: least loaded (2)


def test_cache_aware_ignores_a_short_shared_prefix() -> None:
    """A first block every request shares (a system prompt) is not worth following: a match
    of at most 30 % of the request's blocks goes to the least loaded replica."""
    r = CacheAware(2)
    hbm = [frozenset({0}), frozenset({0, 1, 2, 3})]
    assert r.route(req([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]), hbm) == 1  # 4 of 10 on 1: followed
    assert r.route(req([0, 5, 6, 7]), hbm) == 0  # 1 of 4 everywhere: least loaded
    # 3 of 10 on replica 1 is not above 30 %: the least loaded (1, 1: the lowest index).
    assert r.route(req([0, 1, 2, 8, 9, 10, 11, 12, 13, 14]), hbm) == 0


def test_cache_aware_ties_go_to_the_least_loaded() -> None:
    r = CacheAware(2)
    assert [r.route(req([1]), NOBODY[:2]) for _ in range(4)] == [0, 1, 0, 1]


def test_kv_aware_follows_any_prefix_and_ties_go_to_the_last() -> None:
    """vllm-router's kv_aware: the longest pool prefix of any length (no threshold, unlike
    cache_aware), equal best scores to the highest index, nothing anywhere to the least
    loaded (lowest index first)."""
    r = KvAware(3)
    hbm = [frozenset({0}), frozenset({0, 1, 2, 3}), frozenset({0, 1})]
    # 1 block of 10 on every replica: cache_aware goes least loaded, kv_aware follows (the
    # last of the equal best).
    assert r.route(req([0, 5, 6, 7, 8, 9, 10, 11, 12, 13]), hbm) == 2
    assert r.route(req([0, 1, 2, 9]), hbm) == 1  # 3 blocks on replica 1
    assert r.route(req([0, 1, 7]), hbm) == 2  # 2 on replicas 1 and 2: the last
    assert r.route(req([5, 0, 1]), hbm) == 0  # no prefix anywhere: least loaded (0)
    assert r.route(req([]), hbm) == 0  # no full block: least loaded (loads 1, 1, 2)
    assert r.loads == [2, 1, 2]
    assert CacheAware(3).route(req([0, 5, 6, 7, 8, 9, 10, 11, 12, 13]), hbm) == 0


@given(pools=st.lists(st.frozensets(st.integers(0, 6), max_size=6), min_size=1, max_size=4),
       keys=st.lists(st.integers(0, 6), max_size=6),
       loads=st.lists(st.integers(0, 3), min_size=4, max_size=4))
def test_kv_aware_picks_a_longest_prefix_else_the_least_loaded(
        pools: list[frozenset[int]], keys: list[int], loads: list[int]) -> None:
    r = KvAware(len(pools))
    r.loads = loads[: len(pools)]
    before = list(r.loads)

    def prefix(held: frozenset[int]) -> int:
        n = 0
        while n < len(keys) and keys[n] in held:
            n += 1
        return n

    got = r.route(req(keys), pools)
    scores = [prefix(p) for p in pools]
    if max(scores) == 0:
        assert got == before.index(min(before))
    else:
        assert scores[got] == max(scores)
        assert all(s < max(scores) for s in scores[got + 1 :])  # the last of the best
    assert r.loads[got] == before[got] + 1 and sum(r.loads) == sum(before) + 1


def test_consistent_hash_is_stable_and_by_session() -> None:
    a, b = ConsistentHash(4), ConsistentHash(4)
    sessions = [f"trace_{i:04}.json" for i in range(40)]
    first = [a.route(req([i], s), NOBODY) for i, s in enumerate(sessions)]
    assert [b.route(req([99], s), NOBODY) for s in sessions] == first  # keys do not matter
    assert len(set(first)) == 4  # 40 sessions spread over every replica
    # Without a session, the first block decides.
    assert a.route(req([5, 6]), NOBODY) == a.route(req([5, 7, 8]), NOBODY)


def test_consistent_hash_is_stable_across_processes() -> None:
    """Python's str hash is salted per process; the ring must not be."""
    code = (
        "from kvstore.hitrate.routing import ConsistentHash; from kvstore.hitrate.request import"
        " Request; r = ConsistentHash(5); print([r.route(Request(0, 4, [i], 4, f's{i}'), [])"
        " for i in range(30)])"
    )
    runs = {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout
        for _ in range(2)
    }
    here = ConsistentHash(5)
    assert runs == {str([here.route(req([i], f"s{i}"), []) for i in range(30)]) + "\n"}


def test_consistent_hash_moves_few_sessions_when_a_replica_is_added() -> None:
    sessions = [f"s{i}" for i in range(400)]
    four, five = ConsistentHash(4), ConsistentHash(5)
    moved = sum(
        four.route(req([1], s), NOBODY) != five.route(req([1], s), NOBODY) for s in sessions
    )
    assert moved < 400 * 0.35  # ~1/5 expected; modulo hashing would move ~4/5


def test_session_key() -> None:
    assert session_key(req([1, 2], "x")) == b"s:x"
    assert session_key(req([1, 2])) == session_key(req([1, 3]))
    assert session_key(Request(0, 0, [], 4)) == b""
    assert session_key(Request(0, 4, [b"\x01" * 16], 4)) == b"b:" + b"\x01" * 16


def test_parse_routings() -> None:
    assert parse_routings(None) == ROUTINGS
    assert parse_routings("sticky, round_robin,sticky") == ("sticky", "round_robin")
    with pytest.raises(ConfigError, match="unknown routing 'random'"):
        parse_routings("round_robin,random")
    with pytest.raises(ConfigError, match="no routing"):
        parse_routings(" , ")
    with pytest.raises(ConfigError, match="unknown routing"):
        make_router("least_loaded", 2)
    with pytest.raises(ConfigError, match="at least 1"):
        make_router("sticky", 0)
