"""``TenantLedger`` over a real ``TierManager``: a tenant's flush waits for its own
accepted blocks and not for another tenant's later ones; tenant stats count exactly."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.daemon.tenants import TenantLedger, held_blocks, tenant_stats
from kvstore.dram import DramConfig, DramTier
from kvstore.errors import StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.manager import TierManager
from kvstore.tier import PutResult, SizeClassStats, StoreStats, Tier, TierStats
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import make_chain, payloads

NS_A = small_ns(tenant="alice")
NS_B = small_ns(tenant="bob")


class GatedTier(Tier):
    """A real DRAM tier whose puts for one tenant wait until the gate opens: a slow disk
    that one tenant's write-back is stuck behind."""

    def __init__(self, inner: DramTier, tenant: str) -> None:
        self.inner, self.tenant, self.name = inner, tenant, "ssd"
        self.gate = threading.Event()

    def put(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        src: Any,
        *,
        present_ok: bool = True,
        checksums: Sequence[int] | None = None,
    ) -> PutResult:
        if ns.tenant == self.tenant:
            self.gate.wait(30)
        return self.inner.put(ns, keys, src, present_ok=present_ok, checksums=checksums)

    def register(self, ns: Namespace) -> None:
        self.inner.register(ns)

    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        return self.inner.contains(ns, keys)

    def get_into(
        self, ns: Namespace, keys: Sequence[Key], dst: Any, *, checksums: list[int] | None = None
    ) -> int:
        return self.inner.get_into(ns, keys, dst, checksums=checksums)

    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        self.inner.touch(ns, keys)

    def delete_namespace(self, ns: Namespace) -> int:
        return self.inner.delete_namespace(ns)

    def stats(self) -> TierStats:
        return self.inner.stats()

    def check_integrity(self) -> None:
        self.inner.check_integrity()

    def close(self) -> None:
        self.gate.set()
        self.inner.close()


@pytest.fixture
def store() -> Any:
    low = GatedTier(DramTier(DramConfig(1 << 20, chunk_bytes=1 << 18, name="ssd")), "bob")
    s = TierManager([DramTier(DramConfig(1 << 20, chunk_bytes=1 << 18)), low])
    for ns in (NS_A, NS_B):
        s.register(ns)
    yield s, low
    s.close()


def test_a_tenants_flush_does_not_wait_for_another_tenants_later_blocks(store: Any) -> None:
    s, low = store
    ledger = TenantLedger()
    ka, kb = make_chain(NS_A, 3, seed=1), make_chain(NS_B, 3, seed=2)
    s.commit(NS_A, ka, payloads(NS_A, ka))
    ledger.note_commit("alice", s)
    ledger.flush("alice".__eq__, s, timeout_s=5)
    assert low.contains(NS_A, ka) == 3  # alice's flush waited for her blocks
    s.commit(NS_B, kb, payloads(NS_B, kb))  # its write-back now hangs at the gate
    ledger.note_commit("bob", s)
    ledger.flush("alice".__eq__, s, timeout_s=1)  # and not for bob's, accepted later
    with pytest.raises(StoreUnavailable):
        ledger.flush("bob".__eq__, s, timeout_s=0.2)
    with pytest.raises(StoreUnavailable):
        ledger.flush(None, s, timeout_s=0.2)  # an admin's flush waits for everything
    low.gate.set()
    ledger.flush("bob".__eq__, s, timeout_s=5)
    assert low.contains(NS_B, kb) == 3
    ledger.flush("carol".__eq__, s, timeout_s=0.01)  # nothing accepted: nothing to wait for
    ledger.check_integrity()


def test_held_blocks_count_each_tenants_own(store: Any) -> None:
    s, _ = store
    ka, kb = make_chain(NS_A, 2, seed=3), make_chain(NS_B, 4, seed=4)
    s.commit(NS_A, ka, payloads(NS_A, ka))
    s.commit(NS_B, kb, payloads(NS_B, kb))
    held = held_blocks(s, [NS_B])
    assert held["dram"] == {NS_B.block_bytes: 4}
    assert held["ssd"] is None  # GatedTier does not count: reported as unknown, not as 0
    stats = tenant_stats(s.stats(), held, {"commits_total": 1})
    dram, ssd = stats.tiers
    assert dram.used_bytes == 4 * NS_B.block_bytes and dram.info["held"] == "exact"
    assert ssd.used_bytes == 0 and ssd.info["held"] == "unknown"
    assert stats.counters == {"commits_total": 1}


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 20), st.integers(0, 20))))
def test_ledger_counts_add_up_per_tenant(events: list[tuple[str, int, int]]) -> None:
    ledger = TenantLedger()
    for tenant, asked, extra in events:
        ledger.count(
            tenant,
            lookups_total=1,
            lookup_blocks_total=asked + extra,
            lookup_hit_blocks_total=asked,
        )
    for tenant in ("a", "b"):
        mine = [e for e in events if e[0] == tenant]
        c = ledger.counters(tenant)
        assert c["lookups_total"] == len(mine)
        assert c["lookup_hit_blocks_total"] == sum(e[1] for e in mine)
        assert c["lookup_blocks_total"] == sum(e[1] + e[2] for e in mine)
    ledger.check_integrity()


@given(
    st.lists(
        st.tuples(st.sampled_from(["put-a", "put-b", "delete-a"]), st.integers(0, 10_000)),
        max_size=30,
    )
)
def test_dram_counts_each_namespaces_blocks_exactly(ops: list[tuple[str, int]]) -> None:
    # A small tier, so puts evict: the count must follow evictions and deletes too.
    tier = DramTier(DramConfig(24 * NS_A.block_bytes, chunk_bytes=8 * NS_A.block_bytes))
    keys: dict[Namespace, list[Key]] = {NS_A: [], NS_B: []}
    for ns in keys:
        tier.register(ns)
    for op, seed in ops:
        ns = NS_A if op.endswith("a") else NS_B
        if op.startswith("delete"):
            tier.delete_namespace(ns)
            continue
        chain = make_chain(ns, 5, seed=seed)
        tier.put(ns, chain, b"".join(payloads(ns, chain).values()))
        keys[ns].extend(chain)
    counts = tier.namespace_blocks([NS_A.fingerprint, NS_B.fingerprint])
    for ns, ks in keys.items():
        held = {k for k in ks if tier.contains(ns, [k]) == 1}
        assert counts[ns.fingerprint] == len(held)
    tier.check_integrity()


def test_a_tenants_bytes_are_counted_as_the_tier_counts_them() -> None:
    # Issue 36 (item 7): an SSD block occupies its slot (header, alignment), not its payload.
    bb = NS_A.block_bytes
    whole = StoreStats(
        tiers=(TierStats("ssd", 1 << 30, 9 * 4096, (SizeClassStats(bb, 100, 9),)),), counters={}
    )
    mine = tenant_stats(whole, {"ssd": {bb: 2}}, {}, {"ssd": lambda b: 4096})
    assert mine.tiers[0].used_bytes == 2 * 4096
    assert tenant_stats(whole, {"ssd": {bb: 2}}, {}).tiers[0].used_bytes == 2 * bb
