"""Iovecs for the io_uring backend (``uring.py``): the ``liburing`` binding's ``Iovec``
pins every buffer it is given, so cached iovecs name the process's own staging memory
and per-ring raw ones are re-pointed at caller memory for each request."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import liburing as lu

from kvstore.buffers import buffer_address
from storage_nodes.ssd.io_backend import IORequest


class IovecCache:
    """One ``lu.Iovec`` per distinct buffer region, built once and reused.

    liburing's ``Iovec`` takes a reference to (and a buffer export of) every buffer it is
    given and never drops either: measured here, a fresh memoryview per request leaked
    ~190 bytes and kept its whole staging mmap alive. Reusing one Iovec per (address,
    length) bounds what is pinned to the staging buffers, which their
    ``kvstore.buffers.BufferPool`` keeps anyway. The address cannot be reused by another
    mapping: the pinned export keeps the original one mapped.
    """

    def __init__(self) -> None:
        self._iovecs: dict[tuple[int, int], lu.Iovec] = {}
        self._lock = threading.Lock()

    def get(self, buf: memoryview) -> lu.Iovec:
        key = (buffer_address(buf), len(buf))
        iov = self._iovecs.get(key)
        if iov is None:
            with self._lock:
                iov = self._iovecs.get(key)
                if iov is None:
                    iov = self._iovecs[key] = lu.Iovec([buf])
        return iov

    def __len__(self) -> int:
        return len(self._iovecs)


IOVECS = IovecCache()


class RawIovecs:
    """Iovec arrays of one ring that are pointed at caller memory per request.

    ``lu.Iovec`` keeps a buffer export of everything it is given (``_IovecCache``), so it
    cannot name a caller's rows: each call's rows would stay pinned for good. Instead each
    ring owns ``entries`` two-entry ``Iovec`` objects, built once over a dummy buffer, and
    rewrites their C arrays (base, length) per request through ctypes. The layout this
    relies on (``_len`` and the array pointer right after the object header) is checked
    once at import (``RAW_IOVECS``); without it no vectored request is made. An entry is
    held from its request's submission until its completion.
    """

    def __init__(self, entries: int) -> None:
        self._objs = [lu.Iovec([_DUMMY, _DUMMY]) for _ in range(entries)]
        self._heads = [_fields(o) for o in self._objs]
        self._arrays = [(ctypes.c_size_t * 4).from_address(h[1]) for h in self._heads]
        self._free = list(range(entries))
        self._held: dict[int, int] = {}  # request index -> entry

    def prep(
        self, prep_rw: Callable[..., None], sqe: lu.SQE, i: int, r: IORequest, skip: int
    ) -> None:
        """Point a free entry at request ``i``'s segments less their first ``skip`` bytes
        (a short transfer resumed) and prepare ``sqe`` with it."""
        at = r.offset + skip
        segs = r.segments()
        while segs and skip >= len(segs[0]):
            skip -= len(segs.pop(0))
        if skip:
            segs[0] = segs[0][skip:]
        if len(segs) > 2:
            raise ValueError("the io_uring backend takes at most two segments a request")
        k = self._free.pop()
        self._held[i] = k
        arr, head = self._arrays[k], self._heads[k]
        for j, seg in enumerate(segs):
            arr[2 * j] = buffer_address(seg)
            arr[2 * j + 1] = len(seg)
        head[0] = len(segs)
        try:
            prep_rw(sqe, r.fd, self._objs[k], at)
        finally:
            head[0] = 2  # what the binding frees the array with

    def release(self, i: int) -> None:
        self._free.append(self._held.pop(i))


def _fields(iov: lu.Iovec) -> ctypes.Array[ctypes.c_size_t]:
    """``Iovec``'s two fields (count, pointer to the C ``struct iovec`` array)."""
    return (ctypes.c_size_t * 2).from_address(id(iov) + _OBJECT_HEADER_BYTES)


def _raw_iovecs_work() -> bool:
    """Whether ``Iovec`` is laid out as ``_RawIovecs`` assumes (checked on real buffers)."""
    a, b = bytearray(24), bytearray(40)
    try:
        iov = lu.Iovec([a, b])
        n, ptr = _fields(iov)
        arr = (ctypes.c_size_t * 4).from_address(ptr)
        want = [buffer_address(memoryview(a)), 24, buffer_address(memoryview(b)), 40]
        return n == 2 and list(arr) == want
    except Exception:  # any surprise: fall back to staging copies
        return False


_OBJECT_HEADER_BYTES = object.__basicsize__  # ob_refcnt, ob_type
_DUMMY = bytearray(1)
RAW_IOVECS = _raw_iovecs_work()
