"""One call's work for the Python row copiers (``kvstore.row_copy``): the rows to copy,
grouped into units of adjacent rows, claimed by whichever thread is free.

``SerialRowCopier`` runs a task on the caller's thread; ``SharedRowCopier`` runs the same
task on the caller and its helper at once. It stands apart from the copiers because it is
the unit of work they share (claiming, copying, checking, reporting the first bad row),
with its own bounds checks before any raw-address copy; the native copier does all of
this in C and never uses it.
"""

from __future__ import annotations

import ctypes
import itertools
import queue
from collections.abc import Sequence

import xxhash

from kvstore.buffers import buffer_address
from kvstore.errors import InvalidArgument

#: Longest single copy: small enough that its rows are still in the core's L2 when they
#: are hashed right after, large enough that per-call Python is a small part of it.
UNIT_BYTES = 512 << 10


class CopyTask:
    """One call's work: units of adjacent rows, claimed by whichever thread is free.

    ``bad[u]`` is the index (within unit ``u``) of its first row whose copy failed, or
    the unit's row count when all passed; ``None`` while unclaimed or in flight.
    """

    __slots__ = (
        "bad",
        "claim",
        "done",
        "dst",
        "error",
        "row_bytes",
        "src",
        "sums",
        "units",
        "view",
    )

    def __init__(
        self,
        src: memoryview,
        src_offsets: Sequence[int],
        dst: memoryview,
        row_bytes: int,
        sums: Sequence[int],
    ) -> None:
        if len(sums) != len(src_offsets):
            raise InvalidArgument(f"{len(sums)} checksums for {len(src_offsets)} rows")
        # memmove takes raw addresses: prove every row lies inside both buffers first.
        if dst.readonly:
            raise InvalidArgument("destination buffer is read-only")
        if len(dst) < len(src_offsets) * row_bytes:
            raise InvalidArgument(f"destination of {len(dst)} bytes for {len(src_offsets)} rows")
        if src_offsets and (min(src_offsets) < 0 or max(src_offsets) + row_bytes > len(src)):
            raise InvalidArgument("a source row lies outside the source buffer")
        self.units = row_units(src_offsets, row_bytes)  # (first row, rows, source offset)
        self.sums = sums
        self.row_bytes = row_bytes
        self.src, self.dst, self.view = buffer_address(src), buffer_address(dst), dst
        self.claim = itertools.count()
        self.bad: list[int | None] = [None] * len(self.units)
        self.done: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.error: BaseException | None = None

    def work(self, h: xxhash.xxh3_64 | None) -> None:
        """Claim and process units until none is left. ``h``: a streaming hasher of this
        thread, whose ``update`` releases the GIL; None = the one-shot function, which is
        faster on one thread but keeps the GIL."""
        units, sums, bb, bad, view = self.units, self.sums, self.row_bytes, self.bad, self.view
        memmove, digest, n = ctypes.memmove, xxhash.xxh3_64_intdigest, len(units)
        u = next(self.claim)
        while u < n:
            first, rows, src_off = units[u]
            memmove(self.dst + first * bb, self.src + src_off, rows * bb)
            fail = rows
            for r in range(rows):
                at = (first + r) * bb
                if h is None:
                    value = digest(view[at : at + bb])
                else:
                    h.reset()
                    h.update(view[at : at + bb])
                    value = h.intdigest()
                if value != sums[first + r]:
                    fail = r
                    break
            bad[u] = fail
            u = next(self.claim)

    def first_bad_row(self) -> int:
        for (first, rows, _), fail in zip(self.units, self.bad, strict=True):
            if fail is None:
                raise AssertionError("a unit was never processed")
            if fail < rows:
                return first + fail
        return len(self.sums)


def row_units(src_offsets: Sequence[int], row_bytes: int) -> list[tuple[int, int, int]]:
    """Runs of rows adjacent in the source (one memmove each), at most ``UNIT_BYTES``."""
    per_unit = max(1, UNIT_BYTES // row_bytes)
    units = []
    n, i = len(src_offsets), 0
    while i < n:
        j = i + 1
        while j < n and j - i < per_unit and src_offsets[j] == src_offsets[j - 1] + row_bytes:
            j += 1
        units.append((i, j - i, src_offsets[i]))
        i = j
    return units
