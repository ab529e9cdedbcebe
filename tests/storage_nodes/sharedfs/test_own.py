"""OwnSpace.evict_batch: approximate LRU within a window, as few segments as possible."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as hs

from storage_nodes.sharedfs.own import OwnBlock, OwnSpace


def _space(slots_per_seg: int, segs: int, placement: list[int]) -> tuple[OwnSpace, list[bytes]]:
    """Blocks inserted in LRU order (oldest first) into the segments ``placement`` says."""
    own = OwnSpace("t", b"f" * 16, 4096, 4096, slots_per_seg)
    for s in range(segs):
        own.add_segment(s)
    keys = []
    for seq, seg in enumerate(placement):
        slot = next(sl for sg, sl in reversed(own.free) if sg == seg)
        own.free.remove((seg, slot))
        key = seq.to_bytes(16, "big")
        own.insert(key, OwnBlock(seg, slot, 0, seq))
        keys.append(key)
    return own, keys


@settings(max_examples=200, deadline=None)
@given(data=hs.data(), segs=hs.integers(1, 6), per=hs.integers(1, 12),
       n=hs.integers(1, 20), window=hs.integers(1, 60))
def test_evict_batch_takes_the_oldest_segments_first_within_the_window(
        data: hs.DataObject, segs: int, per: int, n: int, window: int) -> None:
    capacity = segs * per
    count = data.draw(hs.integers(0, capacity))
    placement = data.draw(hs.lists(hs.integers(0, segs - 1), min_size=count, max_size=count))
    # keep within each segment's slots
    used = dict.fromkeys(range(segs), 0)
    fit = []
    for s in placement:
        if used[s] < per:
            used[s] += 1
            fit.append(s)
    own, keys = _space(per, segs, fit)
    seg_of = dict(zip(keys, fit, strict=True))
    got = own.evict_batch(n, window)
    considered = keys[: max(window, n)]
    assert len(got) == min(n, len(keys))
    taken = [k for k, _ in got]
    assert len(set(taken)) == len(taken)
    assert set(taken) <= set(considered)  # never beyond the window
    assert all(k not in own.lru for k in taken)
    # the segment of the oldest block goes first, and a segment is only left with
    # candidates when the batch is full
    order: list[int] = []
    for k in considered:
        if seg_of[k] not in order:
            order.append(seg_of[k])
    expect: list[bytes] = []
    for s in order:
        expect += [k for k in considered if seg_of[k] == s][: n - len(expect)]
        if len(expect) == n:
            break
    assert taken == expect
    for _, b in got:  # reserved for the put, then released: the accounting holds
        own.unreserve(b.seg, b.slot, still_free=True)
    own.check()


def test_evict_batch_of_a_put_lands_in_one_segment_when_the_window_allows() -> None:
    # 4 segments of 8 slots, the LRU order interleaving them: strict LRU victims of a
    # put of 4 would lie in 4 segments, one sync each.
    own, keys = _space(8, 4, [i % 4 for i in range(32)])
    got = own.evict_batch(4, 32)
    assert {b.seg for _, b in got} == {0}
    assert [k for k, _ in got] == [keys[0], keys[4], keys[8], keys[12]]
    strict, _ = _space(8, 4, [i % 4 for i in range(32)])
    assert {b.seg for _, b in strict.evict_batch(4, 4)} == {0, 1, 2, 3}
