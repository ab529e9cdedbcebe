"""The KVStore contract (DESIGN §5), run against every implementation in factories.py."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from kvstore.block import payload_checksum
from kvstore.errors import StoreUnavailable, UnknownNamespace
from kvstore.keys import chain_keys
from kvstore.tier import KVStore
from tests.conformance.factories import STORE_FACTORIES, STORE_TIERS
from tests.conftest import payload_for, small_ns

NS = small_ns()
CAPACITY_BYTES = 1 << 20


def test_every_store_states_its_tiers() -> None:
    assert set(STORE_TIERS) == set(STORE_FACTORIES)


@pytest.fixture
def tiers(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The tiers the store under test was built with (``factories.STORE_TIERS``)."""
    return STORE_TIERS[request.node.callspec.params["store"]]


@pytest.fixture(params=sorted(STORE_FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[KVStore]:
    s, cleanup = STORE_FACTORIES[request.param](tmp_path, CAPACITY_BYTES)
    s.register(NS, timeout_s=10)
    try:
        yield s
    finally:
        cleanup()


def chain(n: int, seed: int = 0, ns=NS) -> list[bytes]:
    return chain_keys(ns, np.random.default_rng(seed).integers(0, 50_000, n * ns.block_tokens))


def payloads(keys: list[bytes], idx=None, ns=NS) -> dict[int, bytes]:
    return {i: payload_for(ns, keys[i]) for i in (range(len(keys)) if idx is None else idx)}


def test_commit_lookup_get_roundtrip(store: KVStore) -> None:
    keys = chain(6)
    res = store.commit(NS, keys, payloads(keys), timeout_s=10)
    assert (res.inserted, res.dropped) == (6, 0)
    look = store.lookup(NS, keys, timeout_s=10)
    assert look.hit_blocks == 6 and len(look.tiers) == 6
    assert set(look.tiers) <= {"hbm", "dram", "ssd"}
    dst = bytearray(6 * NS.block_bytes)
    assert store.get_into(NS, keys, dst, timeout_s=10) == 6
    assert bytes(dst) == b"".join(payloads(keys).values())


def test_get_into_a_torch_tensor(store: KVStore) -> None:
    keys = chain(3, seed=5)
    store.commit(NS, keys, payloads(keys), timeout_s=10)
    dst = torch.empty((3, *NS.payload_shape), dtype=torch.float16)
    assert store.get_into(NS, keys, dst, timeout_s=10) == 3
    assert dst.view(torch.uint8).numpy().tobytes() == b"".join(payloads(keys).values())


def test_partial_commit_stores_only_given_blocks(store: KVStore) -> None:
    keys = chain(5, seed=1)
    store.commit(NS, keys, payloads(keys, idx=[0, 1, 3]), timeout_s=10)
    assert store.lookup(NS, keys, timeout_s=10).hit_blocks == 2
    store.commit(NS, keys, payloads(keys, idx=[2]), timeout_s=10)
    assert store.lookup(NS, keys, timeout_s=10).hit_blocks == 4


def test_recommit_reports_present(store: KVStore) -> None:
    keys = chain(4, seed=2)
    store.commit(NS, keys, payloads(keys), timeout_s=10)
    res = store.commit(NS, keys, payloads(keys), timeout_s=10)
    assert (res.inserted, res.present) == (0, 4)


def test_lookup_of_unknown_chain_is_a_miss(store: KVStore) -> None:
    look = store.lookup(NS, chain(3, seed=99), timeout_s=10)
    assert look.hit_blocks == 0 and look.tiers == ()
    assert store.get_into(NS, chain(3, seed=99), bytearray(3 * NS.block_bytes), timeout_s=10) == 0


@pytest.mark.parametrize(
    "bad",
    [
        {7: b"x"},  # index outside the chain
        {-1: b"x"},
        {0: b"short"},  # wrong payload size
    ],
)
def test_bad_commit_is_rejected_and_stores_nothing(store: KVStore, bad) -> None:
    keys = chain(3, seed=3)
    good = payloads(keys, idx=[1])
    with pytest.raises(ValueError):
        store.commit(NS, keys, {**good, **bad}, timeout_s=10)
    assert store.lookup(NS, keys[1:], timeout_s=10).hit_blocks == 0


def test_wrong_destination_size_is_rejected(store: KVStore) -> None:
    keys = chain(2, seed=4)
    store.commit(NS, keys, payloads(keys), timeout_s=10)
    with pytest.raises(ValueError):
        store.get_into(NS, keys, bytearray(NS.block_bytes), timeout_s=10)


def test_unregistered_namespace_is_misuse(store: KVStore) -> None:
    other = small_ns(model_id="unregistered")
    with pytest.raises(UnknownNamespace):
        store.lookup(other, chain(1, ns=other), timeout_s=10)
    with pytest.raises(ValueError):
        store.commit(other, chain(1, ns=other), {}, timeout_s=10)


def test_flush_and_durable_commit(store: KVStore, tiers: tuple[str, ...]) -> None:
    # A store with a tier below DRAM acknowledges "ssd" once that tier took the blocks;
    # one without says "dram", truthfully (issue 14: either answer used to pass).
    keys = chain(4, seed=6)
    res = store.commit(NS, keys, payloads(keys), durability="ssd", timeout_s=30)
    assert res.durability == ("ssd" if "ssd" in tiers else "dram")
    store.flush(timeout_s=30)
    assert store.stats(timeout_s=10).counters["dirty_bytes"] == 0


def test_prefetch_resolves_to_the_prefix_in_the_top_tier(store: KVStore) -> None:
    keys = chain(4, seed=7)
    store.commit(NS, keys, payloads(keys), timeout_s=10)
    assert store.prefetch(NS, keys, timeout_s=10).result(timeout=30) == 4


def test_delete_namespace_drops_its_blocks_only(store: KVStore) -> None:
    other = small_ns(tenant="t2")
    store.register(other, timeout_s=10)
    k1, k2 = chain(3, seed=8), chain(3, seed=8, ns=other)
    store.commit(NS, k1, payloads(k1), timeout_s=10)
    store.commit(other, k2, payloads(k2, ns=other), timeout_s=10)
    assert store.delete_namespace(other, timeout_s=30) >= 3
    assert store.lookup(other, k2, timeout_s=10).hit_blocks == 0
    assert store.lookup(NS, k1, timeout_s=10).hit_blocks == 3


def test_stats_have_every_tier(store: KVStore, tiers: tuple[str, ...]) -> None:
    st = store.stats(timeout_s=10)
    assert tuple(t.name for t in st.tiers) == tiers
    assert all(t.capacity_bytes > 0 for t in st.tiers)


def test_closed_store_is_unavailable(store: KVStore) -> None:
    store.close()
    with pytest.raises(StoreUnavailable):
        store.lookup(NS, chain(1), timeout_s=10)
    store.close()


def test_reads_hand_on_the_checksums_made_at_commit(store: KVStore) -> None:
    keys = chain(4, seed=40)
    store.commit(NS, keys, payloads(keys), timeout_s=10)
    got: list[int] = []
    dst = bytearray(4 * NS.block_bytes)
    assert store.get_into(NS, keys, dst, timeout_s=10, checksums=got) == 4
    assert got == [payload_checksum(p) for p in payloads(keys).values()]
    assert bytes(dst) == b"".join(payloads(keys).values())
