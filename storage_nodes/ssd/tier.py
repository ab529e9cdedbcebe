"""``SSDTier``: the SSD engine behind the ``Tier`` interface (DESIGN §4–§6).

A put is a group commit (``writer.py``): blocks go to reserved free slots, then all of
them are published in one LMDB transaction; their data is synced behind the puts by
default, or before the publish (``syncer.py``), and ``sync()`` waits for it. Readers
find a block through the index and accept it only after checking its header and
checksum, so a crash at any point, a flipped bit or a slot reused under a racing reader
is a miss, never wrong bytes. I/O errors and ENOSPC degrade the tier (read-only, or
off) instead of raising into the caller; misuse raises ``ValueError`` subclasses as the
contract says.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Collection, Sequence
from contextlib import suppress
from typing import Any

import lmdb

from kvstore.buffers import rows_view
from kvstore.call_gate import CallGate
from kvstore.errors import InvalidArgument, StoreUnavailable, UnknownNamespace
from kvstore.keys import Key, Namespace, check_keys
from kvstore.tier import PutResult, Tier, TierStats
from storage_nodes.ssd.blockio import ReadFailure
from storage_nodes.ssd.config import SSDConfig, slot_bytes_for
from storage_nodes.ssd.errors import SSDConfigError, SSDIOError
from storage_nodes.ssd.health import Health
from storage_nodes.ssd.index import CORRUPT
from storage_nodes.ssd.index_check import check_index
from storage_nodes.ssd.io_backend import IOBackend
from storage_nodes.ssd.lock import DirLock
from storage_nodes.ssd.lookup import PrefixLookup, PutLookup
from storage_nodes.ssd.opening import IndexLifecycle
from storage_nodes.ssd.rebuild import RebuildReport
from storage_nodes.ssd.stats import Counters, build_stats
from storage_nodes.ssd.sweeper import Maintenance, sweep_expired
from storage_nodes.ssd.syncer import DataSync

log = logging.getLogger("storage_nodes.ssd")
_STORE_ERRORS = (SSDIOError, lmdb.Error, OSError)
#: a get looks up this many keys before its first reads, the rest while they are in flight
_FIRST_LOOKUPS = 4


class SSDTier(Tier):
    name = "ssd"

    def __init__(self, config: SSDConfig) -> None:
        self.config = config
        config.dir.mkdir(parents=True, exist_ok=True)
        self._dirlock = DirLock(config.dir)
        self._counts = Counters()
        self._add, self._inc = self._counts.add, self._counts.inc
        self._namespaces: dict[bytes, Namespace] = {}
        self._health = Health(str(config.dir), config.io_error_limit, config.probe_interval_s)
        self._gate = CallGate(f"SSD tier {config.dir} is closed")
        self._maint: Maintenance | None = None
        self._life = IndexLifecycle(config)
        try:
            p = self._life.assemble(self._add, lambda e: self._store_failed(e, writing=True))
        except BaseException:
            self._dirlock.release()
            raise
        self._parts, config, room = p, p.config, p.room
        self.config = config
        self._io, self._index, self._files, self._blocks = p.io, p.index, p.files, p.blocks
        self._recency, self._view, self._alloc = p.recency, p.view, p.alloc
        self._sync: DataSync = p.sync
        self._writer = p.writer
        self.rebuild_report: RebuildReport | None = p.rebuilt
        if not room:
            self._health.degrade("read-only", "the file system refused a 4 KiB write at open")
        if config.sweep_interval_s is not None:
            self._maint = Maintenance(
                config, self.flush_touches, self.sweep, self._recency.due, self._probe_if_due
            )

    # -- plumbing ---------------------------------------------------------------------
    @property
    def io_backend(self) -> IOBackend:
        return self._io

    @property
    def mode(self) -> str:
        """``ok``, ``read-only`` (writes failed: puts drop) or ``off`` (every call misses)."""
        return self._health.mode

    @property
    def _mode(self) -> str:
        return self._health.mode

    def _store_failed(self, e: BaseException, *, writing: bool) -> None:
        self._inc("io_errors_total")
        if isinstance(e, CORRUPT):
            self._life.corrupt()  # the next open rebuilds the index from the slot headers
            self._health.degrade("off", f"index corrupt: {e}")
        self._health.store_failed(e, writing=writing)

    def _class_of(self, ns: Namespace) -> int:
        if self._namespaces.get(ns.fingerprint) != ns:
            raise UnknownNamespace(f"namespace {ns.model_id!r} is not registered with the ssd tier")
        return ns.block_bytes

    @staticmethod
    def _fkeys(ns: Namespace, keys: Sequence[Key]) -> list[bytes]:
        fp = ns.fingerprint
        return [fp + k for k in check_keys(keys)]

    # -- Tier API ---------------------------------------------------------------------
    def register(self, ns: Namespace) -> None:
        with self._gate.call():
            if slot_bytes_for(ns.block_bytes) > self.config.slab_bytes:
                raise SSDConfigError(
                    f"blocks of {ns.block_bytes} bytes do not fit a "
                    f"{self.config.slab_bytes}-byte slab"
                )
            self._namespaces[ns.fingerprint] = ns

    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        with self._gate.call():
            self._class_of(ns)
            fkeys = self._fkeys(ns, keys)
            if self._mode == "off":
                return 0
            try:
                return len(self._view.present_prefix(fkeys))
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=False)
                return 0

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        checksums: list[int] | None = None,
    ) -> int:
        with self._gate.call():
            bb = self._class_of(ns)
            out = rows_view(dst, len(keys), bb, writable=True)
            fkeys = self._fkeys(ns, keys)
            self._inc("gets")
            hits = 0
            noted = False
            if self._mode != "off" and keys:
                try:
                    look = PrefixLookup(self._view, self._recency, fkeys, _FIRST_LOOKUPS)
                    res = self._blocks.read_prefix(
                        ns.fingerprint, bb, list(keys), look.first, out, more=look.more
                    )
                    hits, noted = res.copied, look.noted
                    if checksums is not None:
                        checksums.extend(res.checksums)
                    if res.failure is not None:
                        self._read_failed(fkeys[res.failure.index], res.failure)
                except _STORE_ERRORS as e:
                    self._store_failed(e, writing=False)
            if hits and not noted:
                self._recency.note(fkeys[:hits], self._recency.stamps(hits))
            self._add({"hits": hits, "misses": len(keys) - hits})
        self._flush_if_due()
        return hits

    def _read_failed(self, fkey: bytes, f: ReadFailure) -> None:
        if f.errno:
            self._inc("io_errors_total")
            self._health.read_error()
        if f.in_copy:  # the slot is sound; the destination changed under the copy
            self._inc("corrupt_blocks_total")
            return
        reason = (f"errno {f.errno}" if f.errno else type(f.error).__name__).encode()
        if not self._life.dirty:
            return  # read-only from a full disk at open: no index writes at all
        if not self._view.quarantine(fkey, f.loc, reason):
            self._inc("read_races")
        elif not f.errno:
            self._inc("corrupt_blocks_total")
            log.warning("corrupt block %s in slab %d slot %d quarantined: %s",
                        fkey[16:].hex(), f.loc.slab, f.loc.slot, f.error)

    def put(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        src: Any,
        *,
        present_ok: bool = True,
        checksums: Sequence[int] | None = None,
    ) -> PutResult:
        with self._gate.call():
            bb = self._class_of(ns)
            data = rows_view(src, len(keys), bb)
            fkeys = self._fkeys(ns, keys)
            if len(set(fkeys)) != len(fkeys):
                raise InvalidArgument("put: duplicate keys in one call")
            if checksums is not None and len(checksums) != len(keys):
                raise InvalidArgument(f"put: {len(checksums)} checksums for {len(keys)} keys")
            self._inc("puts")
            n = len(keys)
            if self._mode == "off" or n == 0:
                self._inc("dropped", n)
                return PutResult(dropped=n)
            ahead = self._writer.ahead(n, bb, data, checksums)
            try:
                look = PutLookup(self._view, self._recency, fkeys, ahead, present_ok)
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=False)
                self._inc("dropped", n)
                return PutResult(dropped=n)
            new, step = look.absent, self._blocks.per_batch(bb)
            groups = [new[s : s + step] for s in range(0, len(new), step)]
            if look.pending:  # one group, its rest joins it
                groups = [new]
            inserted = raced = 0
            for group in groups:
                if self._mode != "ok":
                    break
                try:
                    ins, rac = self._writer.write(
                        ns.fingerprint, bb, group, fkeys, data, look.stamps, checksums,
                        later=look.later if look.pending else None,
                    )
                    if look.pending:  # the rest found no room: still counted right
                        look.later()
                except _STORE_ERRORS as e:
                    self._store_failed(e, writing=True)
                    break
                inserted += ins
                raced += rac
            dropped = len(new) + look.unknown - inserted - raced
            self._add({"inserted": inserted, "dropped": dropped})
            self._flush_if_due()
            return PutResult(inserted=inserted, present=len(look.present) + raced, dropped=dropped)

    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        with self._gate.call():
            self._class_of(ns)
            fkeys = self._fkeys(ns, keys)
            if self._mode == "off" or not fkeys:
                return
            try:
                live = sorted(self._view.present_set(fkeys))  # expired = absent: no revival
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=False)
                return
            stamps = self._recency.stamps(len(fkeys))
            self._recency.note([fkeys[i] for i in live], [stamps[i] for i in live])
        self._flush_if_due()

    def _flush_if_due(self) -> None:
        """Without a maintenance thread, callers flush a due batch of touches (and probe
        a degraded directory) themselves."""
        if self._maint is None:
            if self._recency.due():
                with suppress(StoreUnavailable):  # closing: close() flushes what is pending
                    self.flush_touches()
            self._probe_if_due()

    def delete_namespace(self, ns: Namespace) -> int:
        """Drop every block of ``ns``. A durable tombstone is written first, so a rebuild
        of the index from the slot headers (after a power cut) cannot bring them back."""
        with self._gate.call():
            self._class_of(ns)
            if not self._life.dirty:
                return 0
            now = self.config.clock()
            keep_s = self.config.retention_s
            try:
                self._life.tombstones.add(
                    ns.fingerprint,
                    int(now * 1e6) + 1,
                    forget_before_us=0 if math.isinf(keep_s) else int((now - keep_s) * 1e6),
                )
                return self._view.delete_namespace(ns.fingerprint)
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=True)
                return 0

    def iter_keys(self, ns: Namespace) -> list[Key]:
        """Every key of ``ns`` the index holds, expired or not (for checks and tooling)."""
        with self._gate.call():
            return self._view.keys_of(ns.fingerprint)

    def namespace_blocks(self, fingerprints: Collection[bytes]) -> dict[bytes, int]:
        with self._gate.call():  # a tenant's Stats: the blocks its namespaces hold here
            return {fp: self._view.count_of(fp) for fp in set(fingerprints)}

    def block_footprint(self, block_bytes: int) -> int:
        return slot_bytes_for(block_bytes)  # header and alignment, as stats() counts

    # -- maintenance ------------------------------------------------------------------
    def probe(self) -> str:
        """A degraded tier checks whether the directory works again (a synced write, an
        index write, a read of every slab) and returns to ``ok`` if so; returns the mode.
        Runs on its own every ``probe_interval_s`` while degraded."""
        with self._gate.call():
            if self._health.try_recover(self._probe_checks):
                self._inc("recoveries")
            return self._health.mode

    def _probe_checks(self) -> str | None:
        why = self._blocks.probe(sorted(self._alloc.slab_class))
        if why is None:
            if not self._life.begin_writes():
                return "the shutdown marker cannot be written"
            with self._index.write() as txn:
                self._index.note_probe(txn, time.time())
            self._alloc.shrink_to_capacity()
        return why

    def _probe_if_due(self) -> None:
        if self._health.probe_due():
            with suppress(StoreUnavailable):
                self.probe()

    def flush_touches(self) -> None:
        """Write pending recency updates now (normally batched, DESIGN §6)."""
        with self._gate.call():
            if self._mode != "ok":
                return
            try:
                with self._index.write() as txn:
                    self._recency.flush_into(self._index, txn)
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=True)

    def sweep(self) -> int:
        """Remove blocks idle longer than retention; returns how many went."""
        with self._gate.call():
            if self._mode != "ok":
                return 0
            try:
                n = sweep_expired(self.config, self._index, self._recency)
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=True)
                return 0
            self._inc("expired_total", n)
            return n

    def stats(self) -> TierStats:
        with self._gate.call():
            counters = self._counts.snapshot()
            counters["data_sync_rounds"] = self._sync.rounds()
            registered = [ns.block_bytes for ns in self._namespaces.values()]
            return build_stats(
                self.config, self._index, self._files, self._io.name, self._mode, registered,
                counters,
            )

    def check_integrity(self) -> None:
        with self._gate.call():
            if self._life.dirty:
                with self._index.write() as txn:
                    self._recency.flush_into(self._index, txn)
            with self._index.begin() as txn:
                cfg = self.config
                check_index(self._index, txn, chunks=cfg.chunks, slab_bytes=cfg.slab_bytes)
                self._alloc.check(txn)
            self._sync.check_integrity()

    def sync(self, *, timeout_s: float | None = None) -> bool:
        """Make every put acknowledged so far durable against power loss (with the
        default ``data_sync="behind"`` their data is synced one round behind them).
        False: some could not be — a failed sync (counted as an I/O error, reported to
        the first ``sync`` that covers it); ``StoreUnavailable`` when ``timeout_s``
        passes first."""
        with self._gate.call():
            return self._sync.sync(timeout_s)

    def close(self) -> None:
        self._gate.close_sequence(stop=self._stop_maintenance, flush=self._flush_at_close,
                                  release=self._release)

    def _stop_as_crashed(self) -> None:
        """Protected test seam, not API (``storage_nodes.testing.crash.abandon``): stop as
        a crash would — no flush, no commit — and release the directory so the same process
        can reopen it."""
        self._gate.close_sequence(stop=self._stop_maintenance, release=self._release)

    def _stop_maintenance(self) -> None:
        if self._maint is not None:
            self._maint.stop()

    def _flush_at_close(self) -> None:
        # Data first: the clean marker lets the next open trust an index that names it.
        if not self._sync.close():
            log.error("SSD tier %s: unclean close: a data sync failed", self.config.dir)
            return
        try:
            if self._mode == "ok":
                with self._index.write() as txn:
                    self._recency.flush_into(self._index, txn)
            self._life.close_clean(self._index)
        except _STORE_ERRORS as e:
            log.error("SSD tier %s: unclean close: %s", self.config.dir, e)

    def _release(self) -> None:
        self._parts.release()
        self._dirlock.release()
