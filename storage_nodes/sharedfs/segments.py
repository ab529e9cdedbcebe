"""Segment files: large preallocated files cut into slots of one encoded block each.

A segment belongs to one daemon and one namespace (``tenants/<t>/<fp>/<daemon>/seg-<S>``)
and is written only by that daemon. Page 0 is a segment header (so a file on the mount
says what it is); slot ``i`` starts at ``4096 + i × slot_bytes`` and holds a DESIGN §4
block (64-byte header + payload) padded to 4 KiB. The file is sized once (sparse) so no
write ever extends it; an unwritten slot reads as zeros, which no header check accepts.

Segment ids are ``epoch << 32 | counter``: the epoch is the daemon's ownership token
(lease.py), so a restarted daemon never reuses an id a peer may still have cached.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from storage_nodes.sharedfs.config import ALIGN_BYTES
from storage_nodes.sharedfs.io_backend import IOBackend, IORequest

SEG_MAGIC = b"KVSG"
SEG_VERSION = 1
DATA_OFFSET = ALIGN_BYTES
# magic, version, flags, segment id, fingerprint, slot bytes, slots, created µs, daemon
_SEG_HEADER = struct.Struct("<4sHHQ16sIIQ64s")


@dataclass(frozen=True, slots=True)
class SegmentHeader:
    seg_id: int
    fingerprint: bytes
    slot_bytes: int
    slots: int
    created_us: int
    daemon: str

    def pack(self) -> bytes:
        return _SEG_HEADER.pack(
            SEG_MAGIC, SEG_VERSION, 0, self.seg_id, self.fingerprint, self.slot_bytes,
            self.slots, self.created_us, self.daemon.encode(),
        )

    @classmethod
    def unpack(cls, raw: bytes) -> SegmentHeader:
        magic, version, _, seg, fp, sb, slots, created, daemon = _SEG_HEADER.unpack_from(raw)
        if magic != SEG_MAGIC or version != SEG_VERSION:
            raise ValueError("not a kvstore segment file")
        return cls(seg, fp, sb, slots, created, daemon.rstrip(b"\0").decode())


def slots_per_segment(segment_bytes: int, slot_bytes: int) -> int:
    return max(0, (segment_bytes - DATA_OFFSET) // slot_bytes)


def slot_offset(slot: int, slot_bytes: int) -> int:
    return DATA_OFFSET + slot * slot_bytes


class SegmentFiles:
    """Open descriptors of own and peers' segments, bounded (least recently used are
    closed), thread-safe. A descriptor is never closed while a batch uses it: callers
    hold ``use()`` around their I/O."""

    def __init__(self, io: IOBackend, max_open: int) -> None:
        self._io = io
        self._max_open = max_open
        self._fds: OrderedDict[Path, tuple[int, bool]] = OrderedDict()
        self._busy: dict[int, int] = {}
        self._doomed: set[int] = set()
        self._lock = threading.Lock()

    def create(self, path: Path, header: SegmentHeader) -> None:
        """Create the file, write its header page and size it; durable on return."""
        fd = self._io.open(path, write=True, create=True)
        buf = self._io.alloc(ALIGN_BYTES)
        try:
            raw = header.pack()
            buf[: len(raw)] = raw
            buf[len(raw) :] = bytes(ALIGN_BYTES - len(raw))
            res = self._io.write_batch([IORequest(fd, 0, buf)])
            if res[0] < 0:
                raise OSError(-res[0], os.strerror(-res[0]), str(path))
            os.ftruncate(fd, DATA_OFFSET + header.slots * header.slot_bytes)
            os.fsync(fd)
        except BaseException:
            self._io.close_fd(fd)
            _unlink_quietly(path)
            raise
        finally:
            self._io.free(buf)
        with self._lock:
            self._fds[path] = (fd, True)
            self._trim()

    def acquire(self, path: Path, *, write: bool = False) -> int:
        """A descriptor for ``path``, marked busy until ``release``; raises OSError."""
        with self._lock:
            hit = self._fds.get(path)
            if hit is not None and (hit[1] or not write):
                self._fds.move_to_end(path)
                self._busy[hit[0]] = self._busy.get(hit[0], 0) + 1
                return hit[0]
        fd = self._io.open(path, write=write)
        with self._lock:
            old = self._fds.get(path)
            if old is not None:
                self._retire(old[0])
            self._fds[path] = (fd, write)
            self._busy[fd] = self._busy.get(fd, 0) + 1
            self._trim()
            return fd

    def release(self, fd: int) -> None:
        with self._lock:
            n = self._busy.get(fd, 0) - 1
            if n > 0:
                self._busy[fd] = n
                return
            self._busy.pop(fd, None)
            if fd in self._doomed:
                self._doomed.discard(fd)
                self._io.close_fd(fd)

    def forget(self, path: Path) -> None:
        """Close ``path``'s descriptor (the file was removed or replaced)."""
        with self._lock:
            hit = self._fds.pop(path, None)
            if hit is not None:
                self._retire(hit[0])

    def forget_under(self, directory: Path) -> None:
        with self._lock:
            for path in [p for p in self._fds if p.parent == directory]:
                self._retire(self._fds.pop(path)[0])

    def unlink(self, path: Path) -> None:
        self.forget(path)
        _unlink_quietly(path)

    def _retire(self, fd: int) -> None:
        if self._busy.get(fd):
            self._doomed.add(fd)
        else:
            self._io.close_fd(fd)

    def _trim(self) -> None:
        while len(self._fds) > self._max_open:
            _, (fd, _) = self._fds.popitem(last=False)
            self._retire(fd)

    def open_count(self) -> int:
        with self._lock:
            return len(self._fds)

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._fds.values():
                self._retire(fd)
            self._fds.clear()


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
