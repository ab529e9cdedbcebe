"""Tier-manager semantics (DESIGN §6) with real tiers; a second DRAM tier plays the lower level."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kvstore.dram import DramConfig, DramTier
from kvstore.errors import NotDurable
from kvstore.keys import chain_keys
from kvstore.manager import ManagerConfig, TierManager
from tests.conftest import payload_for, small_ns

NS = small_ns()
BB = NS.block_bytes


def make(
    top_blocks: int = 8, low_blocks: int = 64, **cfg
) -> tuple[TierManager, DramTier, DramTier]:
    top = DramTier(DramConfig(top_blocks * BB, chunk_bytes=BB * 4))
    low = DramTier(DramConfig(low_blocks * BB, chunk_bytes=BB * 8, name="ssd"))
    m = TierManager([top, low], ManagerConfig(**cfg))
    m.register(NS)
    return m, top, low


def chain(n: int, seed: int = 0) -> list[bytes]:
    return chain_keys(NS, np.random.default_rng(seed).integers(0, 1 << 20, n * NS.block_tokens))


def pl(keys, idx=None) -> dict[int, bytes]:
    return {i: payload_for(NS, keys[i]) for i in (range(len(keys)) if idx is None else idx)}


def test_commit_writes_back_to_every_lower_tier() -> None:
    m, top, low = make()
    keys = chain(6)
    res = m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=10)
    assert res.durability == "ssd"
    assert top.contains(NS, keys) == 6 and low.contains(NS, keys) == 6
    m.check_integrity()
    m.close()


def test_dram_eviction_keeps_the_lower_copy_and_reads_promote() -> None:
    m, top, low = make(top_blocks=8)
    a, b = chain(6, seed=1), chain(6, seed=2)
    m.commit(NS, a, pl(a), durability="ssd")
    m.commit(NS, b, pl(b), durability="ssd")
    assert top.contains(NS, a) < 6 and low.contains(NS, a) == 6
    kept = sum(top.contains(NS, [k]) for k in a)  # a's blocks DRAM kept, wherever they are
    look = m.lookup(NS, a)
    assert look.hit_blocks == 6 and "ssd" in look.tiers
    dst = bytearray(6 * BB)
    assert m.get_into(NS, a, dst) == 6
    assert bytes(dst) == b"".join(pl(a).values())
    assert top.contains(NS, a) == 6, "SSD hits are promoted"
    assert m.lookup(NS, a).tiers == ("dram",) * 6
    assert m.stats().counters["promoted_blocks_total"] == 6 - kept  # the ones read from SSD
    m.close()


def test_lookup_attributes_each_block_to_the_fastest_tier_without_side_effects() -> None:
    m, top, _low = make()
    keys = chain(5, seed=3)
    m.commit(NS, keys, pl(keys), durability="ssd")
    top.delete_namespace(NS)
    m.commit(NS, keys, pl(keys, idx=[0, 1]))
    before = top.stats().counters.copy()
    assert m.lookup(NS, keys).tiers == ("dram", "dram", "ssd", "ssd", "ssd")
    assert top.stats().counters == before
    m.close()


def test_a_prefix_larger_than_dram_keeps_its_head_in_dram() -> None:
    m, top, _ = make(top_blocks=8)
    keys = chain(20, seed=4)
    m.commit(NS, keys, pl(keys), durability="ssd")
    assert top.contains(NS, keys) == 8
    assert m.get_into(NS, keys, bytearray(20 * BB)) == 20
    assert top.contains(NS, keys) == 8
    m.close()


class HeldTier(DramTier):
    """A lower tier whose puts wait until the test lets them go: the flusher cannot drain
    while a commit runs, so what the dirty bound grants is decided, not raced."""

    def __init__(self, config: DramConfig) -> None:
        super().__init__(config)
        self.go = threading.Event()

    def put(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        assert self.go.wait(timeout=60), "the test never let the write-back go"
        return super().put(*args, **kwargs)


def test_backpressure_then_drops_are_counted_never_silent() -> None:
    # Dirty bound 2 blocks, zero deadline, a flusher held on its first batch: the commit
    # gets the 2 blocks an idle queue grants, waits (counted) for more, gets none (counted
    # drops). The lower tier is closed, so that batch then fails: the flush says so.
    top = DramTier(DramConfig(8 * BB, chunk_bytes=BB * 4))
    low = HeldTier(DramConfig(64 * BB, chunk_bytes=BB * 8, name="ssd"))
    m = TierManager([top, low], ManagerConfig(max_dirty_bytes=2 * BB, commit_wait_s=0.0))
    try:
        m.register(NS)
        low.close()
        keys = chain(12, seed=5)
        res = m.commit(NS, keys, pl(keys), timeout_s=0.0)
        assert (res.inserted, res.dropped) == (2, 10)  # the chain's head is kept
        assert top.contains(NS, keys) == 2
        st = m.stats().counters
        assert st["dropped_blocks_total"] == 10
        assert st["backpressure_waits_total"] == 2  # for 12 blocks, then for the last 10
    finally:
        low.go.set()
    with pytest.raises(NotDurable) as refused:  # the lower tier took none of them
        m.flush(timeout_s=10)
    assert refused.value.refused_blocks == 2
    assert m.stats().counters["writeback_errors_total"] == 2
    m.close()


def test_commit_waits_for_room_within_its_deadline() -> None:
    m, _, low = make(max_dirty_bytes=2 * BB, commit_wait_s=10.0)
    keys = chain(16, seed=6)
    res = m.commit(NS, keys, pl(keys), durability="ssd", timeout_s=30)
    assert (res.inserted, res.dropped, res.durability) == (16, 0, "ssd")
    # A bound by nature: how often the commit waits depends on how fast the flusher
    # drains (16 blocks through a 2-block bound wait at least once).
    assert m.stats().counters["backpressure_waits_total"] >= 1
    assert low.contains(NS, keys) == 16
    m.close()


def test_a_failing_lower_tier_is_a_miss_not_an_error() -> None:
    m, top, low = make()
    keys = chain(4, seed=7)
    m.commit(NS, keys, pl(keys), durability="ssd")
    top.delete_namespace(NS)
    low.close()
    assert m.lookup(NS, keys).hit_blocks == 0
    assert m.get_into(NS, keys, bytearray(4 * BB)) == 0
    assert m.stats().counters["tier_errors_total"] == 2  # one per call that asked the low tier
    m.close()


def test_prefetch_promotes_in_the_background() -> None:
    m, top, _ = make()
    keys = chain(4, seed=8)
    m.commit(NS, keys, pl(keys), durability="ssd")
    top.delete_namespace(NS)
    assert m.prefetch(NS, keys).result(timeout=10) == 4
    assert top.contains(NS, keys) == 4
    m.close()


class TouchLog(DramTier):
    """A lower tier that tells when the write-back has forwarded a touch of given keys."""

    def __init__(self, config: DramConfig) -> None:
        super().__init__(config)
        self._touched: set[bytes] = set()
        self._cond = threading.Condition()

    def touch(self, ns, keys) -> None:  # type: ignore[no-untyped-def]
        super().touch(ns, keys)
        with self._cond:
            self._touched.update(keys)
            self._cond.notify_all()

    def wait_touched(self, keys: list[bytes], timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._touched.issuperset(keys), timeout_s)


def test_dram_hits_refresh_lower_copies_in_batches() -> None:
    top = DramTier(DramConfig(8 * BB, chunk_bytes=BB * 4))
    low = TouchLog(DramConfig(64 * BB, chunk_bytes=BB * 8, name="ssd"))
    m = TierManager([top, low], ManagerConfig(retention_touch_interval_s=0.05))
    m.register(NS)
    a, b = chain(4, seed=9), chain(60, seed=10)
    m.commit(NS, a, pl(a), durability="ssd")
    m.commit(NS, b, pl(b), durability="ssd")  # a is now the lower tier's oldest
    m.get_into(NS, a, bytearray(4 * BB))  # a DRAM hit
    # The flusher forwards the hit on its next round (an event, not a wait that a slow
    # machine could outlast); committing c before that would evict a below.
    assert low.wait_touched(a, timeout_s=30)
    c = chain(8, seed=11)
    m.commit(NS, c, pl(c), durability="ssd")
    assert low.contains(NS, a) == 4, "refreshed copy outlives older blocks"
    assert sum(low.contains(NS, [k]) for k in b) == 60 - 8  # b's older blocks made room
    m.close()


def test_single_tier_manager_has_no_writeback() -> None:
    top = DramTier(DramConfig(16 * BB, chunk_bytes=4 * BB))
    m = TierManager([top])
    m.register(NS)
    keys = chain(3, seed=12)
    assert m.commit(NS, keys, pl(keys), durability="ssd").durability == "dram"
    m.flush(timeout_s=1)
    m.close()


def test_commits_longer_than_dram_keep_a_shared_head() -> None:
    # Two sessions share a 4-block system prompt and each re-commits a chain longer than
    # DRAM; the shared head must survive in DRAM (the model's last→first commit).
    m, top, _ = make(top_blocks=8)
    rng = np.random.default_rng(13)
    system = rng.integers(0, 1 << 20, 4 * NS.block_tokens).tolist()
    sessions = [system + rng.integers(0, 1 << 20, 10 * NS.block_tokens).tolist() for _ in range(2)]
    for _ in range(3):
        for tokens in sessions:
            keys = chain_keys(NS, tokens)
            hit = m.get_into(NS, keys, bytearray(len(keys) * BB))
            m.commit(NS, keys, pl(keys, idx=range(hit, len(keys))))
            assert top.contains(NS, keys[:4]) == 4
    m.check_integrity()
    m.close()


def test_batched_refresh_replays_hits_in_order() -> None:
    # Hits on a, then b: after the batched refresh the lower tier must hold b as more
    # recent than a, exactly as if each hit had been forwarded at once.
    m, _, low = make(low_blocks=16, retention_touch_interval_s=3600)
    a, b, c = chain(4, seed=20), chain(4, seed=21), chain(8, seed=22)
    m.commit(NS, c, pl(c), durability="ssd")
    m.commit(NS, a, pl(a), durability="ssd")
    m.commit(NS, b, pl(b), durability="ssd")
    for keys in (c, a, b):  # oldest in the lower tier first: c, a, b
        m.get_into(NS, keys, bytearray(len(keys) * BB))
    wb = m._wb
    with wb._cond:
        pending = wb._touches
        wb._touches, wb._touch_keys = {}, 0
    wb._refresh(pending)
    d = chain(4, seed=23)
    low.put(NS, d, b"".join(pl(d).values()))  # evicts the 4 least recent: c's tail
    assert low.contains(NS, a) == 4 and low.contains(NS, b) == 4
    assert low.contains(NS, c) == 4 and low.contains(NS, c[4:]) == 0
    m.close()
