"""Configuration of one SSD directory."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from storage_nodes.ssd.errors import SSDConfigError
from storage_nodes.ssd.marker import read_boot_id

ALIGN_BYTES = 4096
DEFAULT_RETENTION_S = 72 * 3600.0
DEFAULT_SLAB_BYTES = 256 << 20


def no_crash(point: str) -> None:
    """The product's crash hook: crash points are no-ops."""


#: The named points where the engine calls ``SSDConfig.crash_point`` (tests crash there);
#: ``index_synced`` follows every point where the index became durable (a strict
#: commit, an explicit sync), so a power-cut simulator knows what a cut would keep. The
#: two data-sync points are inside a put with a per-put sync, and at the start and end
#: of each round of the syncer thread behind the puts otherwise.
CRASH_POINTS = (
    "before_data_sync",
    "after_data_sync",
    "inside_index_commit",
    "after_free",
    "index_synced",
)
#: ``fast``: index commits are not synced; after a power cut or OS crash the index is
#: rebuilt from the slot headers. ``strict``: every index commit is synced (LMDB
#: sync + metasync), so an open never rebuilds unless LMDB reports corruption.
INDEX_DURABILITY = ("fast", "strict")
#: When a put's data is synced (``fast`` index mode; ``strict`` always syncs per put).
#: ``behind``: a put returns once its writes completed (on the device with O_DIRECT: a
#: process or OS crash keeps them) and a background syncer makes them durable against
#: power loss one sync round later; ``sync()`` waits for that. ``per_put``: a put returns
#: only after its data sync, so every acknowledged block survives a power cut.
DATA_SYNC = ("behind", "per_put")


@dataclass(frozen=True)
class SSDConfig:
    """Everything an ``SSDTier`` needs; immutable once the tier is open.

    ``direct_io``: ``None`` probes the file system (O_DIRECT where it is accepted,
    buffered I/O + fdatasync where it is refused, e.g. tmpfs); ``True`` requires it.
    ``slab_bytes``: the unit in which capacity moves between size classes; by default
    min(256 MiB, capacity / 8) (at least 8 MiB or the capacity), and an existing
    directory keeps the slab size it was created with.
    ``io_backend``: ``"auto"`` (io_uring where the kernel allows it, else pread),
    ``"uring"``, ``"pread"``, or a name the test harness registered
    (``storage_nodes.ssd.backends.register_backend``).
    ``clock`` returns seconds since the epoch; retention and block timestamps use it,
    so tests inject a fake one.
    ``index_durability``: see ``INDEX_DURABILITY``; ``data_sync``: see ``DATA_SYNC``
    (``strict`` implies ``per_put``: a synced index must never name unsynced data).
    ``data_sync_interval_s``: behind the puts, the pause between the end of one sync
    round and the start of the next, cut short when a ``sync()`` waits (each round syncs
    every slab file written since the last, so fewer rounds means fewer device flushes);
    what a power cut may lose is bounded by it plus two rounds. ``boot_id`` tells a
    process crash (same boot: the page cache kept every index write) from a power cut;
    tests inject one to simulate a reboot. ``probe_interval_s``: how often a degraded
    tier checks whether it can recover.
    """

    dir: Path
    capacity_bytes: int
    retention_s: float = DEFAULT_RETENTION_S
    queue_depth: int = 32
    slab_bytes: int = None  # type: ignore[assignment]  # None: chosen from the capacity
    direct_io: bool | None = None
    io_backend: str = "auto"
    bucket_s: float = 60.0
    touch_flush_s: float = 1.0
    touch_batch_max: int = 4096
    sweep_interval_s: float | None = 60.0
    staging_max_bytes: int = 64 << 20
    index_map_bytes: int = 64 << 30
    io_error_limit: int = 16
    probe_interval_s: float = 10.0
    index_durability: str = "fast"
    data_sync: str = "behind"
    #: Each round fdatasyncs every slab file written since the last one, and on a disk
    #: with a volatile write cache each of those is a device flush: 5 ms rounds cost a
    #: put of 32 blocks ~2.2 flushes (~0.2 ms of the device's ~2 ms per put) on this
    #: project's VMs; at 50 ms, +2.4 % (one caller) and +4.4 % (two) in paired runs. What
    #: a power cut may lose grows from ~5 to ~50 ms of puts, a cache's to forget; a
    #: waiting ``sync()`` still starts a round at once.
    data_sync_interval_s: float = 0.05
    clock: Callable[[], float] = field(default=time.time, compare=False)
    boot_id: Callable[[], str] = field(default=read_boot_id, compare=False, repr=False)
    #: Protected test seam, not configuration: called by ``crash_point``; only the test
    #: harness sets it (``storage_nodes.testing.crash.with_crash_hook``).
    #: (A factory: a plain function default would be a class attribute, bound as a method.)
    _crash_hook: Callable[[str], None] = field(
        init=False, default_factory=lambda: no_crash, compare=False, repr=False
    )
    #: True when ``slab_bytes`` was left to the default: an existing directory's slab
    #: size then wins over the one the capacity would choose.
    slab_auto: bool = field(init=False, default=False, compare=False, repr=False)

    def crash_point(self, point: str) -> None:
        """The engine reached ``point`` (one of ``CRASH_POINTS``): a no-op in the product,
        where a test harness crashes the engine (or records what is durable)."""
        self._crash_hook(point)

    def with_slab_bytes(self, slab_bytes: int) -> SSDConfig:
        """This config with another slab size (an existing directory's); the crash seam
        comes along (``dataclasses.replace`` leaves out fields that ``__init__`` does not
        take)."""
        out = replace(self, slab_bytes=slab_bytes)
        object.__setattr__(out, "_crash_hook", self._crash_hook)
        return out

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.slab_bytes is None:
            object.__setattr__(self, "slab_auto", True)
            cap = self.capacity_bytes if isinstance(self.capacity_bytes, int) else 0
            auto = min(DEFAULT_SLAB_BYTES, max(cap // 8, min(cap, 8 << 20)))
            object.__setattr__(
                self, "slab_bytes", max(ALIGN_BYTES, auto // ALIGN_BYTES * ALIGN_BYTES)
            )
        ints = (
            "capacity_bytes",
            "queue_depth",
            "slab_bytes",
            "touch_batch_max",
            "staging_max_bytes",
            "index_map_bytes",
            "io_error_limit",
        )
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SSDConfigError(f"ssd {name} must be a positive integer, got {v!r}")
        if self.slab_bytes % ALIGN_BYTES:
            raise SSDConfigError(f"ssd slab_bytes must be a multiple of {ALIGN_BYTES}")
        if self.capacity_bytes < self.slab_bytes:
            raise SSDConfigError(
                f"ssd capacity_bytes {self.capacity_bytes} is smaller than one slab "
                f"({self.slab_bytes})"
            )
        if not 1 <= self.queue_depth <= 4096:
            raise SSDConfigError(f"ssd queue_depth must be in [1, 4096], got {self.queue_depth}")
        if self.staging_max_bytes < self.slab_bytes and self.staging_max_bytes < 8 << 20:
            raise SSDConfigError("ssd staging_max_bytes must be at least 8 MiB or one slab")
        for name in ("retention_s", "bucket_s", "touch_flush_s", "probe_interval_s"):
            v = getattr(self, name)
            # NaN fails ``> 0``; ``inf`` is meaningful only for retention (never expire)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise SSDConfigError(f"ssd {name} must be a number > 0, got {v!r}")
            if name != "retention_s" and math.isinf(v):
                raise SSDConfigError(f"ssd {name} must be finite")
        if self.sweep_interval_s is not None and not self.sweep_interval_s > 0:
            raise SSDConfigError("ssd sweep_interval_s must be > 0 or None (no background sweeper)")
        if self.index_durability not in INDEX_DURABILITY:
            raise SSDConfigError(
                f"ssd index_durability must be one of {INDEX_DURABILITY}, "
                f"got {self.index_durability!r}"
            )
        v = self.data_sync_interval_s
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
            raise SSDConfigError(f"ssd data_sync_interval_s must be a number >= 0, got {v!r}")
        if self.data_sync not in DATA_SYNC:
            raise SSDConfigError(
                f"ssd data_sync must be one of {DATA_SYNC}, got {self.data_sync!r}"
            )
        if self.direct_io not in (None, True, False):
            raise SSDConfigError("ssd direct_io must be True, False or None (probe)")

    @property
    def sync_per_put(self) -> bool:
        """Whether a put syncs its own data before it publishes and returns."""
        return self.index_durability == "strict" or self.data_sync == "per_put"

    @property
    def chunks(self) -> int:
        """How many slabs the capacity buys; capacity is shared between classes in these."""
        return self.capacity_bytes // self.slab_bytes

    def bucket_of(self, t: float) -> int:
        """The coarse last-access bucket (DESIGN §6: one minute by default)."""
        b = t // self.bucket_s
        return 0 if b < 0 else int(b)  # long before the epoch (a huge retention): bucket 0

    def expiry_bucket(self, now: float) -> int:
        """Blocks whose bucket is below this one have been idle longer than retention.
        With an infinite retention it is 0: buckets are never negative, nothing expires."""
        if math.isinf(self.retention_s):
            return 0
        return self.bucket_of(now - self.retention_s)


def slot_bytes_for(block_bytes: int) -> int:
    """An encoded block (64-byte header + payload) rounded up to the I/O alignment."""
    from kvstore.block import HEADER_BYTES

    total = HEADER_BYTES + block_bytes
    return -(-total // ALIGN_BYTES) * ALIGN_BYTES


def payload_offset_for(block_bytes: int) -> int:
    """Where a slot's payload starts. The 64-byte header (DESIGN §4) is always at offset 0;
    a payload of whole 4 KiB pages starts on the next page (the header page is padded
    with zeros), so it can move between the slot and a caller's page-aligned rows by
    O_DIRECT without a staging copy, in a slot of the same size as header + payload
    rounded up. Other payloads follow the header directly."""
    from kvstore.block import HEADER_BYTES

    return ALIGN_BYTES if block_bytes % ALIGN_BYTES == 0 else HEADER_BYTES
