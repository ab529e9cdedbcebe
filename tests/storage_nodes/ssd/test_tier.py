"""SSDTier behaviour through the Tier interface, on both I/O backends."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kvstore.errors import BufferSizeError, InvalidArgument, StoreUnavailable, UnknownNamespace
from storage_nodes.ssd import SSDConfigError
from tests.storage_nodes.ssd.helpers import chain, payload_for, rows, small_ns, verify_all


def test_put_get_roundtrip_and_reopen(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 40)
    assert t.put(ns, keys, rows(ns, keys)).inserted == 40
    assert t.contains(ns, keys) == 40
    dst = bytearray(40 * ns.block_bytes)
    assert t.get_into(ns, keys, dst) == 40
    assert bytes(dst) == rows(ns, keys)
    t.check_integrity()
    t.close()
    t2 = open_tier()
    t2.register(ns)
    assert t2.contains(ns, keys) == 40
    assert verify_all(t2, ns) == 40
    t2.check_integrity()


def test_prefix_semantics(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 10)
    t.put(ns, keys[:4], rows(ns, keys[:4]))
    t.put(ns, keys[5:], rows(ns, keys[5:]))
    assert t.contains(ns, keys) == 4
    dst = bytearray(10 * ns.block_bytes)
    assert t.get_into(ns, keys, dst) == 4
    assert bytes(dst[: 4 * ns.block_bytes]) == rows(ns, keys[:4])
    assert t.contains(ns, keys[5:]) == 5
    assert t.contains(ns, []) == 0
    assert t.get_into(ns, [], bytearray()) == 0
    c = t.stats().counters
    assert c["hits"] == 4 and c["misses"] == 6


def test_present_keys_only_touched(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 6)
    t.put(ns, keys[:3], rows(ns, keys[:3]))
    r = t.put(ns, keys, rows(ns, keys))
    assert (r.inserted, r.present, r.dropped) == (3, 3, 0)
    with pytest.raises(InvalidArgument):
        t.put(ns, keys, rows(ns, keys), present_ok=False)
    more = chain(ns, 8)
    with pytest.raises(InvalidArgument):
        t.put(ns, more, rows(ns, more), present_ok=False)
    assert t.contains(ns, more) == 6  # the refused put stored nothing
    t.check_integrity()


def test_misuse_is_value_error(open_tier) -> None:
    ns, other = small_ns(), small_ns(model_id="other")
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 3)
    with pytest.raises(UnknownNamespace):
        t.contains(other, keys)
    with pytest.raises(BufferSizeError):
        t.put(ns, keys, b"x" * 10)
    with pytest.raises(BufferSizeError):
        t.get_into(ns, keys, bytearray(5))
    with pytest.raises(InvalidArgument):
        t.get_into(ns, keys, bytes(3 * ns.block_bytes))  # read-only destination
    with pytest.raises(InvalidArgument):
        t.put(ns, [b"short"], bytes(ns.block_bytes))
    with pytest.raises(InvalidArgument):
        t.put(ns, [keys[0], keys[0]], bytes(2 * ns.block_bytes))
    assert t.stats().counters["blocks"] == 0


def test_closed_tier_is_unavailable(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    t.close()
    t.close()  # idempotent
    with pytest.raises(StoreUnavailable):
        t.contains(ns, chain(ns, 1))
    with pytest.raises(StoreUnavailable):
        t.stats()


def test_numpy_and_torch_buffers(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 5)
    src = torch.frombuffer(bytearray(rows(ns, keys)), dtype=torch.float16).reshape(
        5, *ns.payload_shape
    )
    assert t.put(ns, keys, src).inserted == 5
    dst = np.zeros((5, ns.block_bytes), dtype=np.uint8)
    assert t.get_into(ns, keys, dst) == 5
    assert dst.tobytes() == rows(ns, keys)
    tdst = torch.zeros(5, *ns.payload_shape, dtype=torch.float16)
    assert t.get_into(ns, keys, tdst) == 5
    assert tdst.view(torch.uint8).numpy().tobytes() == rows(ns, keys)  # NaNs: compare bytes


def test_size_classes_share_capacity(open_tier) -> None:
    small, big = small_ns(), small_ns(model_id="big", head_dim=64)  # 2 KiB and 16 KiB
    t = open_tier()
    t.register(small)
    t.register(big)
    ks, kb = chain(small, 30), chain(big, 30)
    t.put(small, ks, rows(small, ks))
    t.put(big, kb, rows(big, kb))
    st = t.stats()
    by = {c.block_bytes: c for c in st.size_classes}
    assert by[small.block_bytes].used_blocks == 30 and by[big.block_bytes].used_blocks == 30
    # capacity_blocks = own slabs + unallocated chunks, in that class's slot size
    assert by[small.block_bytes].capacity_blocks >= 30
    assert (
        st.counters["slabs"] == 1 + 3
    )  # 30 x 4 KiB slots fit one 256 KiB slab; 20 KiB slots: 12 a slab
    assert verify_all(t, small) == 30 and verify_all(t, big) == 30
    t.check_integrity()


def test_namespaces_do_not_share_keys(open_tier) -> None:
    a, b = small_ns(), small_ns(tenant="b")
    t = open_tier()
    t.register(a)
    t.register(b)
    keys = chain(a, 4)
    t.put(a, keys, rows(a, keys))
    assert t.contains(b, keys) == 0  # same key bytes, other fingerprint
    assert t.delete_namespace(a) == 4
    assert t.contains(a, keys) == 0
    t.put(a, keys, rows(a, keys))  # still registered
    t.check_integrity()


def test_namespace_blocks_count_each_namespace_and_its_slots(open_tier) -> None:
    # Issue 36 (item 7): a tenant's Stats showed "ssd: 0 B" (the tier could not count).
    a, b = small_ns(), small_ns(tenant="b")
    t = open_tier()
    t.register(a)
    t.register(b)
    ka, kb = chain(a, 4), chain(b, 7)
    t.put(a, ka, rows(a, ka))
    t.put(b, kb, rows(b, kb))
    other = small_ns(tenant="c").fingerprint  # never written
    assert t.namespace_blocks([a.fingerprint, b.fingerprint, other]) == {
        a.fingerprint: 4, b.fingerprint: 7, other: 0,
    }
    used = sum(c.used_blocks for c in t.stats().size_classes)
    assert used == 11 and t.stats().used_bytes == 11 * t.block_footprint(a.block_bytes)
    assert t.block_footprint(a.block_bytes) > a.block_bytes  # the header, aligned
    t.delete_namespace(a)
    assert t.namespace_blocks([a.fingerprint]) == {a.fingerprint: 0}


def test_block_too_big_for_a_slab(open_tier) -> None:
    t = open_tier()
    with pytest.raises(SSDConfigError):
        t.register(small_ns(head_dim=4096))  # 1 MiB blocks vs 256 KiB slabs


def takes_o_direct(directory: Path) -> bool:
    """An aligned O_DIRECT write, tried here, independently of the tier's own probe."""
    path = directory / "o-direct-probe"
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    except OSError:
        return False
    page = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
    try:
        return os.write(fd, page) == 4096
    except OSError:
        return False
    finally:
        os.close(fd)
        page.close()
        path.unlink()


def test_stats_says_backend_and_direct_io(open_tier, backend: str, tmp_path: Path) -> None:
    t = open_tier()
    info = t.stats().info
    assert info["io_backend"] == backend
    assert info["direct_io"] == ("on" if takes_o_direct(tmp_path) else "off")
    assert t.stats().counters["degraded"] == 0


def test_buffered_fallback_roundtrip(open_tier) -> None:
    ns = small_ns()
    t = open_tier(direct_io=False)
    t.register(ns)
    keys = chain(ns, 7)
    t.put(ns, keys, rows(ns, keys))
    assert t.stats().info["direct_io"] == "off"
    assert "fdatasync" in t.stats().info["durability"]
    assert verify_all(t, ns) == 7


def test_payload_is_exact_per_key(open_tier) -> None:
    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 3)
    t.put(ns, keys, rows(ns, keys))
    dst = bytearray(ns.block_bytes)
    assert t.get_into(ns, [keys[1]], dst) == 1
    assert bytes(dst) == payload_for(ns, keys[1])


@pytest.mark.parametrize("qd", [1, 4])
def test_batches_larger_than_staging_and_queue(open_tier, qd: int) -> None:
    """200 blocks with a 256 KiB staging limit: 4 group commits and 4 read batches, each
    deeper than the queue."""
    ns = small_ns()
    t = open_tier(staging_max_bytes=256 << 10, queue_depth=qd)
    t.register(ns)
    keys = chain(ns, 200)
    assert t.put(ns, keys, rows(ns, keys)).inserted == 200
    dst = bytearray(200 * ns.block_bytes)
    assert t.get_into(ns, keys, dst) == 200 and bytes(dst) == rows(ns, keys)
    t.close()
    t = open_tier(staging_max_bytes=256 << 10, queue_depth=qd)
    t.register(ns)
    assert verify_all(t, ns) == 200
    t.check_integrity()


def test_close_waits_for_calls_in_flight(open_tier) -> None:
    import threading
    import time

    ns = small_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 50)
    t.put(ns, keys, rows(ns, keys))
    results: list[object] = []

    reading = threading.Event()

    def reader() -> None:
        # Reads until the close reaches it (issue 14, item 11: a reader that could finish
        # before the close made "closed" and "done" both pass, so nothing was raced).
        dst = bytearray(50 * ns.block_bytes)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                n = t.get_into(ns, keys, dst)
            except StoreUnavailable:
                results.append("closed")
                return
            finally:
                reading.set()
            if bytes(dst[: n * ns.block_bytes]) != rows(ns, keys[:n]):
                results.append("wrong bytes")
                return
        results.append("never closed")

    th = threading.Thread(target=reader)
    th.start()
    assert reading.wait(30)
    t.close()
    th.join()
    assert results == ["closed"]
