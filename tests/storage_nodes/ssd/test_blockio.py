"""``blockio``'s lazily built read batch: request ``j`` is exactly the slot read the eager
loop built (file, offset, header page in staging, payload in its row), made once."""

from __future__ import annotations

import mmap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.buffers import buffer_address
from storage_nodes.ssd.config import ALIGN_BYTES
from storage_nodes.ssd.index import Location
from storage_nodes.ssd.slot_reads import SlotReads

BB = 8192  # whole pages: the payload may be a row of the caller's own
SB = BB + ALIGN_BYTES


@given(
    slots=st.lists(st.integers(0, 1000), min_size=1, max_size=12),
    start=st.integers(0, 3),
    direct=st.booleans(),
)
def test_each_request_is_its_slots_read(slots: list[int], start: int, direct: bool) -> None:
    n = len(slots)
    part = [Location(slab=s % 3, slot=s, bucket=0, seq=0, gen=1) for s in slots]
    fds = [100 + loc.slab for loc in part]
    stage = ALIGN_BYTES if direct else SB
    staging = memoryview(mmap.mmap(-1, n * stage))
    out = memoryview(mmap.mmap(-1, (start + n) * BB))
    reqs = SlotReads(part, fds, SB, staging, stage, out, BB, start, direct)
    assert len(reqs) == n
    for j in reversed(range(n)):  # any order of asking gives the same requests
        r = reqs[j]
        assert (r.fd, r.offset) == (fds[j], slots[j] * SB)
        if direct:
            assert r.head is not None and len(r.head) == ALIGN_BYTES
            assert buffer_address(r.head) == buffer_address(staging) + j * ALIGN_BYTES
            assert buffer_address(r.buf) == buffer_address(out) + (start + j) * BB
            assert len(r.buf) == BB and r.nbytes == SB
        else:
            assert r.head is None and len(r.buf) == SB
            assert buffer_address(r.buf) == buffer_address(staging) + j * SB
        assert reqs[j] is r  # built once
        assert reqs[j - n] is r
    assert reqs[1:] == [reqs[j] for j in range(1, n)]
    assert list(reqs) == [reqs[j] for j in range(n)]
    with pytest.raises(IndexError):
        reqs[n]
    with pytest.raises(IndexError):
        reqs[-n - 1]
