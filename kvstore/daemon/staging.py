"""The daemon side of the same-host fast path (DESIGN §7): shared-memory staging.

A client asks for a segment; the daemon creates ``/dev/shm/kvstore-<pid>-<id>-<rand>``
(mode 0600, so only the daemon's user can map it), writes a random nonce in its first
page and answers with the path and the nonce. A client that finds the nonce at that
path shares the host and memory with the daemon; then ``Get``/``Commit`` carry only keys
and offsets, and the payload rows move through the segment.

The path is unlinked on the segment's first use (both sides hold mappings by then), so
a daemon crash leaks at most segments that were never used. Segments belong to the
tenant that opened them; idle ones are reclaimed after ``idle_timeout_s``.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import threading
import time
from dataclasses import dataclass, field

from kvstore.errors import IntegrityError, InvalidArgument
from kvstore.wire.errors import StagingLost

NONCE_BYTES = 16
DATA_OFFSET = 4096


@dataclass(frozen=True, slots=True)
class StagingConfig:
    dir: str = "/dev/shm"
    max_segment_bytes: int = 1 << 30
    max_total_bytes: int = 4 << 30
    idle_timeout_s: float = 600.0


@dataclass(slots=True)
class Segment:
    id: int
    tenant: str | None
    path: str
    size_bytes: int
    nonce: bytes
    map: mmap.mmap
    view: memoryview
    linked: bool = True
    last_used: float = field(default_factory=time.monotonic)


class StagingArea:
    """Thread-safe registry of staging segments."""

    def __init__(self, config: StagingConfig = StagingConfig()) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._segments: dict[int, Segment] = {}
        self._next_id = 1
        self._closed = False

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return sum(s.size_bytes for s in self._segments.values())

    def open(self, tenant: str | None, size_bytes: int) -> Segment:
        if not 0 < size_bytes <= self.config.max_segment_bytes:
            raise InvalidArgument(
                f"staging size must be in (0, {self.config.max_segment_bytes}] bytes, "
                f"got {size_bytes}"
            )
        size = DATA_OFFSET + (size_bytes + 4095) // 4096 * 4096
        with self._lock:
            if self._closed:
                raise InvalidArgument("staging area is closed")
            self._reap_idle_locked()
            used = sum(s.size_bytes for s in self._segments.values())
            if used + size > self.config.max_total_bytes:
                raise InvalidArgument("staging area is full; use the gRPC path")
            sid = self._next_id
            self._next_id += 1
        path = os.path.join(self.config.dir, f"kvstore-{os.getpid()}-{sid}-{secrets.token_hex(8)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
            m = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        nonce = secrets.token_bytes(NONCE_BYTES)
        m[:NONCE_BYTES] = nonce
        seg = Segment(sid, tenant, path, size, nonce, m, memoryview(m))
        with self._lock:
            self._segments[sid] = seg
        return seg

    def rows(self, tenant: str | None, staging_id: int, offset: int, nbytes: int) -> memoryview:
        """A bounds-checked view of ``nbytes`` at data ``offset`` of one of ``tenant``'s
        segments; first use unlinks its path."""
        with self._lock:
            seg = self._segments.get(staging_id)
            if seg is None or seg.tenant != tenant:
                raise StagingLost(f"unknown staging segment {staging_id}")
            start = DATA_OFFSET + offset
            if offset < 0 or nbytes < 0 or start + nbytes > seg.size_bytes:
                raise InvalidArgument(
                    f"staging range [{offset}, {offset + nbytes}) outside segment of "
                    f"{seg.size_bytes - DATA_OFFSET} bytes"
                )
            seg.last_used = time.monotonic()
            if seg.linked:
                self._unlink(seg)
            return seg.view[start : start + nbytes]

    def close_segment(self, tenant: str | None, staging_id: int) -> None:
        with self._lock:
            seg = self._segments.get(staging_id)
            if seg is None or seg.tenant != tenant:
                raise StagingLost(f"unknown staging segment {staging_id}")
            del self._segments[staging_id]
        self._release(seg)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            segs, self._segments = list(self._segments.values()), {}
        for seg in segs:
            self._release(seg)

    def _reap_idle_locked(self) -> None:
        now = time.monotonic()
        for sid, seg in list(self._segments.items()):
            if now - seg.last_used > self.config.idle_timeout_s:
                del self._segments[sid]
                self._release(seg)

    @staticmethod
    def _unlink(seg: Segment) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.path)
        seg.linked = False

    def _release(self, seg: Segment) -> None:
        if seg.linked:
            self._unlink(seg)
        seg.view.release()
        # A view handed to a running RPC may still exist; the mapping then goes with it.
        with contextlib.suppress(BufferError):
            seg.map.close()

    def check_integrity(self) -> None:
        with self._lock:
            for sid, seg in self._segments.items():
                if sid != seg.id or seg.size_bytes < DATA_OFFSET:
                    raise IntegrityError(f"staging segment {sid} is inconsistent")
                if bytes(seg.view[:NONCE_BYTES]) != seg.nonce:
                    raise IntegrityError(f"staging segment {sid} lost its nonce")
            if sum(s.size_bytes for s in self._segments.values()) > self.config.max_total_bytes:
                raise IntegrityError("staging area exceeds its byte bound")
