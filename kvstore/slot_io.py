"""Positioned slot I/O shared by the tiers that keep blocks in slots of large files (the
SSD engine's slabs, the shared-FS tier's segments): the request, the loop that makes a
transfer whole, and what a verified prefix read returns.

Backends report per request the bytes moved or a negative errno, never raise for one
failed request: the tier decides what a failed block means (a miss, a drop, degraded
mode) without unwinding a half-done batch.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvstore.errors import BlockError


@dataclass(frozen=True, slots=True)
class IORequest:
    """One positioned transfer of ``buf`` then each of ``more`` (scatter/gather: the
    shared-FS tier reads a slot's header into staging and its payload straight into the
    caller's row). With O_DIRECT, ``offset`` and the total length are multiples of 4 KiB
    and the memory is whatever the backend accepts (page-aligned staging by default)."""

    fd: int
    offset: int
    buf: memoryview
    more: tuple[memoryview, ...] = ()

    @property
    def nbytes(self) -> int:
        return len(self.buf) + sum(len(b) for b in self.more)


#: ``os.preadv`` or ``os.pwritev``
VectorOp = Callable[[int, list[memoryview], int], int]


def full_transfer(op: VectorOp, r: IORequest) -> int:
    """Run ``op`` until all of ``r`` moved (retrying short transfers and EINTR); returns
    the bytes moved or a negative errno. EOF inside a preallocated file is ``-EIO``: it
    was truncated, or (on a shared file system) is not visible yet."""
    bufs = [r.buf, *r.more] if r.more else [r.buf]
    done, total = 0, sum(len(b) for b in bufs)
    while done < total:
        try:
            n = op(r.fd, _from(bufs, done) if done else bufs, r.offset + done)
        except InterruptedError:
            continue
        except OSError as e:
            return -(e.errno or errno.EIO)
        if n <= 0:
            return -errno.EIO
        done += n
    return total


def _from(bufs: Sequence[memoryview], skip: int) -> list[memoryview]:
    """The buffers after their first ``skip`` bytes."""
    out = []
    for b in bufs:
        if skip >= len(b):
            skip -= len(b)
            continue
        out.append(b[skip:])
        skip = 0
    return out


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
