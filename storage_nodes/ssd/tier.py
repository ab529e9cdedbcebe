"""``SSDTier``: the SSD engine behind the ``Tier`` interface (DESIGN §4–§6).

A put is a group commit: its blocks are written to reserved free slots, the data is
synced, and only then are all of them published in one LMDB transaction. Readers find
a block through the index and accept it only after checking its header and checksum,
so a crash at any point, a flipped bit or a slot reused under a racing reader yields a
miss, never wrong bytes. I/O errors and ENOSPC degrade the tier (read-only, or off)
instead of raising into the caller.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from typing import Any

import lmdb

from kvstore.buffers import rows_view
from kvstore.errors import IntegrityError, InvalidArgument, StoreUnavailable, UnknownNamespace
from kvstore.keys import KEY_BYTES, Key, Namespace
from kvstore.tier import PutResult, SizeClassStats, Tier, TierStats
from storage_nodes.ssd.allocator import SlotAllocator
from storage_nodes.ssd.blockio import BlockIO, ReadFailure
from storage_nodes.ssd.config import SSDConfig, slot_bytes_for
from storage_nodes.ssd.errors import SSDConfigError, SSDIOError
from storage_nodes.ssd.index import Index, Location
from storage_nodes.ssd.io_backend import IOBackend, make_backend
from storage_nodes.ssd.lock import DirLock
from storage_nodes.ssd.recency import Recency
from storage_nodes.ssd.slabs import SlabFiles
from storage_nodes.ssd.sweeper import Maintenance, sweep_expired

log = logging.getLogger("storage_nodes.ssd")
_MODES = ("ok", "read-only", "off")
_COUNTERS = ("puts", "gets", "hits", "misses", "inserted", "dropped", "evictions",
             "retention_violations_total", "corrupt_blocks_total", "expired_total",
             "io_errors_total", "read_races", "slab_handovers")
_STORE_ERRORS = (SSDIOError, lmdb.Error, OSError)


class SSDTier(Tier):
    name = "ssd"

    def __init__(self, config: SSDConfig) -> None:
        self.config = config
        config.dir.mkdir(parents=True, exist_ok=True)
        self._dirlock = DirLock(config.dir)
        self._counts: Counter[str] = Counter({k: 0 for k in _COUNTERS})
        self._counts_lock = threading.Lock()
        self._namespaces: dict[bytes, Namespace] = {}
        self._mode = "ok"
        self._closed = False
        self._inflight = 0
        self._gate = threading.Condition()
        self._maint: Maintenance | None = None
        opened: list[Any] = []
        try:
            self._io: IOBackend = make_backend(config.io_backend, config.queue_depth)
            opened.append(self._io)
            self._files = SlabFiles(config.dir, config.slab_bytes, config.direct_io)
            opened.append(self._files)
            self._index = Index(config.dir / "index", map_bytes=config.index_map_bytes,
                                slab_bytes=config.slab_bytes)
            opened.append(self._index)
            with self._index.begin() as txn:
                first_seq = self._index.seq_high_water(txn) + 1
            self._recency = Recency(config, first_seq)
            self._alloc = SlotAllocator(config, self._index, self._files, self._recency, self._add)
            self._blocks = BlockIO(config, self._files, self._io)
        except BaseException:
            for res in reversed(opened):
                res.close()
            self._dirlock.release()
            raise
        if config.sweep_interval_s is not None:
            self._maint = Maintenance(config, self.flush_touches, self.sweep, self._recency.due)

    # -- plumbing ---------------------------------------------------------------------
    @property
    def io_backend(self) -> IOBackend:
        return self._io

    @property
    def mode(self) -> str:
        return self._mode

    @contextmanager
    def _op(self) -> Iterator[None]:
        """Admit a call unless closed; ``close`` waits for admitted calls to finish."""
        with self._gate:
            if self._closed:
                raise StoreUnavailable(f"SSD tier {self.config.dir} is closed")
            self._inflight += 1
        try:
            yield
        finally:
            with self._gate:
                self._inflight -= 1
                if not self._inflight:
                    self._gate.notify_all()

    def _add(self, counts: Counter[str]) -> None:
        with self._counts_lock:
            self._counts.update(counts)

    def _inc(self, name: str, n: int = 1) -> None:
        with self._counts_lock:
            self._counts[name] += n

    def _degrade(self, mode: str, why: BaseException | str) -> None:
        if _MODES.index(mode) > _MODES.index(self._mode):
            self._mode = mode
            log.error("SSD tier %s degraded to %s: %s", self.config.dir, mode, why)

    def _store_failed(self, e: BaseException, *, writing: bool) -> None:
        self._inc("io_errors_total")
        full = isinstance(e, lmdb.MapFullError) or getattr(e, "errno", 0) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        self._degrade("read-only" if writing or full else "off", e)

    def _class_of(self, ns: Namespace) -> int:
        if self._namespaces.get(ns.fingerprint) != ns:
            raise UnknownNamespace(f"namespace {ns.model_id!r} is not registered with the ssd tier")
        return ns.block_bytes

    @staticmethod
    def _fkeys(ns: Namespace, keys: Sequence[Key]) -> list[bytes]:
        fp = ns.fingerprint
        out = []
        for k in keys:
            if not isinstance(k, (bytes, bytearray)) or len(k) != KEY_BYTES:
                raise InvalidArgument(f"keys must be {KEY_BYTES}-byte strings")
            out.append(fp + bytes(k))
        return out

    def _live(self, fkey: bytes, loc: Location, expiry: int) -> bool:
        """Present and not idle past retention (expired blocks are misses before the sweep)."""
        if loc.bucket >= expiry:
            return True
        pend = self._recency.pending_stamp(fkey)
        return pend is not None and pend[0] >= expiry

    def _present_prefix(self, fkeys: Sequence[bytes]) -> list[Location]:
        expiry = self.config.expiry_bucket(self.config.clock())
        out: list[Location] = []
        with self._index.begin() as txn:
            for fk in fkeys:
                loc = self._index.get(txn, fk)
                if loc is None or not self._live(fk, loc, expiry):
                    break
                out.append(loc)
        return out

    # -- Tier API ---------------------------------------------------------------------
    def register(self, ns: Namespace) -> None:
        with self._op():
            if slot_bytes_for(ns.block_bytes) > self.config.slab_bytes:
                raise SSDConfigError(
                    f"blocks of {ns.block_bytes} bytes do not fit a {self.config.slab_bytes}-byte slab"
                )
            self._namespaces[ns.fingerprint] = ns

    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        with self._op():
            self._class_of(ns)
            fkeys = self._fkeys(ns, keys)
            if self._mode == "off":
                return 0
            try:
                return len(self._present_prefix(fkeys))
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=False)
                return 0

    def get_into(self, ns: Namespace, keys: Sequence[Key], dst: Any) -> int:
        with self._op():
            bb = self._class_of(ns)
            out = rows_view(dst, len(keys), bb, writable=True)
            fkeys = self._fkeys(ns, keys)
            self._inc("gets")
            hits = 0
            if self._mode != "off" and keys:
                try:
                    locs = self._present_prefix(fkeys)
                    res = self._blocks.read_prefix(ns.fingerprint, bb, list(keys), locs, out)
                    hits = res.copied
                    if res.failure is not None:
                        self._read_failed(fkeys[res.failure.index], res.failure)
                except _STORE_ERRORS as e:
                    self._store_failed(e, writing=False)
            if hits:
                self._recency.note(fkeys[:hits], self._recency.stamps(hits))
            self._add(Counter(hits=hits, misses=len(keys) - hits))
            return hits

    def _read_failed(self, fkey: bytes, f: ReadFailure) -> None:
        """Quarantine the slot if the index still points this key at this very block;
        otherwise the block moved under us (evicted and reused): a plain miss."""
        if f.errno:
            self._inc("io_errors_total")
            if self._counts["io_errors_total"] >= self.config.io_error_limit:
                self._degrade("off", f"{self._counts['io_errors_total']} I/O errors")
        reason = (f"errno {f.errno}" if f.errno else type(f.error).__name__).encode()
        with self._index.begin(write=True) as txn:
            cur = self._index.get(txn, fkey)
            same = cur is not None and (cur.slab, cur.slot, cur.gen) == (f.loc.slab, f.loc.slot, f.loc.gen)
            if same:
                self._index.remove(txn, fkey, f.loc, reason=reason)
        if not same:
            self._inc("read_races")
        elif not f.errno:
            self._inc("corrupt_blocks_total")
            log.warning("corrupt block %s in slab %d slot %d quarantined: %s",
                        fkey[16:].hex(), f.loc.slab, f.loc.slot, f.error)

    def put(self, ns: Namespace, keys: Sequence[Key], src: Any, *, present_ok: bool = True) -> PutResult:
        with self._op():
            bb = self._class_of(ns)
            data = rows_view(src, len(keys), bb)
            fkeys = self._fkeys(ns, keys)
            if len(set(fkeys)) != len(fkeys):
                raise InvalidArgument("put: duplicate keys in one call")
            self._inc("puts")
            n = len(keys)
            if self._mode == "off" or n == 0:
                self._inc("dropped", n)
                return PutResult(dropped=n)
            try:
                present = self._present_set(fkeys)
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=False)
                self._inc("dropped", n)
                return PutResult(dropped=n)
            if not present_ok and present:
                raise InvalidArgument("put: key already present and present_ok=False")
            stamps = self._recency.stamps(n)
            old = [i for i in range(n) if i in present]
            self._recency.note([fkeys[i] for i in old], [stamps[i] for i in old])
            new = [i for i in range(n) if i not in present]
            inserted = raced = 0
            step = self._blocks.per_batch(bb)
            for start in range(0, len(new), step):
                if self._mode != "ok":
                    break
                ins, rac = self._put_group(ns, bb, new[start : start + step], fkeys, data, stamps)
                inserted += ins
                raced += rac
            dropped = len(new) - inserted - raced
            self._add(Counter(inserted=inserted, dropped=dropped))
            return PutResult(inserted=inserted, present=len(old) + raced, dropped=dropped)

    def _present_set(self, fkeys: Sequence[bytes]) -> set[int]:
        expiry = self.config.expiry_bucket(self.config.clock())
        out = set()
        with self._index.begin() as txn:
            for i, fk in enumerate(fkeys):
                loc = self._index.get(txn, fk)
                if loc is not None and self._live(fk, loc, expiry):
                    out.add(i)
        return out

    def _put_group(self, ns: Namespace, bb: int, idx: list[int], fkeys: list[bytes],
                   data: memoryview, stamps: list[tuple[int, int]]) -> tuple[int, int]:
        """One group commit; returns (inserted, raced: inserted meanwhile by another put)."""
        try:
            slots = self._alloc.reserve(bb, len(idx))
        except _STORE_ERRORS as e:
            self._store_failed(e, writing=True)
            return 0, 0
        idx = idx[: len(slots)]  # the head of the chain is kept when room runs out
        if not idx:
            return 0, 0
        rows = [data[i * bb : (i + 1) * bb] for i in idx]
        try:
            self._blocks.write_durable(ns.fingerprint, bb, [fkeys[i][16:] for i in idx], rows, slots)
            published, raced = self._publish(idx, fkeys, slots, stamps)
        except _STORE_ERRORS as e:
            self._alloc.release(slots, still_free=True)
            self._store_failed(e, writing=True)
            return 0, 0
        self._alloc.release([slots[j] for j in published], still_free=False)
        self._alloc.release([slots[j] for j in range(len(idx)) if j not in published], still_free=True)
        return len(published), raced

    def _publish(self, idx: list[int], fkeys: list[bytes], slots: list[tuple[int, int]],
                 stamps: list[tuple[int, int]]) -> tuple[set[int], int]:
        expiry = self.config.expiry_bucket(self.config.clock())
        published: set[int] = set()
        raced = 0
        with self._index.begin(write=True) as txn:
            for j, i in enumerate(idx):
                fk = fkeys[i]
                cur = self._index.get(txn, fk)
                if cur is not None:
                    if self._live(fk, cur, expiry):
                        raced += 1  # another put published it first; our slot stays free
                        continue
                    self._index.remove(txn, fk, cur)  # replace the expired copy
                bucket, seq = stamps[i]
                slab, slot = slots[j]
                self._index.insert(txn, fk, Location(slab, slot, bucket, seq, seq))
                published.add(j)
            self._index.set_seq_high_water(txn, self._recency.high_water)
            self.config.crash_hook("inside_index_commit")
        return published, raced

    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        with self._op():
            self._class_of(ns)
            fkeys = self._fkeys(ns, keys)
            if self._mode == "off" or not fkeys:
                return
            self._recency.note(fkeys, self._recency.stamps(len(fkeys)))
        if self._maint is None and self._recency.due():
            self.flush_touches()

    def delete_namespace(self, ns: Namespace) -> int:
        with self._op():
            self._class_of(ns)
            total = 0
            try:
                while True:
                    with self._index.begin(write=True) as txn:
                        batch = list(islice(self._index.iter_namespace(txn, ns.fingerprint), 10_000))
                        for fk in batch:
                            loc = self._index.get(txn, fk)
                            if loc is not None:
                                self._index.remove(txn, fk, loc)
                    total += len(batch)
                    if len(batch) < 10_000:
                        return total
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=True)
                return total

    def iter_keys(self, ns: Namespace) -> list[Key]:
        """Every key of ``ns`` the index holds, expired or not (for checks and tooling)."""
        with self._op(), self._index.begin() as txn:
            return [fk[16:] for fk in self._index.iter_namespace(txn, ns.fingerprint)]

    # -- maintenance ------------------------------------------------------------------
    def flush_touches(self) -> None:
        """Write pending recency updates now (normally batched, DESIGN §6)."""
        with self._op():
            if self._mode != "ok":
                return
            try:
                with self._index.begin(write=True) as txn:
                    self._recency.flush_into(self._index, txn)
            except _STORE_ERRORS as e:
                self._store_failed(e, writing=True)

    def sweep(self) -> int:
        """Remove blocks idle longer than retention; returns how many went."""
        with self._op():
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
        with self._op(), self._index.begin() as txn:
            table = self._index.slab_table(txn)
            free_chunks = self.config.chunks - len(table)
            classes = []
            used_bytes = 0
            quarantined = int(txn.stat(self._index.quar)["entries"])
            entries = self._index.count(txn)
        bbs = sorted({ns.block_bytes for ns in self._namespaces.values()} | {i.block_bytes for i in table.values()})
        for bb in bbs:
            mine = [i for i in table.values() if i.block_bytes == bb]
            per = self._alloc.nslots(bb)
            used = sum(i.used for i in mine)
            used_bytes += used * slot_bytes_for(bb)
            classes.append(SizeClassStats(bb, (len(mine) + free_chunks) * per, used))
        with self._counts_lock:
            counters = dict(self._counts)
        counters.update(degraded=int(self._mode != "ok"), quarantined_slots=quarantined,
                        blocks=entries, slabs=len(table))
        info = {
            "dir": str(self.config.dir),
            "io_backend": self._io.name,
            "direct_io": "on" if self._files.direct else "off",
            "durability": "O_DIRECT + fdatasync" if self._files.direct else "buffered I/O + fdatasync"
            + (" (O_DIRECT refused by the file system)" if self._files.direct_refused else ""),
            "mode": self._mode,
            "queue_depth": str(self.config.queue_depth),
            "retention_s": str(self.config.retention_s),
        }
        return TierStats(self.name, self.config.capacity_bytes, used_bytes, tuple(classes), counters, info)

    def check_integrity(self) -> None:
        with self._op():
            with self._index.begin(write=True) as txn:
                self._recency.flush_into(self._index, txn)
            with self._index.begin() as txn:
                self._index.check(txn, chunks=self.config.chunks, slab_bytes=self.config.slab_bytes)
                self._alloc.check(txn)
            if self._mode not in _MODES:
                raise IntegrityError(f"unknown mode {self._mode!r}")

    def close(self) -> None:
        with self._gate:
            if self._closed:
                return
            self._closed = True
            while self._inflight:
                self._gate.wait()
        if self._maint is not None:
            self._maint.stop()
        try:
            if self._mode == "ok":
                with self._index.begin(write=True) as txn:
                    self._recency.flush_into(self._index, txn)
        except _STORE_ERRORS as e:
            log.error("SSD tier %s: touches lost at close: %s", self.config.dir, e)
        finally:
            self._io.close()
            self._files.close()
            self._index.close()
            self._dirlock.release()

    def abandon(self) -> None:
        """Tests only: drop everything as a crash would — no flush, no commit — and
        release the directory so the same process can reopen it."""
        with self._gate:
            self._closed = True
        if self._maint is not None:
            self._maint.stop()
        self._io.close()
        self._files.close()
        self._index.close()
        self._dirlock.release()
