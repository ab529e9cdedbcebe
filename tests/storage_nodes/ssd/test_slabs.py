"""The SSD and shared-FS tiers' staging buffers (``kvstore.buffers.BufferPool``): page
aligned for O_DIRECT, reused, and on huge pages so a slot's transfer through them is one
contiguous segment for the disk."""

from __future__ import annotations

import pytest

from kvstore.buffers import BufferPool, buffer_address
from tests.huge_pages import huge_kib, thp_advised


def test_staging_is_page_aligned_large_enough_and_reused() -> None:
    pool = BufferPool()
    a = pool.acquire(5000)
    assert len(a) >= 5000 and buffer_address(memoryview(a)) % 4096 == 0
    pool.release(a)
    assert pool.acquire(4096) is a  # the idle buffer serves a smaller request
    b = pool.acquire(3 << 20)  # none idle: a new one, as large as asked
    assert b is not a and len(b) >= 3 << 20


def test_a_closed_pool_keeps_nothing() -> None:
    """The shared-FS backend closes its pool with the backend: a buffer handed back
    afterwards is dropped, not kept for a reuse that will not come."""
    pool = BufferPool()
    a = pool.acquire(4096)
    pool.release(a)
    pool.close()
    assert pool.acquire(4096) is not a
    b = pool.acquire(4096)
    pool.release(b)
    assert pool.acquire(4096) is not b


@pytest.mark.skipif(not thp_advised(), reason="transparent huge pages are off on this kernel")
def test_large_staging_lies_on_huge_pages() -> None:
    """It used to be a shared anonymous mapping (shmem: 4 KiB pages here), which split a
    256 KiB slot read into up to 64 segments."""
    buf = BufferPool().acquire(8 << 20)
    buf[:] = b"\1" * len(buf)  # fault the pages in
    assert huge_kib(buffer_address(memoryview(buf)), len(buf)) >= 2048
