"""Degraded modes of an SSD directory, and the probe that leaves them.

``ok``: reads and writes. ``read-only``: a write, a sync or the index failed (a full
disk, EIO, a full index map) — puts are refused and counted as dropped, reads are
served. ``off``: ``io_error_limit`` read errors in a row of degraded time — every call
is a miss. A degraded tier is not left degraded until a restart: every
``probe_interval_s`` it probes the directory (a synced 4 KiB write, an index write, a
read of every slab) and returns to ``ok`` when all of them work; the probe and its
outcome are logged and counted (``recoveries``).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable

import lmdb

log = logging.getLogger("storage_nodes.ssd")
MODES = ("ok", "read-only", "off")
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

Probe = Callable[[], str | None]  # None: healthy; else why not


class Health:
    def __init__(self, directory: str, io_error_limit: int, probe_interval_s: float) -> None:
        self._dir = directory
        self._limit = io_error_limit
        self._interval = probe_interval_s
        self._lock = threading.Lock()
        self.mode = "ok"
        self.reason = ""
        self._read_errors = 0  # since the tier was last ok
        self._next_probe = 0.0

    def degrade(self, mode: str, why: BaseException | str) -> None:
        with self._lock:
            if MODES.index(mode) <= MODES.index(self.mode):
                return
            self.mode = mode
            self.reason = str(why)
            self._next_probe = time.monotonic() + self._interval
        log.error("SSD tier %s degraded to %s: %s", self._dir, mode, why)

    def store_failed(self, e: BaseException, *, writing: bool) -> None:
        """An I/O or index error: read-only when writing or out of space, else off."""
        full = isinstance(e, lmdb.MapFullError) or getattr(e, "errno", 0) in FULL
        self.degrade("read-only" if writing or full else "off", e)

    def read_error(self) -> None:
        with self._lock:
            self._read_errors += 1
            n = self._read_errors
        if n >= self._limit:
            self.degrade("off", f"{n} read errors")

    def probe_due(self) -> bool:
        return self.mode != "ok" and time.monotonic() >= self._next_probe

    def try_recover(self, probe: Probe) -> bool:
        """Run ``probe`` (if degraded); back to ``ok`` when it reports nothing wrong."""
        if self.mode == "ok":
            return False
        with self._lock:
            self._next_probe = time.monotonic() + self._interval
        try:
            why = probe()
        except (OSError, lmdb.Error) as e:
            why = f"{type(e).__name__}: {e}"
        if why is not None:
            log.info("SSD tier %s still %s: %s", self._dir, self.mode, why)
            return False
        with self._lock:
            was, self.mode, self.reason, self._read_errors = self.mode, "ok", "", 0
        log.warning("SSD tier %s recovered from %s: probe writes and reads work", self._dir, was)
        return True
