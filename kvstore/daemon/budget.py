"""Bounded server memory: the bytes every call buffers, reserved before it allocates.

A gRPC ``Commit`` or ``Get`` buffers its whole request (so a malformed one can be
refused with nothing stored); ``ByteBudget`` makes the sum of those buffers a bound of
the daemon, not of its clients: a call reserves its bytes when it opens and is refused
with ``Overloaded`` (RESOURCE_EXHAUSTED) when the reservation would pass the bound.
``row_buffer`` hands out the reserved bytes as an anonymous mapping, whose pages are
touched only as data arrives and go back to the kernel when it is closed — so a held or
cancelled stream costs what it received, and rounds of them do not grow the heap.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Iterator

from kvstore.errors import IntegrityError
from kvstore.wire.errors import Overloaded


class ByteBudget:
    """Thread-safe; ``hold`` is the only way in, so a reservation is always released."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # reservation id -> bytes
        self._next = 0
        self.refused_total = 0

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(self._held.values())

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Reserve ``nbytes`` for the ``with`` body; ``Overloaded`` if they do not fit now."""
        with self._lock:
            used = sum(self._held.values())
            if used + nbytes > self.limit_bytes:
                self.refused_total += 1
                raise Overloaded(
                    f"{nbytes} bytes would pass the daemon's bound of {self.limit_bytes} bytes "
                    f"in flight ({used} held by running calls); retry later"
                )
            rid = self._next
            self._next += 1
            self._held[rid] = nbytes
        try:
            yield
        finally:
            with self._lock:
                del self._held[rid]

    def check_integrity(self) -> None:
        with self._lock:
            if any(n < 0 for n in self._held.values()):
                raise IntegrityError("negative reservation")
            if sum(self._held.values()) > self.limit_bytes:
                raise IntegrityError("reservations exceed the byte budget")


@contextlib.contextmanager
def row_buffer(nbytes: int) -> Iterator[memoryview]:
    """A zeroed, writable buffer of ``nbytes`` whose memory is returned on exit (a view
    still exported then keeps the mapping alive until it goes)."""
    if nbytes == 0:
        yield memoryview(bytearray())
        return
    m = mmap.mmap(-1, nbytes)
    view = memoryview(m)
    try:
        yield view
    finally:
        with contextlib.suppress(BufferError):
            view.release()
            m.close()
