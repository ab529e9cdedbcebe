"""The client-side range allocator of the staging segment."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from clients.shm import ALIGN, RangeAllocator


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=80))
def test_allocations_never_overlap_and_free_space_coalesces(ops: list[tuple[bool, int]]) -> None:
    a = RangeAllocator(64 * 1024)
    live: dict[int, int] = {}
    for is_alloc, n in ops:
        if is_alloc or not live:
            off = a.alloc(n)
            if off is None:
                assert (
                    sum(-(-v // ALIGN) * ALIGN for v in live.values()) + n
                    > a.size - ALIGN * len(live) - 4096
                )
                continue
            assert off % ALIGN == 0 and off + n <= a.size
            for o, m in live.items():
                assert off + n <= o or o + m <= off
            live[off] = n
        else:
            off = sorted(live)[n % len(live)]
            a.free(off)
            del live[off]
        a.check_integrity()
    for off in list(live):
        a.free(off)
    a.check_integrity()
    assert a.used_bytes == 0 and a.alloc(a.size) == 0
