"""Verified row copies (kvstore/row_copy.py): what passes is exactly what was copied
intact, on one thread and shared with the helper thread."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import InvalidArgument
from kvstore.row_copy import (
    UNIT_BYTES,
    RowCopier,
    SerialRowCopier,
    SharedRowCopier,
    _units,
    make_row_copier,
)


def copiers() -> list[RowCopier]:
    # share_min_bytes=0: every call with two rows or more goes through the helper.
    return [SerialRowCopier(), SharedRowCopier(share_min_bytes=0)]


@st.composite
def reads(draw: st.DrawFn) -> tuple[bytes, int, list[int], int | None, int]:
    """A source of ``slots`` rows, a read of some of them (runs and jumps, in any order),
    and optionally one byte of one read row damaged after its checksum was taken."""
    row_bytes = draw(st.sampled_from([1, 7, 64, 240, 241, 4096, 40_000]))
    slots = draw(st.integers(1, 24))
    seed = draw(st.integers(0, 2**32 - 1))
    picks = draw(st.lists(st.integers(0, slots - 1), min_size=0, max_size=20))
    damaged = draw(st.none() | st.integers(0, max(0, len(picks) - 1)))
    at = draw(st.integers(0, row_bytes - 1))
    src = np.random.default_rng(seed).integers(0, 256, slots * row_bytes, dtype=np.uint8)
    return src.tobytes(), row_bytes, picks, (damaged if picks else None), at


@settings(max_examples=60, deadline=None)
@given(reads())
def test_the_passing_prefix_is_the_intact_copies(read) -> None:
    raw, bb, picks, damaged, at = read
    offsets = [p * bb for p in picks]
    sums = [xxhash.xxh3_64_intdigest(raw[o : o + bb]) for o in offsets]
    src = bytearray(raw)
    if damaged is not None:
        src[offsets[damaged] + at] ^= 0x01  # after its checksum: the copy must fail
    # A row read twice is damaged in both reads: the first of them ends the prefix.
    expect = len(picks) if damaged is None else offsets.index(offsets[damaged])
    for copier in copiers():
        dst = bytearray(len(picks) * bb + 3)
        got = copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums)
        assert got == expect
        for r in range(got):
            assert dst[r * bb : (r + 1) * bb] == src[offsets[r] : offsets[r] + bb]
        assert dst[len(picks) * bb :] == b"\0\0\0", "nothing written past the rows"
        copier.close()


def test_a_large_read_is_shared_with_the_helper_and_a_late_flip_still_fails() -> None:
    bb, n = 256 << 10, 12
    src = bytearray(np.random.default_rng(3).integers(0, 256, n * bb, dtype=np.uint8).tobytes())
    offsets = [r * bb for r in range(n)]
    sums = [xxhash.xxh3_64_intdigest(src[o : o + bb]) for o in offsets]
    copier = SharedRowCopier()
    try:
        dst = bytearray(n * bb)
        assert copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) == n
        assert dst == src
        src[9 * bb + bb - 1] ^= 0x80  # last byte of row 9
        assert copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) == 9
        assert copier.shared_calls == 2
    finally:
        copier.close()
    # After close, calls still work (a new helper starts).
    assert copier.copy_verified(memoryview(src), offsets[:9], memoryview(dst), bb, sums[:9]) == 9
    copier.close()


def test_units_are_runs_of_adjacent_rows_capped_in_size() -> None:
    bb = UNIT_BYTES // 4
    offsets = [0, bb, 2 * bb, 3 * bb, 4 * bb, 9 * bb, 8 * bb, 10 * bb]
    assert _units(offsets, bb) == [
        (0, 4, 0),  # capped at UNIT_BYTES
        (4, 1, 4 * bb),
        (5, 1, 9 * bb),  # descending: not adjacent in copy order
        (6, 1, 8 * bb),
        (7, 1, 10 * bb),
    ]
    assert _units([0, 1 << 30], UNIT_BYTES * 2) == [(0, 1, 0), (1, 1, 1 << 30)]


@pytest.mark.parametrize("copier", copiers(), ids=["serial", "shared"])
def test_rows_outside_either_buffer_are_refused_before_any_copy(copier: RowCopier) -> None:
    src, dst = memoryview(bytearray(64)), memoryview(bytearray(64))
    with pytest.raises(InvalidArgument):
        copier.copy_verified(src, [0, 48], dst, 32, [0, 0])  # row 1 ends past the source
    with pytest.raises(InvalidArgument):
        copier.copy_verified(src, [-32, 0], dst, 32, [0, 0])
    with pytest.raises(InvalidArgument):
        copier.copy_verified(src, [0, 32], dst[:48], 32, [0, 0])  # destination too short
    with pytest.raises(InvalidArgument):
        copier.copy_verified(src, [0, 32], memoryview(bytes(64)), 32, [0, 0])  # read-only
    with pytest.raises(InvalidArgument):
        copier.copy_verified(src, [0, 32], dst, 32, [0])
    assert bytes(dst) == bytes(64)
    copier.close()


def test_make_row_copier() -> None:
    assert isinstance(make_row_copier(1), SerialRowCopier)
    assert isinstance(make_row_copier(2), SharedRowCopier)
    with pytest.raises(InvalidArgument):
        make_row_copier(3)
