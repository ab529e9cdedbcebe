"""DRAM-tier specifics beyond the conformance suite: leases, misuse, adjacent reads,
policies and end-to-end checksums. Where blocks go (chunks, size classes, pinned memory
never moved) is tested in test_dram_slots.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvstore.block import payload_checksum
from kvstore.dram import DramConfig, DramTier
from kvstore.errors import IntegrityError, InvalidArgument
from kvstore.row_copy import NativeRowCopier, make_row_copier
from tests.conftest import payload_for, small_ns
from tests.kvstore.dram_helpers import CHUNK, SMALL, chain, make, put, verify


def test_expired_leases_are_counted_not_leaked() -> None:
    now = [1000.0]
    t = DramTier(DramConfig(CHUNK, chunk_bytes=CHUNK), clock=lambda: now[0])
    t.register(SMALL)
    cap = CHUNK // SMALL.block_bytes
    keys = chain(SMALL, 3, seed=6)
    put(t, SMALL, keys)
    t.pin(SMALL, keys, lease_s=8)
    now[0] += 7.5
    put(t, SMALL, chain(SMALL, 1, seed=7))  # mutations expire leases lazily: not yet
    assert t.stats().counters["leases_expired_total"] == 0
    assert t.stats().counters["pinned_blocks"] == 3
    now[0] += 0.5  # the lease's deadline (exact in binary)
    put(t, SMALL, chain(SMALL, 1, seed=8))
    st_ = t.stats()
    assert st_.counters["leases_expired_total"] == 1
    assert st_.counters["pinned_blocks"] == 0
    # Not leaked: the blocks went back to the policy, so a full pool's worth evicts them.
    put(t, SMALL, chain(SMALL, cap, seed=9))
    assert t.contains(SMALL, keys) == 0
    t.check_integrity()


def test_block_larger_than_a_chunk_is_a_clear_error() -> None:
    t = DramTier(DramConfig(4 * CHUNK, chunk_bytes=CHUNK))
    with pytest.raises(InvalidArgument, match="chunk"):
        t.register(small_ns(head_dim=1024))


def test_duplicate_keys_in_one_put_are_misuse() -> None:
    t = make()
    k = chain(SMALL, 1, seed=8)
    with pytest.raises(InvalidArgument):
        t.put(SMALL, k + k, bytes(2 * SMALL.block_bytes))
    assert t.contains(SMALL, k) == 0


def test_adjacent_blocks_are_read_in_one_copy_and_stay_correct() -> None:
    t = make()
    keys = chain(SMALL, 12, seed=9)
    put(t, SMALL, keys)
    # A put inserts last→first; the chain still lands in ascending adjacent slots, so a
    # read of it is one memory range.
    slots = [t._classes[SMALL.block_bytes].slot[k] for k in keys]
    assert slots == list(range(slots[0], slots[0] + 12))
    assert verify(t, SMALL, keys) == 12
    assert verify(t, SMALL, keys[3:9]) == 6


def test_s3fifo_policy_works_in_the_tier() -> None:
    t = make(chunks=2, policy="s3fifo")
    for s in range(20):
        put(t, SMALL, chain(SMALL, 5, seed=300 + s))
        t.check_integrity()
    assert t.stats().info["policy"] == "s3fifo"


# -- end-to-end checksums (issue 14, item 3) ------------------------------------------
def _flip_stored(t: DramTier, ns, key: bytes, at: int = 100) -> None:
    """Flip one bit of ``key``'s payload in the tier's own memory."""
    cs = t._classes[ns.block_bytes]
    off = t._pool.offset(cs.sc, cs.slot[key]) + at
    t._pool.tensor[off] ^= 0x10


def test_a_flipped_byte_in_dram_memory_is_a_counted_miss_never_data() -> None:
    t = make()
    keys = chain(SMALL, 6, seed=30)
    put(t, SMALL, keys)
    _flip_stored(t, SMALL, keys[3])
    dst = bytearray(6 * SMALL.block_bytes)
    sums: list[int] = []
    assert t.get_into(SMALL, keys, dst, checksums=sums) == 3
    assert bytes(dst[: 3 * SMALL.block_bytes]) == b"".join(payload_for(SMALL, k) for k in keys[:3])
    assert sums == [payload_checksum(payload_for(SMALL, k)) for k in keys[:3]]
    c = t.stats().counters
    assert c["corrupt_blocks_total"] == 1 and c["quarantined_blocks_total"] == 1
    assert t.contains(SMALL, keys) == 3, "the bad copy is dropped, not served again"
    t.check_integrity()


@pytest.mark.parametrize("threads", [1, 2])
def test_a_flipped_byte_in_a_large_read_is_caught_on_either_copy_path(threads: int) -> None:
    # 32 x 64 KiB = 2 MiB: above the size at which the helper thread shares the read.
    ns = small_ns(model_id="large", kv_heads=8, head_dim=128, cached_layers=(0, 1))
    t = DramTier(DramConfig(4 << 20, chunk_bytes=2 << 20, copy_threads=threads))
    t.register(ns)
    keys = chain(ns, 32, seed=35)
    put(t, ns, keys)
    _flip_stored(t, ns, keys[29], at=ns.block_bytes - 1)
    assert verify(t, ns, keys) == 29
    assert isinstance(t._copier, NativeRowCopier) and t._copier.threads == threads
    assert t._copier.shared_calls == (1 if threads == 2 else 0)
    c = t.stats().counters
    assert c["corrupt_blocks_total"] == 1 and c["quarantined_blocks_total"] == 1
    assert t.contains(ns, keys) == 29
    assert verify(t, ns, keys[:29]) == 29
    t.check_integrity()
    t.close()


@pytest.mark.parametrize("copier", ["native-1", "native-2", "python-2"])
@pytest.mark.parametrize("dtype", [torch.uint8, torch.bfloat16])
def test_a_tensor_destination_is_written_by_address_and_checked_the_same(
    copier: str, dtype: torch.dtype
) -> None:
    # A CPU tensor is handed to the copier by its address (kvstore.buffers.writable_rows);
    # what lands in it, what passes and what a flipped byte does are as for a buffer,
    # including the check of the failed row's copy (read back through the address).
    ns = small_ns(model_id="large", kv_heads=8, head_dim=128, cached_layers=(0, 1))
    threads = 1 if copier == "native-1" else 2
    t = DramTier(DramConfig(4 << 20, chunk_bytes=2 << 20, copy_threads=threads))
    if copier == "python-2":
        t._copier = make_row_copier(2, kind="python")
    t.register(ns)
    keys = chain(ns, 32, seed=37)
    put(t, ns, keys)
    _flip_stored(t, ns, keys[21], at=7)
    bb = ns.block_bytes
    dst = torch.zeros(32 * bb // dtype.itemsize, dtype=dtype)
    sums: list[int] = []
    assert t.get_into(ns, keys, dst, checksums=sums) == 21
    got = dst.view(torch.uint8).numpy().tobytes()
    assert got[: 21 * bb] == b"".join(payload_for(ns, k) for k in keys[:21])
    assert sums == [payload_checksum(payload_for(ns, k)) for k in keys[:21]]
    c = t.stats().counters
    assert c["corrupt_blocks_total"] == 1 and c["quarantined_blocks_total"] == 1
    with pytest.raises(InvalidArgument):
        t.get_into(ns, keys, dst[:-1])  # one element short
    with pytest.raises(InvalidArgument):
        t.get_into(ns, keys[:16], dst.view(2, -1)[:, : 16 * bb // dtype.itemsize // 2])
    t.check_integrity()
    t.close()


def test_put_keeps_the_given_checksum_so_a_damaged_source_is_caught() -> None:
    t = make()
    keys = chain(SMALL, 2, seed=31)
    good = [payload_for(SMALL, k) for k in keys]
    bad = bytearray(b"".join(good))
    bad[SMALL.block_bytes + 7] ^= 1  # block 1 changed after its checksum was made
    t.put(SMALL, keys, bad, checksums=[payload_checksum(g) for g in good])
    assert verify(t, SMALL, keys) == 1
    assert t.stats().counters["corrupt_blocks_total"] == 1


def test_checksums_must_match_the_keys() -> None:
    t = make()
    keys = chain(SMALL, 2, seed=32)
    with pytest.raises(InvalidArgument):
        t.put(SMALL, keys, bytes(2 * SMALL.block_bytes), checksums=[1])
    assert t.contains(SMALL, keys) == 0


@given(
    st.lists(
        st.tuples(st.integers(0, 7), st.sampled_from(["put", "get", "pin", "unpin", "flip"])),
        max_size=40,
    )
)
def test_the_native_read_by_key_and_the_python_fallback_keep_the_same_books(ops) -> None:
    # The native copier looks keys up itself (RowCopier.copy_found); the fallback does it
    # in Python. Same reads, recency, pins and counters, op after op.
    tiers = [make(chunks=2), make(chunks=2)]
    tiers[1]._copier = make_row_copier(1, kind="python")
    chains = [chain(SMALL, 1 + s % 5, seed=40 + s) for s in range(8)]
    leases: list[list] = [[], []]
    for s, op in ops:
        keys = chains[s]
        out = []
        for i, t in enumerate(tiers):
            if op == "put":
                put(t, SMALL, keys)
            elif op == "get" and s % 2:  # a tensor: handed over by its address
                tdst = torch.zeros(len(keys) * SMALL.block_bytes, dtype=torch.uint8)
                out.append((t.get_into(SMALL, keys, tdst), tdst.numpy().tobytes()))
            elif op == "get":
                dst = bytearray(len(keys) * SMALL.block_bytes)
                out.append((t.get_into(SMALL, keys, dst), bytes(dst)))
            elif op == "pin":
                leases[i].append(t.pin(SMALL, keys, lease_s=60))
            elif op == "unpin" and leases[i]:
                t.unpin(leases[i].pop(0))
            elif op == "flip" and t.contains(SMALL, keys[-1:]):
                _flip_stored(t, SMALL, keys[-1])
            t.check_integrity()
        if out:
            assert out[0] == out[1]
        a, b = (t._classes[SMALL.block_bytes] for t in tiers)
        assert a.slot == b.slot and a.stamp == b.stamp and list(a.policy) == list(b.policy)
        assert tiers[0].counters == tiers[1].counters


def test_check_integrity_notices_a_copier_index_that_is_not_the_tiers() -> None:
    t = make()
    put(t, SMALL, chain(SMALL, 2, seed=50))
    cs = t._classes[SMALL.block_bytes]
    t.check_integrity()
    cs.rows = cs.rows._replace(owner=dict(cs.owner))  # a copy: reads would go stale
    with pytest.raises(IntegrityError, match="copier's index"):
        t.check_integrity()
