"""Retention: blocks idle longer than retention_s are misses, then swept (injected clock)."""

from __future__ import annotations

import time

from tests.storage_nodes.ssd.helpers import chain, rows, small_ns, verify_all

HOUR = 3600.0


def test_expired_blocks_are_misses_then_swept(open_tier, clock) -> None:
    ns = small_ns()
    t = open_tier(retention_s=HOUR)
    t.register(ns)
    a, b = chain(ns, 8, salt=1), chain(ns, 8, salt=2)
    t.put(ns, a, rows(ns, a))
    t.put(ns, b, rows(ns, b))
    clock.advance(HOUR / 2)
    t.touch(ns, a)  # still pending in memory: must protect a all the same
    clock.advance(HOUR / 2 + 120)
    assert t.contains(ns, b) == 0  # idle > retention: a miss before any sweep
    assert t.get_into(ns, b, bytearray(8 * ns.block_bytes)) == 0
    assert t.contains(ns, a) == 8
    assert t.sweep() == 8
    cnt = t.stats().counters
    assert cnt["expired_total"] == 8 and cnt["retention_violations_total"] == 0
    assert set(t.iter_keys(ns)) == set(a)
    assert verify_all(t, ns) == 8
    t.check_integrity()


def test_default_retention_is_72h(open_tier, clock) -> None:
    ns = small_ns()
    t = open_tier()
    assert t.config.retention_s == 72 * HOUR
    t.register(ns)
    k = chain(ns, 3)
    t.put(ns, k, rows(ns, k))
    clock.advance(71 * HOUR)
    assert t.sweep() == 0 and t.contains(ns, k) == 3
    clock.advance(2 * HOUR)
    assert t.sweep() == 3 and t.contains(ns, k) == 0


def test_expired_key_can_be_put_again(open_tier, clock) -> None:
    ns = small_ns()
    t = open_tier(retention_s=HOUR)
    t.register(ns)
    k = chain(ns, 4)
    t.put(ns, k, rows(ns, k))
    clock.advance(2 * HOUR)
    r = t.put(ns, k, rows(ns, k))
    assert r.inserted == 4 and r.present == 0  # replaced the expired copies
    assert t.sweep() == 0
    assert verify_all(t, ns) == 4
    t.check_integrity()


def test_background_sweeper_runs(open_tier, clock) -> None:
    ns = small_ns()
    t = open_tier(retention_s=HOUR, sweep_interval_s=0.05, touch_flush_s=0.05)
    t.register(ns)
    k = chain(ns, 5)
    t.put(ns, k, rows(ns, k))
    clock.advance(2 * HOUR)
    deadline = time.monotonic() + 20
    while t.stats().counters["blocks"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert t.stats().counters["blocks"] == 0
    assert t.stats().counters["expired_total"] == 5
    t.check_integrity()


def test_capacity_eviction_of_expired_blocks_is_not_a_violation(open_tier, clock) -> None:
    ns = small_ns()
    t = open_tier(retention_s=HOUR, capacity_bytes=2 * (256 << 10))
    t.register(ns)
    a = chain(ns, 128, salt=1)
    t.put(ns, a, rows(ns, a))
    clock.advance(2 * HOUR)
    b = chain(ns, 10, salt=2)
    t.put(ns, b, rows(ns, b))
    cnt = t.stats().counters
    # exactly the 10 the put needed room for (no evict-ahead any more)
    assert cnt["retention_violations_total"] == 0 and cnt["expired_total"] == 10


def test_touch_does_not_revive_an_expired_block(open_tier, clock) -> None:
    ns = small_ns()
    t = open_tier(retention_s=HOUR)
    t.register(ns)
    k = chain(ns, 3)
    t.put(ns, k, rows(ns, k))
    clock.advance(2 * HOUR)
    t.touch(ns, k)
    assert t.contains(ns, k) == 0
    assert t.sweep() == 3
