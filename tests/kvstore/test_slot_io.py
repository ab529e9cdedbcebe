"""The shared full-transfer loop (``kvstore.slot_io``) on a real file: whole requests move
through any split into buffers and any sequence of short transfers; failures are errnos."""

from __future__ import annotations

import errno
import itertools
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.slot_io import IORequest, full_transfer

TOTAL = 3 * 4096


def _capped(op, caps: list[int]):  # type: ignore[no-untyped-def]
    """``op`` that moves at most the next cap's bytes per call (a short transfer), as a
    signal or a FUSE server may leave it; 0 caps let it move the rest."""
    left = list(caps)

    def run(fd: int, bufs: list[memoryview], off: int) -> int:
        cap = left.pop(0) if left else 0
        if cap:
            kept, room = [], cap
            for b in bufs:
                if room <= 0:
                    break
                kept.append(b[:room])
                room -= len(kept[-1])
            bufs = kept
        return op(fd, bufs, off)

    return run


def _split(mv: memoryview, cuts: list[int]) -> list[memoryview]:
    points = sorted({c % len(mv) for c in cuts} | {0, len(mv)})
    return [mv[a:b] for a, b in itertools.pairwise(points) if b > a]


def _vectored(fd: int, off: int, parts: list[memoryview]) -> IORequest:
    """``head``, ``buf``, ``more`` from the parts, in every shape a request can take."""
    if len(parts) == 1:
        return IORequest(fd, off, parts[0])
    if len(parts) == 2:
        return IORequest(fd, off, parts[1], head=parts[0])
    return IORequest(fd, off, parts[1], head=parts[0], more=tuple(parts[2:]))


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(1, TOTAL - 1), max_size=5),
       caps=st.lists(st.integers(1, TOTAL), max_size=6),
       offset_pages=st.integers(0, 3))
def test_any_split_and_any_short_transfers_move_the_whole_request(
        tmp_path_factory, cuts, caps, offset_pages) -> None:
    path = tmp_path_factory.mktemp("slot-io") / "f"
    data = os.urandom(TOTAL)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 8 * 4096)
        parts = _split(memoryview(bytearray(data)), cuts)
        off = offset_pages * 4096
        w = _vectored(fd, off, parts)
        assert w.nbytes == TOTAL
        assert full_transfer(_capped(os.pwritev, caps), w) == TOTAL
        assert os.pread(fd, TOTAL, off) == data
        back = bytearray(TOTAL)
        rparts = _split(memoryview(back), cuts[::-1])
        r = _vectored(fd, off, rparts)
        assert full_transfer(_capped(os.preadv, caps), r) == TOTAL
        assert bytes(back) == data
    finally:
        os.close(fd)


def test_eof_inside_the_file_and_os_errors_are_negative_errnos(tmp_path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = memoryview(bytearray(8192))
        assert full_transfer(os.preadv, IORequest(fd, 0, buf[4096:], head=buf[:4096])) == -errno.EIO
        assert full_transfer(os.pwritev, IORequest(fd, 0, buf)) == -errno.EBADF
    finally:
        os.close(fd)
    assert full_transfer(os.preadv, IORequest(fd, 0, buf)) == -errno.EBADF
