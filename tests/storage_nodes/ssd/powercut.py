"""A power-cut simulator for a whole SSD directory, index included (test-only).

What a power cut keeps of each kind of write the engine makes:

* slab writes: only those followed by a sync of their file — the ``crashsim`` backend
  holds every write until its fd is synced and ``crash()`` drops the rest (or lets a
  random subset land); what lands, lands in the order it was written (a later write to
  a slot is never overtaken by an earlier one), and reads see held writes throughout;
* the LMDB index: its content at its last durable point — the engine calls its crash
  hook with ``index_synced`` after each (every commit in strict mode, an explicit sync
  in fast mode), and the simulator snapshots ``data.mdb`` there — plus a random subset
  of the 4 KiB pages written since (a disk that persisted some unsynced writes, in any
  order; a page beyond the durable end of the file may come back as zeros);
* small durable files (``STATE``, ``slabs/TABLE``, ``TOMBSTONES``): kept as they are,
  the engine writes them with fsync + rename + directory fsync.

After ``cut()`` and ``settle()``, reopen the directory with another ``boot_id``: that
is the reboot.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from pathlib import Path

from storage_nodes.ssd import SSDTier
from storage_nodes.testing.crash import abandon

PAGE = 4096


class PowerCut:
    def __init__(self, directory: Path, then: Callable[[str], None] | None = None) -> None:
        self.dir = Path(directory)
        self.then = then  # a further crash hook (e.g. a random cut), called after ours
        self._tier: SSDTier | None = None
        # Held by every index commit of the attached tier and by each snapshot of the
        # index file, so a snapshot never reads a commit half written by another thread
        # (pages of it, not its meta page: a state no disk is ever in).
        self._commits = threading.RLock()
        self._durable_index = b""
        self._at_cut: tuple[bytes, float, int] = (b"", 0.0, 0)
        self.index_pages_mixed = 0
        self.is_cut = False  # after the cut nothing becomes durable (other threads go on)

    @property
    def tier(self) -> SSDTier | None:
        return self._tier

    @tier.setter
    def tier(self, tier: SSDTier | None) -> None:
        """Attach the opened tier (its index commits then take ``_commits``)."""
        self._tier = tier
        if tier is None:
            return
        index = tier._index
        inner = index.commit
        lock = self._commits

        def commit(txn) -> None:  # type: ignore[no-untyped-def]
            with lock:
                inner(txn)

        index.commit = commit  # type: ignore[method-assign]

    @property
    def data_mdb(self) -> Path:
        return self.dir / "index" / "data.mdb"

    def hook(self, point: str) -> None:
        """The crash hook: install with ``storage_nodes.testing.crash.with_crash_hook``
        (``make_config(crash_hook=...)``)."""
        if point == "index_synced":
            with self._commits:
                if not self.is_cut:
                    self._durable_index = _written(self.data_mdb)
        if self.then is not None:
            self.then(point)

    def cut(self, *, keep_fraction: float = 0.0, seed: int = 0) -> None:
        """Cut the power now (also from inside a crash hook): unsynced slab writes are
        dropped and the index file is captured as it is at this instant. Raise
        ``SimulatedCrash`` after it inside a hook; then call ``settle()``. Only the first
        cut counts (with several threads, others may reach a crash point after it)."""
        tier = self.tier
        assert tier is not None, "attach the tier first: cut.tier = tier"
        with self._commits:
            if self.is_cut:
                return
            self.is_cut = True
            tier.io_backend.crash(keep_fraction=keep_fraction, seed=seed)  # type: ignore[attr-defined]
            self._at_cut = (_written(self.data_mdb), keep_fraction, seed)

    def settle(self) -> None:
        """After the cut unwound: stop the tier as a crash would, and leave the index file
        as a disk would after losing its unsynced pages."""
        if self._tier is not None:
            abandon(self._tier)
            self._tier = None
        now, keep_fraction, seed = self._at_cut
        rng = random.Random(seed)
        old = self._durable_index
        out = bytearray(old.ljust(len(now), b"\0")[: max(len(old), len(now))])
        for off in range(0, len(now), PAGE):
            new_page = now[off : off + PAGE]
            if new_page != out[off : off + PAGE] and rng.random() < keep_fraction:
                out[off : off + PAGE] = new_page
                self.index_pages_mixed += 1
        self.data_mdb.write_bytes(bytes(out))


def _written(path: Path) -> bytes:
    """The index file up to its first hole. LMDB writes its pages from the file's start
    on; written in place (``writemap``) the file is a sparse one of the whole map past
    them, and reading all of it at every sync made the power-cut tests 20x slower."""
    with open(path, "rb") as f:
        try:
            end = os.lseek(f.fileno(), 0, os.SEEK_HOLE)
        except OSError:  # no SEEK_HOLE here: all of it
            end = os.fstat(f.fileno()).st_size
        f.seek(0)  # SEEK_HOLE moved it
        return f.read(end)
