"""Views over caller buffers: ``bytes``-likes, numpy arrays and CPU torch tensors.

The store moves raw bytes; the engine hands it torch tensors. Everything is reduced
to a flat ``memoryview`` of unsigned bytes once, at the API boundary, with the size
checked there so no tier ever sees a short buffer.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
import threading
from typing import Any, NamedTuple

import numpy as np

from kvstore.errors import BufferSizeError, InvalidArgument


def _check_tensor(buf: Any) -> None:
    """A tensor the store can read or write as plain bytes: in host memory, contiguous."""
    if not buf.is_cpu:
        raise InvalidArgument("the store reads and writes host memory: pass a CPU tensor")
    if not buf.is_contiguous():
        raise InvalidArgument("tensor buffers must be contiguous")


def _check_rows(nbytes: int, n_rows: int, row_bytes: int) -> None:
    if nbytes != n_rows * row_bytes:
        raise BufferSizeError(
            f"buffer of {nbytes} bytes, expected {n_rows} x {row_bytes} = {n_rows * row_bytes}"
        )


def byte_view(buf: Any, *, writable: bool = False) -> memoryview:
    """A flat ``memoryview`` of unsigned bytes over ``buf`` (no copy)."""
    if hasattr(buf, "detach") and hasattr(buf, "is_contiguous"):  # torch.Tensor
        _check_tensor(buf)
        import torch

        # Each step only where needed: on a DRAM read this view is a part of the tier's
        # per-call Python (detach and view cost ~1 µs together).
        if buf.requires_grad:
            buf = buf.detach()
        if buf.dtype is not torch.uint8:
            buf = buf.view(torch.uint8)
        buf = buf.numpy() if buf.numel() else np.empty(0, np.uint8)
    try:
        mv = memoryview(buf)
    except TypeError:
        raise InvalidArgument(f"expected a buffer, got {type(buf).__name__}") from None
    if not mv.contiguous:
        raise InvalidArgument("buffers must be contiguous")
    if writable and mv.readonly:
        raise InvalidArgument("destination buffer is read-only")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def rows_view(buf: Any, n_rows: int, row_bytes: int, *, writable: bool = False) -> memoryview:
    """``byte_view`` that must hold exactly ``n_rows × row_bytes`` bytes."""
    mv = byte_view(buf, writable=writable)
    _check_rows(len(mv), n_rows, row_bytes)
    return mv


class AddressedRows(NamedTuple):
    """A writable destination given by where it lies: a CPU tensor's memory, as the
    native row copier takes it (exporting a numpy view costs ~1 µs of a DRAM read, a
    measurable part of its per-call Python). ``owner`` keeps the memory alive while this
    is held; ``view()`` is the same memory as a ``memoryview`` (for Python code paths)."""

    address: int
    nbytes: int
    owner: Any

    def view(self) -> memoryview:
        if self.nbytes == 0:
            return memoryview(bytearray())
        return memoryview((ctypes.c_ubyte * self.nbytes).from_address(self.address)).cast("B")


def writable_rows(buf: Any, n_rows: int, row_bytes: int) -> memoryview | AddressedRows:
    """``rows_view(buf, ..., writable=True)``, except that a CPU tensor is given by its
    address (same checks: on the CPU, contiguous, exactly ``n_rows × row_bytes`` bytes)."""
    torch = sys.modules.get("torch")  # not imported: not a tensor
    if (
        torch is None
        or type(buf) is not torch.Tensor  # subclasses may override what is read here
        or buf.layout is not torch.strided
        or buf.dtype.is_complex  # a conjugate view's memory is not its values
    ):
        return rows_view(buf, n_rows, row_bytes, writable=True)
    _check_tensor(buf)
    _check_rows(buf.nbytes, n_rows, row_bytes)
    return AddressedRows(buf.data_ptr(), buf.nbytes, buf)


def as_view(buf: memoryview | AddressedRows) -> memoryview:
    return buf.view() if isinstance(buf, AddressedRows) else buf


def block_view(buf: Any, block_bytes: int) -> memoryview:
    """One block's payload; must be exactly ``block_bytes``."""
    return rows_view(buf, 1, block_bytes)


def buffer_address(buf: memoryview) -> int:
    """Where ``buf``'s first byte lies in memory (read-only buffers too): what native
    calls (memmove, io_uring iovecs) are given."""
    try:
        # ctypes' view of a writable buffer costs ~0.2 µs against ~1.7 µs for numpy's
        # array interface, and a batch of 32 slots asks ~65 times; the view (and its
        # export of ``buf``) is dropped before this returns
        return ctypes.addressof(ctypes.c_char.from_buffer(buf))
    except (TypeError, ValueError):  # read-only or empty
        return int(np.frombuffer(buf, np.uint8).__array_interface__["data"][0])


#: below this a buffer cannot hold one huge page, so it is not advised
HUGE_PAGE_BYTES = 2 << 20


def io_buffer(nbytes: int) -> mmap.mmap:
    """At least ``nbytes`` of zeroed, page-aligned memory for block I/O (O_DIRECT
    staging, rows a disk reads into or writes from), on transparent huge pages where the
    kernel gives them; from 2 MiB up, whole huge pages (the length rounded up).

    Why huge pages: a block device is handed a request's memory as physically contiguous
    segments, and 4 KiB pages come from the page allocator in no particular order — a
    256 KiB read into them took 9 to 64 segments here. The virtual disk of these machines
    moves each segment on its own: reads into such rows ran at 1.5–2.8 GB/s by buffer
    (the more segments, the slower), into huge pages (one segment) at 3.0–3.2 GB/s, and
    fio likewise at 1.9–2.5 against 3.7–3.8 GB/s with huge-page buffers
    (bench/RESULTS.md, SSD, stop 22). The mapping is private: shared anonymous memory is
    shmem, which gets huge pages only where ``shmem_enabled`` allows (``never`` here)."""
    size = max(nbytes, 1)
    if size >= HUGE_PAGE_BYTES:
        # whole huge pages: the kernel then places the mapping on a huge-page boundary
        # (8 MiB + 4 KiB started 4 KiB short of one here, so its first row straddled a
        # 4 KiB page and a huge page: two segments)
        size = -(-size // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if size >= HUGE_PAGE_BYTES and hasattr(mmap, "MADV_HUGEPAGE"):
        # THP compiled out or refused: 4 KiB pages, slower on such a disk, still correct
        with contextlib.suppress(OSError):
            m.madvise(mmap.MADV_HUGEPAGE)
    return m


class BufferPool:
    """``io_buffer`` mappings for block I/O, reused between calls: the SSD tier's and the
    shared-FS tier's staging.

    Buffers are never unmapped while the pool is open: the io_uring binding pins every
    buffer it is handed (``storage_nodes.ssd.uring_iovecs.IovecCache``), so a dropped
    buffer would only leak. Their number is bounded by the calls in flight at once, times
    the distinct power-of-two sizes asked for (at least 1 MiB each)."""

    def __init__(self) -> None:
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self, nbytes: int) -> mmap.mmap:
        """An idle buffer of at least ``nbytes``, or a new one."""
        with self._lock:
            for i, m in enumerate(self._idle):
                if len(m) >= nbytes:
                    return self._idle.pop(i)
        return io_buffer(max(1 << 20, 1 << (max(nbytes, 1) - 1).bit_length()))

    def release(self, m: mmap.mmap) -> None:
        """Hand ``m`` back for reuse (dropped once the pool is closed)."""
        with self._lock:
            if not self._closed:
                self._idle.append(m)
                self._idle.sort(key=len)

    def close(self) -> None:
        """Drop the idle buffers; later releases are dropped too."""
        with self._lock:
            self._closed = True
            self._idle.clear()
