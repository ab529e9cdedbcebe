"""POSIX file I/O through io_uring: the shared-FS tier's default where io_uring runs.

A FUSE file system serves each request synchronously in the thread that issued it, so
the ``posix`` backend keeps ``queue_depth`` requests in flight with as many Python
threads, each waking, taking the GIL and checking its slot: on two cores shared with
the FUSE client and the file-system servers that cost 2–3 ms of CPU per 32-block call
(measured on MooseFS). Through io_uring the kernel's own workers block in FUSE instead,
and one thread submits, reaps and checks each slot as it lands (the SSD engine's ring,
``storage_nodes.ssd.uring``): about half the CPU per call, and the file system gets it.

Everything else (``open``, aligned staging, ``fresh``, the parallel ``fdatasync``) is
the ``posix`` backend's. Every request goes through the ring's own iovec arrays (never
through iovecs that pin their buffers for the life of the process), so a request has at
most two segments; one with more (a scattered slot with its padding) runs on the
``posix`` threads instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from storage_nodes.sharedfs.errors import BackendUnavailable
from storage_nodes.sharedfs.io_backend import IORequest, PosixBackend


class UringBackend(PosixBackend):
    name = "uring"

    def __init__(self, queue_depth: int, direct: bool, user_memory: bool = False) -> None:
        try:
            from storage_nodes.ssd import uring
        except ImportError as e:  # liburing missing: a build problem, said as such
            raise BackendUnavailable(f"liburing cannot be imported: {e}") from e
        if not uring.RAW_IOVECS:
            raise BackendUnavailable("this liburing build cannot take caller iovecs")
        try:
            self._ring = uring.UringBackend(max(1, queue_depth))
        except OSError as e:
            raise BackendUnavailable(f"io_uring is refused here: {e}") from e
        super().__init__(queue_depth, direct, user_memory)

    def read_batch(self, reqs: Sequence[IORequest],
                   on_done: Callable[[int, int], None] | None = None) -> list[int]:
        two = _two_segments(reqs)
        if two is None:
            return super().read_batch(reqs, on_done)
        return self._ring.read_batch(two, on_done)

    def write_batch(self, reqs: Sequence[IORequest],
                    prepare: Callable[[int], None] | None = None) -> list[int]:
        two = _two_segments(reqs)
        if two is None:
            return super().write_batch(reqs, prepare)
        return self._ring.write_and_sync(two, (), prepare=prepare)[0]

    def close(self) -> None:
        self._ring.close()
        super().close()


def _two_segments(reqs: Sequence[IORequest]) -> list[IORequest] | None:
    """Each request as two segments (a plain buffer, then an empty one: the kernel
    skips it, O_DIRECT's alignment holds), or None if one has more than two."""
    out = []
    for r in reqs:
        if r.more:
            return None
        if r.head is None:
            r = IORequest(r.fd, r.offset, r.buf[len(r.buf) :], head=r.buf)
        out.append(r)
    return out
