"""Reads by key (``RowCopier.copy_found``, kvstore/row_copy.py and kvstore/_rowcopy.c):
the look-up finds exactly the leading keys held for the namespace, their rows come from
the slot the pool layout puts them at, and what passes is exactly what was copied
intact; the native look-up and the Python fallback agree on every input."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.buffers import AddressedRows
from kvstore.dram_pool import slot_offset
from kvstore.errors import InvalidArgument
from kvstore.row_copy import KeyIndex, RowCopier

from .test_row_copy import COPIER_IDS, copiers

FP, OTHER = b"F" * 16, b"O" * 16


@st.composite
def layouts(draw: st.DrawFn) -> dict:
    """A pool of chunks holding slots of one row size (with a gap at each chunk's end
    when the rows do not fill it), an index over some of its slots (some held for another
    namespace), a read of keys (held, foreign, absent) and optionally one byte flipped in
    one stored row after its checksum was made."""
    row_bytes = draw(st.sampled_from([1, 7, 64, 241, 4096, 40_000]))
    per_chunk = draw(st.integers(1, 4))
    chunk_bytes = per_chunk * row_bytes + draw(st.sampled_from([0, 5]))
    chunks = draw(st.integers(1, 4))
    n_slots = chunks * per_chunk
    seed = draw(st.integers(0, 2**32 - 1))
    pool = bytearray(
        np.random.default_rng(seed).integers(0, 256, chunks * chunk_bytes, dtype=np.uint8)
    )
    slots = draw(st.permutations(range(n_slots)))
    n_keys = draw(st.integers(0, n_slots))
    foreign = draw(st.sets(st.integers(0, max(0, n_keys - 1)), max_size=2))
    index = KeyIndex({}, {}, {}, per_chunk, chunk_bytes)
    keys = [i.to_bytes(16, "little") for i in range(n_keys)]
    for i, key in enumerate(keys):
        off = slot_offset(slots[i], per_chunk, chunk_bytes, row_bytes)
        index.owner[key] = OTHER if i in foreign else FP
        index.slots[key] = slots[i]
        index.sums[key] = xxhash.xxh3_64_intdigest(pool[off : off + row_bytes])
    read = draw(st.lists(st.sampled_from([*keys, b"absent"]), max_size=12) if keys else st.just([]))
    flip = draw(st.none() | st.integers(0, len(read) - 1)) if read else None
    at = draw(st.integers(0, row_bytes - 1))
    return dict(pool=pool, index=index, read=read, bb=row_bytes, flip=flip, at=at)


def _destination(kind: str, nbytes: int) -> tuple[bytearray | np.ndarray, object]:
    """A zeroed destination of ``nbytes`` and what copy_found is given for it: a
    memoryview, or the memory's address (as the DRAM tier passes a CPU tensor)."""
    if kind == "view":
        buf = bytearray(nbytes)
        return buf, memoryview(buf)
    arr = np.zeros(nbytes, dtype=np.uint8)
    return arr, AddressedRows(arr.ctypes.data if nbytes else 0, nbytes, arr)


@settings(max_examples=120, deadline=None)
@given(
    layouts(),
    st.sampled_from([64, 4096, 65536]),
    st.sampled_from(["view", "address"]),
    st.booleans(),
)
def test_found_is_the_held_prefix_and_got_the_intact_copies(
    case: dict, chunk: int, kind: str, tight: bool
) -> None:
    # ``tight``: room for the found rows only, not every key (the native copier then
    # looks every key up before it copies; with room for all, it hands rows to the
    # helper as it finds them).
    pool, index, read, bb = case["pool"], case["index"], case["read"], case["bb"]
    flipped_key = None
    if case["flip"] is not None and read[case["flip"]] in index.slots:
        flipped_key = read[case["flip"]]
        off = slot_offset(index.slots[flipped_key], index.slots_per_chunk, index.chunk_bytes, bb)
        pool[off + case["at"]] ^= 0x04  # after its checksum: every copy of it must fail
    found = 0
    while found < len(read) and index.owner.get(read[found]) == FP:
        found += 1
    got = read[:found].index(flipped_key) if flipped_key in read[:found] else found
    rows = found if tight else len(read)
    for copier in copiers(chunk):
        seen: list[int] = []
        dst, given_dst = _destination(kind, rows * bb + 3)
        assert copier.copy_found(memoryview(pool), index, read, FP, given_dst, bb, seen.append) == (
            found,
            got,
        )
        assert seen == [found], "during is called once, with found"
        for r in range(got):
            off = slot_offset(index.slots[read[r]], index.slots_per_chunk, index.chunk_bytes, bb)
            assert bytes(dst[r * bb : (r + 1) * bb]) == pool[off : off + bb]
        assert bytes(dst[rows * bb :]) == b"\0\0\0", "nothing written past the rows"
        copier.close()


def _one_row_pool(bb: int = 64) -> tuple[bytearray, KeyIndex, bytes]:
    pool = bytearray(range(256)) * (2 * bb // 256 + 1)
    key = b"k" * 16
    index = KeyIndex(
        {key: FP}, {key: 1}, {key: xxhash.xxh3_64_intdigest(pool[bb : 2 * bb])}, 2, 2 * bb
    )
    return pool[: 2 * bb], index, key


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_a_slot_outside_the_pool_is_refused_before_any_copy(copier: RowCopier) -> None:
    pool, index, key = _one_row_pool()
    dst = bytearray(64)
    index.slots[key] = 2  # chunk 1: past the pool's one chunk
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(dst), 64)
    index.slots[key] = -1
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(dst), 64)
    assert dst == bytearray(64)
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_an_index_that_disagrees_with_itself_raises(copier: RowCopier) -> None:
    pool, index, key = _one_row_pool()
    del index.sums[key]  # owned but without a checksum: never a silent unchecked read
    with pytest.raises(KeyError):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(bytearray(64)), 64)
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_a_short_or_read_only_destination_is_refused(copier: RowCopier) -> None:
    pool, index, key = _one_row_pool()
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(bytearray(63)), 64)
    with pytest.raises(InvalidArgument):
        copier.copy_found(memoryview(pool), index, [key], FP, memoryview(bytes(64)), 64)
    # A miss needs no room: nothing is copied.
    assert copier.copy_found(
        memoryview(pool), index, [b"absent"], FP, memoryview(bytearray(0)), 64
    ) == (0, 0)
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_a_large_read_by_key_is_shared_and_during_errors_come_after(copier: RowCopier) -> None:
    bb, n = 64 << 10, 16  # 1 MiB: offered to the helper by the two-thread copiers
    rng = np.random.default_rng(17)
    pool = bytearray(rng.integers(0, 256, 2 * n * bb, dtype=np.uint8))
    keys = [i.to_bytes(16, "big") for i in range(n)]
    slots = rng.permutation(2 * n)[:n].tolist()
    index = KeyIndex(dict.fromkeys(keys, FP), dict(zip(keys, slots, strict=True)), {}, 8, 8 * bb)
    for k, s in zip(keys, slots, strict=True):
        index.sums[k] = xxhash.xxh3_64_intdigest(pool[s * bb : (s + 1) * bb])
    dst = bytearray(n * bb)
    assert copier.copy_found(memoryview(pool), index, keys, FP, memoryview(dst), bb) == (n, n)
    assert all(
        dst[r * bb : (r + 1) * bb] == pool[s * bb : (s + 1) * bb] for r, s in enumerate(slots)
    )

    def fail(found: int) -> None:
        raise RuntimeError(f"bookkeeping failed after {found}")

    with pytest.raises(RuntimeError, match="after 16"):
        copier.copy_found(
            memoryview(pool), index, keys, FP, memoryview(bytearray(n * bb)), bb, fail
        )
    # The copier is free again (a held lock or helper would hang this call).
    assert copier.copy_found(memoryview(pool), index, keys, FP, memoryview(dst), bb) == (n, n)
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
@pytest.mark.parametrize("bad", ["outside", "no checksum"])
def test_a_look_up_error_part_way_raises_and_nothing_from_that_key_on_is_written(
    copier: RowCopier, bad: str
) -> None:
    # 8 rows of 64 KiB with room for all (the native copier hands rows to the helper as
    # it finds them): key 5 is broken. The call raises; rows before key 5 may have been
    # copied (they are good rows), nothing from row 5 on is written, and the copier is
    # free again.
    bb, n = 64 << 10, 8
    rng = np.random.default_rng(23)
    pool = bytearray(rng.integers(0, 256, n * bb, dtype=np.uint8))
    keys = [i.to_bytes(16, "big") for i in range(n)]
    index = KeyIndex(dict.fromkeys(keys, FP), dict(zip(keys, range(n), strict=True)), {}, n, n * bb)
    for k, s in zip(keys, range(n), strict=True):
        index.sums[k] = xxhash.xxh3_64_intdigest(pool[s * bb : (s + 1) * bb])
    if bad == "outside":
        index.slots[keys[5]] = n  # past the pool's one chunk
    else:
        del index.sums[keys[5]]
    for _ in range(20):  # the helper may or may not have started on rows: every call
        dst = bytearray(n * bb)
        with pytest.raises(InvalidArgument if bad == "outside" else KeyError):
            copier.copy_found(memoryview(pool), index, keys, FP, memoryview(dst), bb)
        assert dst[5 * bb :] == bytes(3 * bb), "a row from the broken key on was written"
        for r in range(5):
            assert dst[r * bb : (r + 1) * bb] in (bytes(bb), pool[r * bb : (r + 1) * bb])
    dst = bytearray(5 * bb)
    assert copier.copy_found(memoryview(pool), index, keys[:5], FP, memoryview(dst), bb) == (5, 5)
    assert dst == pool[: 5 * bb]
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_an_addressed_destination_is_checked_like_a_buffer(copier: RowCopier) -> None:
    pool, index, key = _one_row_pool()
    arr = np.zeros(64, dtype=np.uint8)
    with pytest.raises(InvalidArgument):  # 63 bytes for a 64-byte row
        copier.copy_found(
            memoryview(pool), index, [key], FP, AddressedRows(arr.ctypes.data, 63, arr), 64
        )
    assert copier.copy_found(
        memoryview(pool), index, [key], FP, AddressedRows(arr.ctypes.data, 64, arr), 64
    ) == (1, 1)
    assert arr.tobytes() == pool[64:128]
    copier.close()


def test_the_native_copier_refuses_a_malformed_address() -> None:
    pool, index, key = _one_row_pool()
    native = copiers()[3]
    for bad in [(0, 64, None), (1, -1, None), ("x", 64, None), (1, 64)]:
        with pytest.raises(InvalidArgument):
            native.copy_found(memoryview(pool), index, [key], FP, bad, 64)  # type: ignore[arg-type]
    native.close()


def test_the_helper_copies_rows_while_the_caller_still_looks_keys_up() -> None:
    # Rows are handed to the helper one by one during the look-up; calls repeat until the
    # helper did rows (bound far off: a loaded machine cannot fail it); each is checked,
    # with a flipped byte in a different row each call.
    bb, n = 64 << 10, 24
    rng = np.random.default_rng(29)
    pool = bytearray(rng.integers(0, 256, n * bb, dtype=np.uint8))
    keys = [i.to_bytes(16, "big") for i in range(n)]
    slots = rng.permutation(n).tolist()
    index = KeyIndex(dict.fromkeys(keys, FP), dict(zip(keys, slots, strict=True)), {}, 4, 4 * bb)
    for k, s in zip(keys, slots, strict=True):
        index.sums[k] = xxhash.xxh3_64_intdigest(pool[s * bb : (s + 1) * bb])
    native = copiers(4096)[3]
    try:
        for call in range(20_000):
            bad = call % (n + 1)  # n: none
            at = slots[bad] * bb + (call * 7919) % bb if bad < n else 0
            if bad < n:
                pool[at] ^= 0x08
            dst = bytearray(n * bb)
            assert native.copy_found(memoryview(pool), index, keys, FP, memoryview(dst), bb) == (
                n,
                bad,
            )
            if bad < n:
                pool[at] ^= 0x08
            for r in range(bad):
                assert dst[r * bb : (r + 1) * bb] == pool[slots[r] * bb : (slots[r] + 1) * bb]
            if native.stats()["helper_rows"] > 0 and call > n:
                break
        assert native.stats()["helper_rows"] > 0, "the helper never took a row"
    finally:
        native.close()
