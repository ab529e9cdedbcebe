"""The commit staging ring: spans never overlap, rows come back in order, and it never
hands out more than it holds (the engine's only bound on commits to a slow store)."""

from __future__ import annotations

from collections import deque

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.connector.commit_staging import CommitStaging
from engine.kv.cache import KVCache, KVCacheShape

SHAPE = KVCacheShape(num_layers=3, num_blocks=4, block_tokens=2, kv_heads=1, head_dim=2,
                     dtype=torch.float32)
ROW_BYTES = 3 * 2 * 2 * 1 * 2 * 4


def staging(rows: int, max_jobs: int = 64) -> CommitStaging:
    return CommitStaging(KVCache(SHAPE, torch.device("cpu")), rows * ROW_BYTES, max_jobs)


def test_rows_are_cut_to_what_fits_and_jobs_are_bounded() -> None:
    ring = staging(10, max_jobs=3)
    a = ring.take(6, 3)
    b = ring.take(6, 3)
    c = ring.take(6, 3)
    assert a is not None and b is not None and c is not None
    assert [len(x[0]) for x in (a, b, c)] == [6, 4, 0]
    assert ring.take(1, 3) is None  # three jobs staged
    ring.give_back(a[1])
    d = ring.take(6, 3)  # the ring's start is free again
    assert d is not None and len(d[0]) == 6 and d[1].start == 0
    ring.check_integrity()


def test_an_empty_span_at_the_wrap_point_does_not_unwrap_the_ring() -> None:
    """Found by the engine's random traffic: an empty span placed where the wrapped ring's
    free room ends made it look unwrapped, and the next span overlapped the oldest."""
    ring = staging(14)
    first = ring.take(6, 3)
    old = ring.take(6, 3)
    assert first is not None and old is not None
    ring.give_back(first[1])  # the oldest live span is rows 6..12, the tail at 12
    wrapped = ring.take(6, 3)  # 2 rows left at the tail: it wraps to rows 0..6
    empty = ring.take(6, 3)  # no room between 6 and 6: empty, at 6
    after = ring.take(1, 3)
    assert wrapped is not None and empty is not None and after is not None
    assert wrapped[1].start == 0 and len(empty[0]) == 0 and len(after[0]) == 0
    ring.check_integrity()


@settings(max_examples=200)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 7), st.integers(1, 3)),
                    max_size=60))
def test_random_fifo_traffic_never_overlaps(ops: list[tuple[bool, int, int]]) -> None:
    ring = staging(16)
    live: deque = deque()
    for take, n, layers in ops:
        if take or not live:
            got = ring.take(n, layers)
            assert got is not None
            rows, span = got
            assert len(rows) <= n and rows.shape[1] == layers
            rows.fill_(float(span.start))  # overwriting another live span would show
            live.append((rows, span))
        else:
            rows, span = live.popleft()
            assert bool((rows == float(span.start)).all())
            ring.give_back(span)
        ring.check_integrity()
    for rows, span in live:
        assert bool((rows == float(span.start)).all())
