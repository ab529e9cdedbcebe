"""Verified row copies (kvstore/row_copy.py): what passes is exactly what was copied
intact, on one thread and shared with the helper thread, for the native copier
(kvstore/_rowcopy.c) and the Python fallback."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore import row_copy
from kvstore.errors import InvalidArgument
from kvstore.row_copy import (
    NativeRowCopier,
    RowCopier,
    SerialRowCopier,
    SharedRowCopier,
    make_row_copier,
)


def copiers(chunk_bytes: int = 4096) -> list[RowCopier]:
    # share_min_bytes=0: every call with two rows or more is offered to the helper.
    return [
        SerialRowCopier(),
        SharedRowCopier(share_min_bytes=0),
        NativeRowCopier(1, chunk_bytes=chunk_bytes),
        NativeRowCopier(2, chunk_bytes=chunk_bytes, share_min_bytes=0),
        NativeRowCopier(2, chunk_bytes=chunk_bytes, share_min_bytes=0, split_rows=False),
    ]


COPIER_IDS = ["serial", "shared", "native-1", "native-2", "native-2-whole-rows"]


def test_the_native_copier_is_built_and_is_the_default_here() -> None:
    # A broken build or import must fail here, not fall back quietly (the fallback is
    # for machines that cannot compile it, and those are not where tests run).
    assert row_copy._NATIVE_ERROR is None, (
        f"kvstore._rowcopy did not load: {row_copy._NATIVE_ERROR}"
    )
    for threads in (1, 2):
        c = make_row_copier(threads)
        assert isinstance(c, NativeRowCopier) and c.threads == threads
        c.close()
    assert isinstance(make_row_copier(2, kind="python"), SharedRowCopier)


def test_without_the_native_module_auto_falls_back_and_native_refuses(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(row_copy, "_rowcopy", None)
    monkeypatch.setattr(row_copy, "_NATIVE_ERROR", ImportError("not built"))
    with caplog.at_level(logging.WARNING, logger="kvstore.row_copy"):
        assert isinstance(make_row_copier(1), SerialRowCopier)
    assert "native row copier unavailable" in caplog.text
    with pytest.raises(ImportError, match="not built"):
        make_row_copier(1, kind="native")
    with pytest.raises(InvalidArgument):
        make_row_copier(1, kind="fast")


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


@settings(max_examples=80, deadline=None)
@given(reads(), st.sampled_from([64, 4096, 5000, 65536]))
def test_the_passing_prefix_is_the_intact_copies(read, chunk_bytes: int) -> None:
    # Rows of 40,000 bytes are not a multiple of any chunk: the last chunk is short.
    raw, bb, picks, damaged, at = read
    offsets = [p * bb for p in picks]
    sums = [xxhash.xxh3_64_intdigest(raw[o : o + bb]) for o in offsets]
    src = bytearray(raw)
    if damaged is not None:
        src[offsets[damaged] + at] ^= 0x01  # after its checksum: the copy must fail
    # A row read twice is damaged in both reads: the first of them ends the prefix.
    expect = len(picks) if damaged is None else offsets.index(offsets[damaged])
    for copier in copiers(chunk_bytes):
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


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
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
    assert isinstance(make_row_copier(1, kind="python"), SerialRowCopier)
    assert isinstance(make_row_copier(2, kind="python"), SharedRowCopier)
    with pytest.raises(InvalidArgument):
        make_row_copier(3)


def _rows(n: int, bb: int, seed: int) -> tuple[bytearray, list[int], list[int]]:
    src = bytearray(np.random.default_rng(seed).integers(0, 256, n * bb, dtype=np.uint8).tobytes())
    offsets = [r * bb for r in np.random.default_rng(seed).permutation(n).tolist()]
    return src, offsets, [xxhash.xxh3_64_intdigest(src[o : o + bb]) for o in offsets]


def test_the_native_helper_takes_rows_and_its_copies_are_checked_too() -> None:
    # Calls are repeated until the helper has done rows (it wakes on the first call and
    # then spins between calls; a few calls here, but the bound is far off so a loaded
    # machine cannot fail it); every call's copy and count are checked, whoever did it.
    bb, n = 64 << 10, 32
    src, offsets, sums = _rows(n, bb, seed=5)
    copier = NativeRowCopier(2, chunk_bytes=4096, share_min_bytes=0)
    try:
        for call in range(50_000):
            bad = call % n
            src[offsets[bad] + (call * 7919) % bb] ^= 0x10  # after its checksum was made
            dst = bytearray(n * bb)
            got = copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums)
            src[offsets[bad] + (call * 7919) % bb] ^= 0x10
            assert got == bad
            for r in range(got):
                assert dst[r * bb : (r + 1) * bb] == src[offsets[r] : offsets[r] + bb]
            if copier.stats()["helper_rows"] > 0 and call >= n:
                break
        assert copier.stats()["helper_rows"] > 0, "the helper never took a row"
        assert copier.shared_calls == call + 1
    finally:
        copier.close()
    assert copier.stats()["helper_running"] == 0
    # After close, calls still work (the helper starts again).
    dst = bytearray(n * bb)
    assert copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) == n
    copier.close()


def test_native_calls_from_two_threads_on_one_copier_do_not_mix() -> None:
    bb, n = 16 << 10, 64
    copier = NativeRowCopier(2, share_min_bytes=0)
    errors: list[str] = []

    def reader(seed: int) -> None:
        src, offsets, sums = _rows(n, bb, seed)
        for _ in range(50):
            dst = bytearray(n * bb)
            if copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) != n:
                errors.append(f"seed {seed}: a good row failed")
            elif any(dst[r * bb : (r + 1) * bb] != src[o : o + bb] for r, o in enumerate(offsets)):
                errors.append(f"seed {seed}: wrong bytes")

    threads = [threading.Thread(target=reader, args=(s,)) for s in (11, 12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    copier.close()
    assert errors == []


def test_a_forked_child_gets_its_own_helper() -> None:
    bb, n = 64 << 10, 16
    src, offsets, sums = _rows(n, bb, seed=9)
    copier = NativeRowCopier(2, share_min_bytes=0)
    dst = bytearray(n * bb)
    assert copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) == n
    pid = os.fork()
    if pid == 0:  # the child: the parent's helper thread did not come along
        ok = True
        for _ in range(20):
            dst = bytearray(n * bb)
            got = copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums)
            ok = (
                ok
                and got == n
                and all(
                    dst[r * bb : (r + 1) * bb] == src[o : o + bb] for r, o in enumerate(offsets)
                )
            )
        copier.close()
        os._exit(0 if ok and copier.stats()["helper_running"] == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) == n
    copier.close()


@pytest.mark.parametrize("copier", copiers(), ids=COPIER_IDS)
def test_during_runs_once_per_call_and_its_error_comes_after_the_copy(copier: RowCopier) -> None:
    bb, n = 64 << 10, 16  # 1 MiB: shared by the two-thread copiers
    src, offsets, sums = _rows(n, bb, seed=13)
    calls: list[int] = []
    dst = bytearray(n * bb)
    got = copier.copy_verified(
        memoryview(src), offsets, memoryview(dst), bb, sums, lambda: calls.append(1)
    )
    assert got == n and calls == [1]

    def fail() -> None:
        raise KeyError("bookkeeping failed")

    with pytest.raises(KeyError, match="bookkeeping failed"):
        copier.copy_verified(
            memoryview(src), offsets, memoryview(bytearray(n * bb)), bb, sums, fail
        )
    # The copier is free again: the next call runs (a held lock or helper would hang it).
    dst = bytearray(n * bb)
    assert copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) == n
    assert all(dst[r * bb : (r + 1) * bb] == src[o : o + bb] for r, o in enumerate(offsets))
    copier.close()


def test_the_last_chunks_of_a_row_copied_by_the_other_thread_are_checked_too() -> None:
    # A thread out of rows copies the last chunks of the row the other thread is on; that
    # thread hashes them, in order, from the destination, once they are copied. Damage in
    # those last chunks must fail the row exactly as damage anywhere else. Calls repeat
    # until chunks were taken (the bound is far off so a loaded machine cannot fail it);
    # every call is checked.
    bb, n, chunk = 64 << 10, 6, 4096
    src, offsets, sums = _rows(n, bb, seed=21)
    copier = NativeRowCopier(2, chunk_bytes=chunk, share_min_bytes=0)
    try:
        for call in range(50_000):
            bad = (call * 5) % (n + 1)  # n: no damage
            at = bb - 1 - (call * 131) % (4 * chunk)  # in the row's last four chunks
            if bad < n:
                src[offsets[bad] + at] ^= 0x02
            dst = bytearray(n * bb)
            got = copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums)
            if bad < n:
                src[offsets[bad] + at] ^= 0x02
            assert got == (bad if bad < n else n)
            for r in range(got):
                assert dst[r * bb : (r + 1) * bb] == src[offsets[r] : offsets[r] + bb]
            if copier.stats()["split_chunks"] > 0 and call >= 2 * n:
                break
        assert copier.stats()["split_chunks"] > 0, "no thread ever took another's chunks"
    finally:
        copier.close()


def test_whole_rows_only_when_splitting_is_off() -> None:
    bb, n = 64 << 10, 8
    src, offsets, sums = _rows(n, bb, seed=27)
    copier = NativeRowCopier(2, chunk_bytes=4096, share_min_bytes=0, split_rows=False)
    for _ in range(200):
        dst = bytearray(n * bb)
        assert copier.copy_verified(memoryview(src), offsets, memoryview(dst), bb, sums) == n
    assert copier.stats()["split_chunks"] == 0
    copier.close()
