"""This daemon's manifest of one namespace: appends, generations, compaction.

Frames are written at the end the writer knows (``write``) and made durable by
``sync`` (fdatasync, which on a FUSE file system also pushes the bytes to the servers);
``append`` is both. A put writes its frame once its slots are written and syncs it
while the slots' own sync runs (multi-host rule 3 in the README). One fdatasync makes
every frame written before it durable, so concurrent puts share syncs (a group commit).
A failed or short write or sync leaves a frame no reader may trust, and a writer never
appends after such a frame: the log is marked broken and the next write starts a new
generation from a snapshot.

A new generation is written under a temporary name, synced and renamed into place, so
a reader never sees half a snapshot. The old file then gets a SEALED record naming its
successor (readers switch without waiting for a directory rescan) and is deleted after
``grace_s``, time enough for every reader to have followed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs.layout import manifest_name, manifests_in

log = logging.getLogger("storage_nodes.sharedfs")


class Ticket(NamedTuple):
    """Where a written frame ends: what ``ManifestLog.sync`` has to make durable."""

    generation: int
    end: int


class ManifestLog:
    def __init__(self, directory: Path, grace_s: float) -> None:
        self.dir = directory
        self.grace_s = grace_s
        self.generation = 0
        self.size = 0
        self.broken = True  # until a generation is written
        self.snapshot_bytes = 0
        self.appended_records = 0
        self.synced = 0  # bytes of this generation known durable
        self._fd: int | None = None
        self._retired: list[tuple[float, int]] = []  # (delete after, generation)
        self._lock = threading.Lock()  # one append or roll at a time

    @property
    def path(self) -> Path:
        return self.dir / manifest_name(self.generation)

    def needs_compaction(self, min_bytes: int) -> bool:
        """Grown past 4 × its last snapshot (and ``min_bytes``), or unusable."""
        return self.broken or self.size > max(min_bytes, 4 * self.snapshot_bytes)

    def append(self, data: bytes) -> bool:
        """Append whole frames durably; False (and broken) on any failure."""
        ticket = self.write(data)
        return ticket is not None and self.sync(ticket)

    def write(self, data: bytes) -> Ticket | None:
        """Append whole frames, not yet durable: the ticket for ``sync``, or None (and
        broken) on any failure."""
        with self._lock:
            if self.broken or self._fd is None:
                return None
            try:
                n = os.pwrite(self._fd, data, self.size)
                if n != len(data):
                    raise OSError(f"short manifest write ({n} of {len(data)} bytes)")
            except OSError as e:
                log.error("manifest %s: append failed, a new generation follows: %s",
                          self.path, e)
                self.broken = True
                return None
            self.size += len(data)
            self.appended_records += 1
            return Ticket(self.generation, self.size)

    def sync(self, ticket: Ticket) -> bool:
        """Make the frames written up to ``ticket`` durable; False (and broken) if they
        may not be. A ticket of an earlier generation is durable already: the roll that
        replaced it synced a snapshot of a state that includes it (frames are applied
        before they are written, and a roll snapshots under the same publish lock)."""
        with self._lock:
            if ticket.generation != self.generation or self.synced >= ticket.end:
                return True
            if self.broken or self._fd is None:
                return False
            target = self.size  # frames written by others so far ride along
            try:
                os.fdatasync(self._fd)  # the new length included: it is needed to read
            except OSError as e:
                log.error("manifest %s: sync failed, a new generation follows: %s",
                          self.path, e)
                self.broken = True
                return False
            self.synced = target
            return True

    def roll(self, snapshot: Callable[[int], bytes]) -> bool:
        """Start generation G+1 from ``snapshot(G+1)`` (header and live state, ending in
        SNAPSHOT_END). Returns False if the new file could not be written (the old one
        stays current, still broken or not)."""
        with self._lock:
            existing = manifests_in(self.dir)
            gen = max([self.generation, *existing]) + 1
            data = snapshot(gen)
            final = self.dir / manifest_name(gen)
            tmp = self.dir / f".{manifest_name(gen)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
                try:
                    if os.write(fd, data) != len(data):
                        raise OSError("short snapshot write")
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, final)
                fd = os.open(final, os.O_WRONLY | os.O_CLOEXEC)
            except OSError as e:
                log.error("manifest %s: cannot start generation %d: %s", self.dir, gen, e)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                return False
            old_fd, old_gen, old_ok = self._fd, self.generation, not self.broken
            if old_fd is not None:
                if old_ok:  # a broken file is never appended to, not even SEALED
                    try:
                        os.pwrite(old_fd, mf.sealed(gen), self.size)
                        os.fsync(old_fd)
                    except OSError:
                        pass  # readers then find the new generation at their next rescan
                os.close(old_fd)
            now = time.monotonic()
            self._retired += [(now + self.grace_s, g) for g in existing if g != gen]
            if old_gen and old_gen not in existing:
                self._retired.append((now + self.grace_s, old_gen))
            self._fd, self.generation = fd, gen
            self.size = self.snapshot_bytes = self.synced = len(data)
            self.broken = False
            self.appended_records = 0
            return True

    def reap(self, *, force: bool = False) -> int:
        """Delete retired generations whose grace has passed; returns how many."""
        now = time.monotonic()
        with self._lock:
            due = [g for t, g in self._retired if force or t <= now]
            self._retired = [(t, g) for t, g in self._retired if not (force or t <= now)]
        for g in due:
            with contextlib.suppress(OSError):
                os.unlink(self.dir / manifest_name(g))
        return len(due)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self.broken = True
