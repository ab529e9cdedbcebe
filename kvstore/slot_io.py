"""Positioned slot I/O shared by the tiers that keep blocks in slots of large files (the
SSD engine's slabs, the shared-FS tier's segments): the request, the loop that makes a
transfer whole, and what a verified prefix read returns.

Backends report per request the bytes moved or a negative errno, never raise for one
failed request: the tier decides what a failed block means (a miss, a drop, degraded
mode) without unwinding a half-done batch.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvstore.errors import BlockError


@dataclass(frozen=True, slots=True)
class IORequest:
    """One positioned transfer. With O_DIRECT, ``offset`` and the total length are
    multiples of 4 KiB and the memory is what the backend accepts (page-aligned staging
    by default). Vectored: ``head`` (if any) covers the file from ``offset``, then
    ``buf``, then each of ``more`` (a slot's header in staging memory, its payload in the
    caller's row, the slot's padding in staging again)."""

    fd: int
    offset: int
    buf: memoryview
    head: memoryview | None = None
    more: tuple[memoryview, ...] = ()

    @property
    def nbytes(self) -> int:
        n = len(self.buf) + sum(len(b) for b in self.more)
        return n if self.head is None else n + len(self.head)

    def segments(self) -> list[memoryview]:
        segs = [self.buf] if self.head is None else [self.head, self.buf]
        return [*segs, *self.more] if self.more else segs


#: ``os.preadv`` or ``os.pwritev``
VectorOp = Callable[[int, list[memoryview], int], int]


def full_transfer(op: VectorOp, r: IORequest) -> int:
    """Run ``op`` until all of ``r`` moved (retrying short transfers and EINTR); returns
    the bytes moved or a negative errno. EOF inside a preallocated file is ``-EIO``: it
    was truncated, or (on a shared file system) is not visible yet."""
    segs, off, total = r.segments(), r.offset, r.nbytes
    while segs:
        try:
            n = op(r.fd, segs, off)
        except InterruptedError:
            continue
        except OSError as e:
            return -(e.errno or errno.EIO)
        if n <= 0:
            return -errno.EIO
        off += n
        while segs and n >= len(segs[0]):  # a short transfer resumes where it stopped
            n -= len(segs[0])
            segs.pop(0)
        if n:
            segs[0] = segs[0][n:]
    return total


@dataclass(frozen=True, slots=True)
class ReadFailure:
    """Why block ``index`` of a read was not returned: an errno (``ENOENT``: the file is
    gone) or a failed check. ``loc`` is where the tier looked (its own location type)."""

    index: int
    loc: Any
    errno: int = 0
    error: BlockError | None = None
    in_copy: bool = False  # the slot is sound; the copy in the destination was not


@dataclass(frozen=True, slots=True)
class ReadOutcome:
    """A prefix read: ``copied`` verified blocks, then why the next one was not."""

    copied: int
    failure: ReadFailure | None = None
    checksums: list[int] = field(default_factory=list)  # stored, one per copied block
