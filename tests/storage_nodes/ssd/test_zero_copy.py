"""Zero-copy slot transfers: payloads of whole pages sit on their own pages in the slot,
and page-aligned caller rows are written from and read into directly (vectored requests:
header page in staging, payload in the caller's row)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import lmdb
import pytest

from kvstore.block import HEADER_BYTES, MAGIC
from storage_nodes.ssd import uring
from storage_nodes.ssd.config import payload_offset_for, slot_bytes_for
from storage_nodes.ssd.errors import SSDFormatError
from storage_nodes.ssd.io_backend import IORequest, _full
from tests.storage_nodes.ssd.helpers import (
    aligned,
    chain,
    paged_ns,
    payload_for,
    rows,
    small_ns,
    verify_all,
)


def test_payloads_of_whole_pages_start_on_the_second_page() -> None:
    assert payload_offset_for(8192) == 4096
    assert payload_offset_for(256 << 10) == 4096
    assert payload_offset_for(2048) == HEADER_BYTES  # packed behind the header, as before
    assert payload_offset_for(4096 + 512) == HEADER_BYTES
    # the paged layout costs no space: header page + payload = header + payload rounded up
    for bb in (4096, 8192, 256 << 10, 2 << 20):
        assert slot_bytes_for(bb) == 4096 + bb


def test_this_liburing_takes_vectored_requests() -> None:
    """The raw-iovec layout check passes on the pinned binding: without it every put and
    get of aligned rows would silently fall back to staging copies."""
    assert uring.RAW_IOVECS


def _slots_of(d: Path, sb: int) -> dict[bytes, bytes]:
    """Every slot in the slab files whose first bytes are a block header, by key."""
    out = {}
    for p in sorted((d / "slabs").glob("slab-*")):
        data = p.read_bytes()
        for off in range(0, len(data), sb):
            if data[off : off + 4] == MAGIC:
                out[data[off + 24 : off + 40]] = data[off : off + sb]
    return out


@pytest.mark.parametrize("zero_copy", [True, False], ids=["aligned-rows", "unaligned-rows"])
def test_paged_slots_on_disk(open_tier, tmp_path: Path, zero_copy: bool) -> None:
    """Both paths write the same slot: header at 0, zero padding, payload at 4096."""
    ns = paged_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 7)
    src = rows(ns, keys)
    # unaligned: 64 bytes off a page boundary, which the direct path refuses
    data = aligned(src) if zero_copy else memoryview(aligned(b"\0" * 64 + src))[64:]
    assert t.put(ns, keys, data).inserted == 7
    slots = _slots_of(tmp_path / "ssd", slot_bytes_for(ns.block_bytes))
    assert set(slots) == set(keys)
    for k in keys:
        s = slots[k]
        assert s[HEADER_BYTES:4096] == bytes(4096 - HEADER_BYTES)
        assert s[4096:] == payload_for(ns, k)
    verify_all(t, ns)


def test_aligned_rows_round_trip_and_stay_unpinned(open_tier) -> None:
    """Reads land in the caller's rows and writes come from them; no caller buffer is
    kept exported (pinned) afterwards, so a caller can unmap it."""
    ns = paged_ns()
    t = open_tier()
    t.register(ns)
    for salt in range(5):
        keys = chain(ns, 9, salt=salt)
        src = aligned(rows(ns, keys))
        assert t.put(ns, keys, src).inserted == 9
        dst = aligned(9 * ns.block_bytes)
        sums: list[int] = []
        assert t.get_into(ns, keys, dst, checksums=sums) == 9
        assert bytes(dst) == rows(ns, keys)
        assert len(sums) == 9
        for view in (src, dst):
            m = view.obj
            view.release()
            m.close()  # BufferError if the backend still held an export of it
    assert t.stats().counters["corrupt_blocks_total"] == 0


def test_direct_read_of_a_corrupt_payload_is_a_counted_quarantined_miss(
    open_tier, tmp_path: Path
) -> None:
    ns = paged_ns()
    t = open_tier()
    t.register(ns)
    keys = chain(ns, 6)
    t.put(ns, keys, aligned(rows(ns, keys)))
    sb = slot_bytes_for(ns.block_bytes)
    for p in sorted((tmp_path / "ssd" / "slabs").glob("slab-*")):
        data = p.read_bytes()
        off = next((o for o in range(0, len(data), sb) if data[o + 24 : o + 40] == keys[3]), None)
        if off is not None:
            fd = os.open(p, os.O_RDWR)
            try:
                at = off + 4096 + 5000
                os.pwrite(fd, bytes([data[at] ^ 0x10]), at)
                os.fsync(fd)
            finally:
                os.close(fd)
            break
    else:
        pytest.fail("slot of key 3 not found")
    dst = aligned(6 * ns.block_bytes)
    assert t.get_into(ns, keys, dst) == 3
    assert bytes(dst[: 3 * ns.block_bytes]) == rows(ns, keys[:3])
    c = t.stats().counters
    assert c["corrupt_blocks_total"] == 1
    assert c["quarantined_slots"] == 1
    assert t.contains(ns, keys) == 3  # the corrupt block left the index
    assert t.get_into(ns, keys[4:], aligned(2 * ns.block_bytes)) == 2


def test_packed_and_paged_namespaces_share_a_tier(open_tier) -> None:
    small, paged = small_ns(), paged_ns()
    t = open_tier()
    t.register(small)
    t.register(paged)
    for ns in (small, paged):
        keys = chain(ns, 10)
        t.put(ns, keys, aligned(rows(ns, keys)))
    t.check_integrity()
    assert verify_all(t, small) == 10
    assert verify_all(t, paged) == 10


def test_an_index_of_the_previous_slot_layout_is_refused(open_tier, tmp_path: Path) -> None:
    t = open_tier()
    t.close()
    env = lmdb.open(str(tmp_path / "ssd" / "index"), max_dbs=16, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"1", db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(SSDFormatError, match="format b'1'"):
        open_tier()


def test_short_vectored_transfers_resume_where_they_stopped() -> None:
    """``pread``'s loop for a two-segment request, against an op that moves at most 3000
    bytes a call (as a signal or a device may cut a transfer short)."""
    file = bytearray(12000)
    head, body = aligned(b"h" * 4096), aligned(b"b" * 5000)

    def pwritev(fd: int, segs: list[memoryview], off: int) -> int:
        data = b"".join(bytes(s) for s in segs)[:3000]
        file[off : off + len(data)] = data
        return len(data)

    assert _full(pwritev, IORequest(0, 1000, body, head=head)) == 9096
    assert file[1000:5096] == b"h" * 4096
    assert file[5096:10096] == b"b" * 5000

    def eof(fd: int, segs: list[memoryview], off: int) -> int:
        return 0 if off >= 5000 else min(3000, 5000 - off)

    assert _full(eof, IORequest(0, 0, body, head=head)) == -errno.EIO
