"""Durable records the index can be rebuilt around: which size class each slab holds
(``slabs/TABLE``) and which namespaces were deleted when (``TOMBSTONES``).

The index is written without syncs in the default mode, so after a power cut it is
rebuilt from the slot headers; for that a slab's class must be known from a file that
is always synced (a slab handed to another class still holds the old class's headers),
and a deleted namespace's blocks, still intact in their slots, must not come back.
Both change rarely (a slab created or handed over, a namespace deleted): each change
rewrites a small file atomically (temp file, fsync, rename, fsync of the directory).
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

_ROW = struct.Struct("<IQ")  # slab, block_bytes
_TOMB = struct.Struct("<16sQ")  # fingerprint, deleted-at µs
_MAGIC_TABLE = b"KVSLABT1"
_HEAD = struct.Struct("<8sQ")  # magic, slab_bytes
_MAGIC_TOMB = b"KVTOMB01"


def write_durably(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class SlabTable:
    """The slab size and slab -> block_bytes, as last made durable. Thread-safe."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "slabs" / "TABLE"
        self._lock = threading.Lock()

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> tuple[int, dict[int, int]]:
        """(slab_bytes, {slab: block_bytes}); (0, {}) when there is no table yet."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return 0, {}
        if len(raw) < _HEAD.size or (len(raw) - _HEAD.size) % _ROW.size:
            raise ValueError(f"{self.path} is not a slab table")
        magic, slab_bytes = _HEAD.unpack_from(raw)
        if magic != _MAGIC_TABLE:
            raise ValueError(f"{self.path} is not a slab table")
        return slab_bytes, {s: bb for s, bb in _ROW.iter_unpack(raw[_HEAD.size :])}

    def write(self, slab_bytes: int, table: dict[int, int]) -> None:
        body = b"".join(_ROW.pack(s, bb) for s, bb in sorted(table.items()))
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_durably(self.path, _HEAD.pack(_MAGIC_TABLE, slab_bytes) + body)


class Tombstones:
    """Deleted namespaces: fingerprint -> the time (µs, the tier's clock) of the delete.
    A rebuild skips blocks of a fingerprint created at or before its tombstone."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "TOMBSTONES"
        self._lock = threading.Lock()

    def read(self) -> dict[bytes, int]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        if not raw.startswith(_MAGIC_TOMB) or (len(raw) - 8) % _TOMB.size:
            raise ValueError(f"{self.path} is not a tombstone file")
        return {fp: t for fp, t in _TOMB.iter_unpack(raw[8:])}

    def add(self, fingerprint: bytes, at_us: int, *, forget_before_us: int = 0) -> None:
        """Record a delete; tombstones older than ``forget_before_us`` are dropped (every
        block they could hide has expired by then)."""
        with self._lock:
            tombs = {fp: t for fp, t in self.read().items() if t >= forget_before_us}
            tombs[fingerprint] = max(at_us, tombs.get(fingerprint, 0))
            body = b"".join(_TOMB.pack(fp, t) for fp, t in sorted(tombs.items()))
            write_durably(self.path, _MAGIC_TOMB + body)
