"""Configuration of one daemon's view of a shared file system."""

from __future__ import annotations

import math
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage_nodes.sharedfs.errors import SharedFSConfigError

ALIGN_BYTES = 4096
DEFAULT_RETENTION_S = 72 * 3600.0
DEFAULT_SEGMENT_BYTES = 1 << 30
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def default_daemon_id() -> str:
    """The host name, made safe as a directory name: one daemon per host by default."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:64].lstrip(".-_")
    return name or "daemon"


@dataclass(frozen=True)
class SharedFSConfig:
    """Everything a ``SharedFSTier`` needs; immutable once the tier is open.

    ``root`` is a directory on the shared mount, the same for every daemon that shares
    the cache. ``daemon_id`` names this daemon's files there; it must be unique among
    the daemons on the mount and stable across restarts (a restarted daemon adopts its
    own segments). ``capacity_bytes`` is this daemon's share: it only ever evicts what it
    wrote itself. ``segment_bytes`` (default min(1 GiB, capacity / 8), at least 8 MiB
    or the capacity) is the file size and the unit in which capacity moves between
    namespaces.

    Visibility: a block put through one daemon is found by every other daemon that has
    the namespace registered within ``visibility_bound_s`` (see there). Collection: a
    daemon whose heartbeat is older than ``collect_after_s`` (default: the retention)
    plus ``clock_skew_s`` may be collected by any live daemon under a lease of
    ``lease_s`` with a fencing token. ``clock`` returns seconds since the epoch; tests
    inject a fake one.
    """

    root: Path
    capacity_bytes: int
    daemon_id: str = field(default_factory=default_daemon_id)
    segment_bytes: int = None  # type: ignore[assignment]  # None: chosen from the capacity
    retention_s: float = DEFAULT_RETENTION_S
    bucket_s: float = 60.0
    poll_interval_s: float = 0.5
    rescan_interval_s: float = 2.0
    fs_cache_s: float = 1.0
    touch_flush_s: float = 1.0
    heartbeat_s: float = 10.0
    clock_skew_s: float = 60.0
    lease_s: float = 300.0
    collect_after_s: float | None = None
    collect_interval_s: float | None = 600.0
    sweep_interval_s: float | None = 60.0
    queue_depth: int = 32
    io_backend: str = "auto"
    direct_io: bool | None = None
    staging_max_bytes: int = 64 << 20
    tenant_dir_mode: int = 0o700
    compact_min_bytes: int = 1 << 20
    max_open_segments: int = 4096
    maintenance: bool = True
    clock: Callable[[], float] = field(default=time.time, compare=False)
    #: True when ``segment_bytes`` was left to the default: a daemon's existing files
    #: then keep the segment size they were written with.
    segment_auto: bool = field(init=False, default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))
        if not isinstance(self.daemon_id, str) or not _ID_RE.match(self.daemon_id):
            raise SharedFSConfigError(
                f"daemon id {self.daemon_id!r} must be 1-64 characters of [A-Za-z0-9._-] "
                "starting with a letter or digit"
            )
        cap = self.capacity_bytes
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < ALIGN_BYTES:
            raise SharedFSConfigError(f"shared-fs capacity must be >= 4 KiB, got {cap!r}")
        if self.segment_bytes is None:
            object.__setattr__(self, "segment_auto", True)
            auto = min(DEFAULT_SEGMENT_BYTES, max(cap // 8, min(cap, 8 << 20)))
            object.__setattr__(self, "segment_bytes", auto // ALIGN_BYTES * ALIGN_BYTES)
        seg = self.segment_bytes
        if not isinstance(seg, int) or seg < 2 * ALIGN_BYTES or seg % ALIGN_BYTES:
            raise SharedFSConfigError(
                f"segment_bytes must be a multiple of {ALIGN_BYTES} and hold a slot, got {seg!r}"
            )
        if cap < seg:
            raise SharedFSConfigError(
                f"shared-fs capacity {cap} is smaller than one segment ({seg})"
            )
        for name in ("queue_depth", "staging_max_bytes", "compact_min_bytes",
                     "max_open_segments"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SharedFSConfigError(f"shared-fs {name} must be a positive integer")
        if not 1 <= self.queue_depth <= 1024:
            raise SharedFSConfigError("shared-fs queue_depth must be in [1, 1024]")
        if not (self.retention_s > 0 or self.retention_s == math.inf):
            raise SharedFSConfigError("shared-fs retention must be > 0 (or inf)")
        for name in ("bucket_s", "poll_interval_s", "rescan_interval_s", "touch_flush_s",
                     "heartbeat_s", "lease_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0 < v < math.inf):
                raise SharedFSConfigError(f"shared-fs {name} must be a positive duration")
        for name in ("fs_cache_s", "clock_skew_s"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0 <= v < math.inf):
                raise SharedFSConfigError(f"shared-fs {name} must be >= 0")
        if self.lease_s <= 2 * self.clock_skew_s:
            raise SharedFSConfigError(
                "shared-fs lease_s must exceed twice clock_skew_s: a holder stops acting "
                "clock_skew_s before its lease ends and others wait clock_skew_s after it"
            )
        for name in ("collect_after_s", "collect_interval_s", "sweep_interval_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise SharedFSConfigError(f"shared-fs {name} must be > 0 or None")
        if self.direct_io not in (None, True, False):
            raise SharedFSConfigError("shared-fs direct_io must be True, False or None (probe)")

    @property
    def chunks(self) -> int:
        """How many segments this daemon's capacity buys."""
        return self.capacity_bytes // self.segment_bytes

    @property
    def visibility_bound_s(self) -> float:
        """Worst-case delay between a put returning on one daemon and ``contains`` on
        another seeing it: a new peer or manifest generation is found by the next
        directory rescan, then read at the next poll, each behind the file system's
        attribute cache. For a peer already known it is ``poll_interval_s +
        fs_cache_s`` (a sealed generation names its successor, so compaction costs no
        rescan)."""
        return self.rescan_interval_s + self.poll_interval_s + 2 * self.fs_cache_s

    @property
    def dead_after_s(self) -> float:
        """A heartbeat older than this (by the observer's clock) means collectable."""
        base = self.retention_s if self.collect_after_s is None else self.collect_after_s
        return base + self.clock_skew_s

    def bucket_of(self, t: float) -> int:
        """Coarse access time in whole seconds, rounded down to ``bucket_s``."""
        b = self.bucket_s
        return max(0, int(t // b * b))

    def live_after(self, now: float) -> float:
        """Blocks last accessed before this are expired (idle longer than retention)."""
        return -math.inf if self.retention_s == math.inf else now - self.retention_s


def slot_bytes_for(block_bytes: int) -> int:
    """An encoded block (64-byte header + payload) rounded up to the I/O alignment."""
    from kvstore.block import HEADER_BYTES

    return -(-(HEADER_BYTES + block_bytes) // ALIGN_BYTES) * ALIGN_BYTES
