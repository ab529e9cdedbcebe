"""The Tier contract (DESIGN §5–§6), run against every implementation in factories.py."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from kvstore.block import payload_checksum
from kvstore.errors import StoreUnavailable, UnknownNamespace
from kvstore.keys import chain_keys
from kvstore.tier import Tier
from tests.conformance.factories import SHARDED_TIERS, TIER_FACTORIES
from tests.conftest import payload_for, small_ns

NS = small_ns()
CAPACITY_BYTES = 1 << 20


@pytest.fixture(params=sorted(TIER_FACTORIES))
def tier(request: pytest.FixtureRequest, tmp_path) -> Iterator[Tier]:
    t, cleanup = TIER_FACTORIES[request.param](tmp_path, CAPACITY_BYTES)
    t.register(NS)
    try:
        yield t
    finally:
        cleanup()


def chain(n: int, seed: int = 0, ns=NS) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return chain_keys(ns, rng.integers(0, 50_000, n * ns.block_tokens))


def rows(keys: list[bytes], ns=NS) -> bytes:
    return b"".join(payload_for(ns, k) for k in keys)


def capacity_blocks(t: Tier, ns=NS) -> int:
    for c in t.stats().size_classes:
        if c.block_bytes == ns.block_bytes:
            return c.capacity_blocks
    raise AssertionError("registered size class missing from stats")


def test_put_then_get_returns_exact_bytes(tier: Tier) -> None:
    keys = chain(8)
    res = tier.put(NS, keys, rows(keys))
    assert (res.inserted, res.present, res.dropped) == (8, 0, 0)
    assert tier.contains(NS, keys) == 8
    dst = bytearray(8 * NS.block_bytes)
    assert tier.get_into(NS, keys, dst) == 8
    assert bytes(dst) == rows(keys)
    tier.check_integrity()


def test_contains_is_the_longest_present_prefix(tier: Tier) -> None:
    keys = chain(6)
    tier.put(NS, keys[:2], rows(keys[:2]))
    tier.put(NS, keys[3:], rows(keys[3:]))
    assert tier.contains(NS, keys) == 2
    assert tier.contains(NS, keys[3:]) == 3
    assert tier.contains(NS, []) == 0
    dst = bytearray(6 * NS.block_bytes)
    assert tier.get_into(NS, keys, dst) == 2
    assert bytes(dst[: 2 * NS.block_bytes]) == rows(keys[:2])


def test_put_of_present_keys_only_touches(tier: Tier) -> None:
    keys = chain(4)
    tier.put(NS, keys, rows(keys))
    res = tier.put(NS, keys, bytes(4 * NS.block_bytes))  # zeros must not overwrite
    assert (res.inserted, res.present) == (0, 4)
    dst = bytearray(4 * NS.block_bytes)
    tier.get_into(NS, keys, dst)
    assert bytes(dst) == rows(keys)


def test_present_ok_false_refuses_and_stores_nothing(tier: Tier) -> None:
    keys = chain(4)
    tier.put(NS, keys[:1], rows(keys[:1]))
    with pytest.raises(ValueError):
        tier.put(NS, keys, rows(keys), present_ok=False)
    assert tier.contains(NS, keys) == 1
    tier.check_integrity()


@pytest.mark.parametrize("delta", [-1, 1])
def test_wrong_buffer_size_is_rejected_without_side_effects(tier: Tier, delta: int) -> None:
    keys = chain(3)
    with pytest.raises(ValueError):
        tier.put(NS, keys, bytes(3 * NS.block_bytes + delta))
    assert tier.contains(NS, keys) == 0
    tier.put(NS, keys, rows(keys))
    with pytest.raises(ValueError):
        tier.get_into(NS, keys, bytearray(3 * NS.block_bytes + delta))
    tier.check_integrity()


def test_unregistered_namespace_is_misuse(tier: Tier) -> None:
    other = small_ns(model_id="never-registered")
    with pytest.raises(UnknownNamespace):
        tier.contains(other, chain(1, ns=other))
    with pytest.raises(ValueError):
        tier.put(other, chain(1, ns=other), bytes(other.block_bytes))


def test_register_is_idempotent(tier: Tier) -> None:
    keys = chain(2)
    tier.put(NS, keys, rows(keys))
    tier.register(NS)
    assert tier.contains(NS, keys) == 2


def test_capacity_evicts_chain_tail_first(tier: Tier, request: pytest.FixtureRequest) -> None:
    sharded = request.node.callspec.params["tier"] in SHARDED_TIERS
    cap = capacity_blocks(tier)
    first = chain(cap // 2, seed=1)
    tier.put(NS, first, rows(first))
    prefix = len(first)
    # Fill past capacity with other chains; the first chain must shrink from its tail.
    for seed in range(2, 6):
        more = chain(cap // 3, seed=seed)
        tier.put(NS, more, rows(more))
        if sharded:
            # Each shard evicts its own oldest blocks: a middle block can go before a
            # later one on a less-full shard, but the served prefix only ever shrinks.
            now = tier.contains(NS, first)
            assert now <= prefix
            prefix = now
        else:
            held = [tier.contains(NS, [k]) for k in first]
            assert held == sorted(held, reverse=True), "a chain must lose its tail first"
    assert tier.contains(NS, first) < len(first)
    tier.check_integrity()


def test_contains_does_not_change_recency_but_touch_does(tier: Tier) -> None:
    cap = capacity_blocks(tier)
    a, b = chain(cap // 2, seed=10), chain(cap // 2, seed=11)
    tier.put(NS, a, rows(a))
    tier.put(NS, b, rows(b))
    tier.contains(NS, a)  # must not protect a
    tier.touch(NS, b)
    c = chain(cap // 4, seed=12)
    tier.put(NS, c, rows(c))
    assert tier.contains(NS, b) == len(b), "touched chain survives"
    assert tier.contains(NS, a) < len(a), "only looked-up chain is evicted first"
    tier.touch(NS, a)  # touching absent keys is harmless
    tier.check_integrity()


def test_get_into_refreshes_recency(tier: Tier) -> None:
    cap = capacity_blocks(tier)
    a, b = chain(cap // 2, seed=20), chain(cap // 2, seed=21)
    tier.put(NS, a, rows(a))
    tier.put(NS, b, rows(b))
    tier.get_into(NS, a, bytearray(len(a) * NS.block_bytes))
    c = chain(cap // 4, seed=22)
    tier.put(NS, c, rows(c))
    assert tier.contains(NS, a) == len(a)
    assert tier.contains(NS, b) < len(b)


def test_size_classes_share_capacity(tier: Tier) -> None:
    big = small_ns(model_id="big", head_dim=32)  # 4x the block size
    tier.register(big)
    k_small, k_big = chain(4), chain(4, ns=big)
    tier.put(NS, k_small, rows(k_small))
    tier.put(big, k_big, rows(k_big, ns=big))
    dst = bytearray(4 * big.block_bytes)
    assert tier.get_into(big, k_big, dst) == 4 and bytes(dst) == rows(k_big, ns=big)
    assert tier.contains(NS, k_small) == 4
    sizes = {c.block_bytes for c in tier.stats().size_classes}
    assert {NS.block_bytes, big.block_bytes} <= sizes
    tier.check_integrity()


def test_namespaces_never_share_blocks_and_delete_is_scoped(tier: Tier) -> None:
    other = small_ns(tenant="other")
    tier.register(other)
    tokens = np.arange(4 * NS.block_tokens)
    k1, k2 = chain_keys(NS, tokens), chain_keys(other, tokens)
    tier.put(NS, k1, rows(k1))
    tier.put(other, k2, rows(k2, ns=other))
    assert tier.contains(other, k1) == 0
    assert tier.delete_namespace(other) == 4
    assert tier.contains(other, k2) == 0
    assert tier.contains(NS, k1) == 4
    tier.check_integrity()


def test_randomized_operations_keep_integrity(tier: Tier) -> None:
    rnd = random.Random(7)
    chains = [chain(rnd.randint(1, 12), seed=100 + i) for i in range(12)]
    dst = bytearray(12 * NS.block_bytes)
    for _ in range(120):
        keys = rnd.choice(chains)
        op = rnd.random()
        if op < 0.4:
            tier.put(NS, keys, rows(keys))
        elif op < 0.7:
            n = tier.get_into(NS, keys, memoryview(dst)[: len(keys) * NS.block_bytes])
            assert bytes(dst[: n * NS.block_bytes]) == rows(keys[:n])
        elif op < 0.9:
            tier.touch(NS, keys)
        else:
            assert 0 <= tier.contains(NS, keys) <= len(keys)
        tier.check_integrity()


def test_concurrent_readers_and_writers_never_see_wrong_bytes(tier: Tier) -> None:
    chains = [chain(6, seed=200 + i) for i in range(16)]
    errors: list[str] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        dst = bytearray(6 * NS.block_bytes)
        for _ in range(40):
            keys = rnd.choice(chains)
            if rnd.random() < 0.5:
                tier.put(NS, keys, rows(keys))
            else:
                n = tier.get_into(NS, keys, dst)
                if bytes(dst[: n * NS.block_bytes]) != rows(keys[:n]):
                    errors.append(f"wrong bytes for chain starting {keys[0].hex()}")

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    tier.check_integrity()


def test_stats_report_capacity_and_usage(tier: Tier) -> None:
    keys = chain(5)
    tier.put(NS, keys, rows(keys))
    st = tier.stats()
    cls = next(c for c in st.size_classes if c.block_bytes == NS.block_bytes)
    assert cls.used_blocks == 5
    assert cls.capacity_blocks >= 5
    assert st.capacity_bytes > 0


def test_closed_tier_is_unavailable(tier: Tier) -> None:
    tier.close()
    with pytest.raises(StoreUnavailable):
        tier.contains(NS, chain(1))
    tier.close()  # idempotent


def test_checksums_made_at_commit_are_kept_and_handed_on(tier: Tier) -> None:
    # DESIGN §4: a tier stores the checksum it is given (made at commit) and returns it
    # with every read; a row that no longer matches it is a miss, never data.
    keys = chain(5, seed=40)
    sums = [payload_checksum(payload_for(NS, k)) for k in keys]
    assert tier.put(NS, keys, rows(keys), checksums=sums).inserted == 5
    got: list[int] = []
    dst = bytearray(5 * NS.block_bytes)
    assert tier.get_into(NS, keys, dst, checksums=got) == 5
    assert got == sums and bytes(dst) == rows(keys)
    got = []
    assert tier.get_into(NS, keys[2:], dst[: 3 * NS.block_bytes], checksums=got) == 3
    assert got == sums[2:]
