"""Per-namespace state of one daemon, and the context its parts share."""

from __future__ import annotations

import functools
import threading
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvstore.block import now_us
from kvstore.keys import Namespace
from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs.catalog import Catalog, Loc
from storage_nodes.sharedfs.config import SharedFSConfig
from storage_nodes.sharedfs.io_backend import IOBackend
from storage_nodes.sharedfs.layout import Layout
from storage_nodes.sharedfs.manifest_log import ManifestLog
from storage_nodes.sharedfs.own import OwnSpace
from storage_nodes.sharedfs.segments import SegmentFiles
from storage_nodes.sharedfs.tail import Tailer

_PATHS_KEPT = 1 << 16  # segment paths memoized (least recently used forgotten first)

COUNTERS = (
    "puts", "gets", "hits", "misses", "inserted", "present", "dropped", "evictions",
    "retention_violations_total", "expired_total", "corrupt_blocks_total",
    "stale_slots_total", "read_races", "io_errors_total", "segments_created",
    "segments_handed_over", "manifest_appends", "manifest_rolls", "manifest_stuck_reads",
    "tail_records", "touches_published", "collected_daemons", "collected_files",
    "maintenance_errors",
)


@dataclass
class NsState:
    """One namespace: the catalog of every daemon's blocks, this daemon's own space and
    manifest, and the tailer that follows the peers. ``ns`` is None for a namespace
    recovered from this daemon's files but not registered (yet) in this process."""

    tenant: str
    fingerprint: bytes
    fields: dict[str, Any]
    block_bytes: int
    slot_bytes: int
    dir: Path
    catalog: Catalog
    own: OwnSpace
    log: ManifestLog
    ns: Namespace | None = None
    tailer: Tailer | None = None
    pending_touch: dict[bytes, int] = field(default_factory=dict)
    touch_bucket: int = 0  # peers' keys touched in this bucket are published once
    touched_now: set[bytes] = field(default_factory=set)
    deferred: list[bytes] = field(default_factory=list)  # encoded records to append
    publish: threading.Lock = field(default_factory=threading.Lock)


class Context:
    """What the tier's parts share. ``lock`` guards every catalog and own space;
    a namespace's ``publish`` lock (taken before ``lock``, never after) orders its
    manifest appends."""

    def __init__(self, config: SharedFSConfig, layout: Layout, io: IOBackend,
                 files: SegmentFiles, epoch: int) -> None:
        self.config = config
        self.layout = layout
        self.io = io
        self.files = files
        self.epoch = epoch
        self.me = config.daemon_id
        self.lock = threading.RLock()
        self.spaces: dict[bytes, NsState] = {}
        self.counts: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        self.creating = 0  # segments being created (their chunks are taken)
        # A put's data sync runs here while its own thread syncs the manifest frame.
        self.syncs = ThreadPoolExecutor(max(1, config.queue_depth),
                                        thread_name_prefix="sharedfs-sync")
        self._seq = 0
        self._seg_counter = 0
        # Memoized: building the Path costs more than the rest of a slot's read request
        # (pathlib parses every part); ids are never reused, so an entry never goes stale.
        self._segment_path = functools.lru_cache(maxsize=_PATHS_KEPT)(self.layout.segment_path)

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def next_seg_id(self) -> int:
        with self.lock:
            self._seg_counter += 1
            return (self.epoch << 32) | self._seg_counter

    def add(self, counts: Mapping[str, int]) -> None:
        with self.lock:
            for k, v in counts.items():
                self.counts[k] += v

    def segments_in_use(self) -> int:
        return sum(len(st.own.segments) for st in self.spaces.values()) + self.creating

    def segment_path(self, st: NsState, owner: str, seg: int) -> Path:
        return self._segment_path(st.tenant, st.fingerprint, owner, seg)

    def floor(self) -> float:
        return self.config.live_after(self.config.clock())

    def bucket_now(self) -> int:
        return self.config.bucket_of(self.config.clock())


def snapshot(ctx: Context, st: NsState, generation: int) -> bytes:
    """A new generation's opening: header, own segments, own live blocks (oldest first,
    so a restart rebuilds the recency order), SNAPSHOT_END. Caller holds ``ctx.lock``."""
    cfg = ctx.config
    head = mf.Header(
        daemon=ctx.me, generation=generation, namespace=st.fields,
        fingerprint=st.fingerprint, block_bytes=st.block_bytes, slot_bytes=st.slot_bytes,
        segment_bytes=cfg.segment_bytes, created_us=now_us(),
    )
    access = st.catalog.access
    entries = [
        mf.PutEntry(k, b.seg, b.slot, access.get(k, b.born_s), b.born_s)
        for k, b in st.own.lru.items()
    ]
    parts = [mf.header(head)]
    parts += [mf.segment_add(s) for s in sorted(st.own.segments)]
    if entries:
        parts.append(mf.puts(entries))
    parts.append(mf.snapshot_end())
    return b"".join(parts)


def own_loc(ctx: Context, key: bytes, st: NsState) -> Loc | None:
    b = st.own.lru.get(key)
    return None if b is None else Loc(ctx.me, b.seg, b.slot, b.born_s)


def release_own(ctx: Context, st: NsState, key: bytes, seg: int, slot: int) -> mf.DropEntry:
    """An own copy goes (expired, failed, or replaced): out of the own space, its slot
    back on the free list, its location out of the catalog. Caller holds ``ctx.lock``.
    Returns the DROP that records it, for the caller to append: under ``st.publish``
    where it holds that lock (taken first), so that a put taking the freed slot
    publishes its PUT there after the DROP. (A DROP appended later, as a peer's
    DELETE_NS or PUT defers it, names the old key at that slot and changes nothing.)"""
    st.own.remove(key)
    st.own.free.append((seg, slot))
    st.catalog.drop(key, ctx.me, seg, slot)
    return mf.DropEntry(key, seg, slot)


def replace_expired(ctx: Context, st: NsState, key: bytes) -> list[mf.DropEntry]:
    """``key`` is put again (by this daemon or, in its manifest, by a peer) while every
    copy the catalog knows is expired but maybe not swept: an expired copy is not revived
    by a newer one's access time. Each is forgotten here; this daemon's own is expired as
    its sweep would (slot freed, DROP returned for the caller to append, as for
    ``release_own``); a peer's only leaves this catalog (owners alone free their slots:
    the peer expires it when it reads the newer PUT, or at its sweep). Caller holds
    ``ctx.lock`` and has checked that ``key`` is not live."""
    drops = []
    for loc in st.catalog.locations(key):
        if loc.owner == ctx.me:
            drops.append(release_own(ctx, st, key, loc.seg, loc.slot))
        else:
            st.catalog.drop(key, loc.owner, loc.seg, loc.slot)
    ctx.counts["expired_total"] += len(drops)
    return drops
