"""The client side of the same-host fast path (DESIGN §7).

``map_segment`` maps the staging segment a daemon offered and proves the client shares
the daemon's host by finding the daemon's nonce at its start; any failure (another
host, another user, fast path disabled) means the plain gRPC path is used. Inside a
mapped segment, ``RangeAllocator`` hands out byte ranges to concurrent calls.

``Staging.offset_of`` recognises buffers that already live in the segment (from
``Staging.buffer``): the daemon then reads or writes them directly, with no client copy.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import threading
from dataclasses import dataclass

import numpy as np

from kvstore.errors import IntegrityError
from kvstore.wire.proto import kvstore_pb2 as pb

ALIGN = 64


class RangeAllocator:
    """First-fit allocator over ``[0, size)`` with coalescing free ranges; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, size)]  # sorted (start, length)
        self._used: dict[int, int] = {}

    def alloc(self, nbytes: int) -> int | None:
        n = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        with self._lock:
            for i, (start, length) in enumerate(self._free):
                if length >= n:
                    if length == n:
                        del self._free[i]
                    else:
                        self._free[i] = (start + n, length - n)
                    self._used[start] = n
                    return start
        return None

    def free(self, start: int) -> None:
        with self._lock:
            n = self._used.pop(start)
            i = bisect.bisect(self._free, (start, n))
            self._free.insert(i, (start, n))
            # Merge with the right neighbour, then the left one.
            if i + 1 < len(self._free) and start + n == self._free[i + 1][0]:
                n += self._free[i + 1][1]
                self._free[i] = (start, n)
                del self._free[i + 1]
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == start:
                ps, pn = self._free[i - 1]
                self._free[i - 1] = (ps, pn + n)
                del self._free[i]

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._used.values())

    def check_integrity(self) -> None:
        with self._lock:
            spans = sorted([*self._free, *self._used.items()])
            pos = 0
            for start, length in spans:
                if start != pos or length <= 0:
                    raise IntegrityError(f"allocator ranges overlap or leave a gap at {pos}")
                pos = start + length
            if pos != self.size:
                raise IntegrityError(f"allocator covers {pos} of {self.size} bytes")
            for (a, al), (b, _) in zip(self._free, self._free[1:], strict=False):
                if a + al >= b:
                    raise IntegrityError("free ranges not coalesced")


@dataclass
class Staging:
    """A mapped segment: ``view`` is its data area (after the nonce page). ``retired``: a
    call on it went unanswered, so the daemon may still use that call's range; the client
    allocates nothing from it again (``ClientCore._staged_call``)."""

    staging_id: int
    map: mmap.mmap
    view: memoryview
    base_addr: int
    allocator: RangeAllocator
    retired: bool = False

    def rows(self, offset: int, nbytes: int) -> memoryview:
        return self.view[offset : offset + nbytes]

    def buffer(self, nbytes: int) -> tuple[int, np.ndarray] | None:
        """A zero-copy buffer inside the segment: (offset, uint8 array), or None if full.
        Release it with ``allocator.free(offset)``."""
        off = self.allocator.alloc(nbytes)
        if off is None:
            return None
        return off, np.frombuffer(self.view, np.uint8, count=nbytes, offset=off)

    def offset_of(self, mv: memoryview) -> int | None:
        """Offset of ``mv`` in the data area when it lies entirely inside it."""
        if len(mv) == 0:
            return None
        addr = address_of(mv)
        off = addr - self.base_addr
        if off >= 0 and off + len(mv) <= len(self.view):
            return off
        return None

    def close(self) -> None:
        self.view.release()
        # A caller may still hold a buffer() array; the mapping then lives as long as it.
        with contextlib.suppress(BufferError):
            self.map.close()


def address_of(mv: memoryview) -> int:
    return int(np.frombuffer(mv, np.uint8).ctypes.data)


def map_segment(resp: pb.OpenStagingResponse) -> Staging | None:
    """Map the offered segment; None unless its nonce proves we share the daemon's host."""
    try:
        fd = os.open(resp.path, os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != resp.size_bytes:
            return None
        m = mmap.mmap(fd, resp.size_bytes)
    except OSError:
        return None
    finally:
        os.close(fd)
    if m[: len(resp.nonce)] != resp.nonce or not resp.nonce:
        m.close()
        return None
    view = memoryview(m)[resp.data_offset :]
    return Staging(resp.staging_id, m, view, address_of(view), RangeAllocator(len(view)))
