"""The LMDB index of an SSD directory.

Sub-databases (all keys big-endian where order matters, so cursors walk them in order):

* ``keys``  fingerprint‖key (32 B) → slab, slot, bucket, seq, gen
* ``lru``   bucket‖seq‖fingerprint‖key → ∅   oldest first: the sweeper and eviction
* ``slots`` slab‖slot → fingerprint‖key      reverse map (whole-slab eviction, checks)
* ``free``  block_bytes‖slab‖slot → ∅        free-slot lists, one range per size class
* ``quar``  slab‖slot → reason                quarantined slots (corrupt data seen)
* ``slabs`` slab → block_bytes, used          one record per allocated chunk
* ``meta``  format version, slab size, sequence high-water mark

``seq`` orders recency (a global counter, so order within a one-minute bucket is exact);
``gen`` is the seq at insertion and never changes: it tells a block from a later block
of the same key in the same slot. Nothing here is loaded into Python memory at open,
so opening a 10-million-entry index costs what opening LMDB costs.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import lmdb

from kvstore.errors import IntegrityError
from storage_nodes.ssd.errors import SSDFormatError, SSDIOError
from storage_nodes.ssd.index_room import MapRoom

log = logging.getLogger("storage_nodes.ssd")

FORMAT = b"2"  # 2: a payload of whole pages starts on the slot's second page
FKEY_BYTES = 32
_LOC = struct.Struct("<IIIQQ")
_LRU = struct.Struct(">IQ")
_SLOT = struct.Struct(">II")
_FREE = struct.Struct(">QII")
_SLAB = struct.Struct("<QI")
_U32 = struct.Struct(">I")
_BB = struct.Struct(">Q")

Txn = lmdb.Transaction
#: What LMDB raises for an index it cannot trust (MDB_CORRUPTED, MDB_INVALID, a page
#: that is not there): the index is rebuilt from the slot headers.
CORRUPT = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError)
Slot = tuple[int, int]  # (slab, slot)


class Location(NamedTuple):
    """Where a block lives and how recent it is. A named tuple, not a dataclass: every
    get builds one per block from the index, and a tuple's constructor is a third of a
    frozen dataclass's (~0.2 against ~0.55 µs; a 32-block get looks up 32 before its
    first read goes in)."""

    slab: int
    slot: int
    bucket: int
    seq: int
    gen: int


@dataclass(frozen=True, slots=True)
class SlabInfo:
    block_bytes: int
    used: int


def _no_hook() -> None:
    pass


class Index:
    def __init__(
        self,
        path: Path,
        *,
        map_bytes: int,
        slab_bytes: int,
        adopt_stored: bool = False,
        strict: bool = False,
        on_sync: Callable[[], None] = _no_hook,
    ) -> None:
        """``adopt_stored``: an existing index's slab size wins over ``slab_bytes``
        (which was only a default); otherwise a different one is an ``SSDFormatError``.
        ``strict``: every commit is synced (LMDB ``sync``/``metasync``); otherwise commits
        only reach the page cache and ``sync()`` makes them durable (DESIGN §6: the index
        is then rebuilt from the slot headers after a power cut). ``on_sync`` runs after
        each point where the index became durable (tests simulate power cuts with it)."""
        path.mkdir(parents=True, exist_ok=True)
        self.strict = strict
        self._on_sync = on_sync
        # The fast mode writes pages in place (``writemap``; strict mode would ``msync``
        # the whole map per commit), with the file allocated ahead (``index_room.py``);
        # where even that room is refused (a full disk at open) it writes its pages with
        # ``pwrite``, as the strict mode does (without the strict mode's syncs).
        self.room: MapRoom | None = None
        self.env = self._open(path, map_bytes, writemap=not strict)
        if not strict:
            try:
                self.room = MapRoom(self.env, path)
                self.room.ensure()
            except (SSDIOError, OSError) as e:
                if self.room is not None:
                    self.room.close()
                    self.room = None
                self.env.close()
                log.warning("SSD index %s: no room to map it for writing (%s)", path, e)
                self.env = self._open(path, map_bytes, writemap=False)
        db = self.env.open_db
        self.meta, self.keys, self.lru = db(b"meta"), db(b"keys"), db(b"lru")
        self.slots, self.free, self.quar, self.slabs = (
            db(b"slots"),
            db(b"free"),
            db(b"quar"),
            db(b"slabs"),
        )
        try:
            self.slab_bytes = self._check_format(path, slab_bytes, adopt_stored)
        except BaseException:
            self.close()
            raise

    def _open(self, path: Path, map_bytes: int, *, writemap: bool) -> lmdb.Environment:
        try:
            return lmdb.open(
                str(path),
                map_size=map_bytes,
                max_dbs=8,
                subdir=True,
                sync=self.strict,
                metasync=self.strict,
                writemap=writemap,
                readahead=False,
                max_readers=512,
                lock=True,
            )
        except CORRUPT:
            raise  # the opener rebuilds the index from the slot headers
        except lmdb.Error as e:
            raise SSDFormatError(f"cannot open SSD index {path}: {e}") from e

    def _check_format(self, path: Path, slab_bytes: int, adopt_stored: bool) -> int:
        with self.env.begin(write=True) as txn:
            fmt = txn.get(b"format", db=self.meta)
            have = txn.get(b"slab_bytes", db=self.meta)
            if fmt is None:
                txn.put(b"format", FORMAT, db=self.meta)
                txn.put(b"slab_bytes", str(slab_bytes).encode(), db=self.meta)
                return slab_bytes
        if fmt != FORMAT:
            raise SSDFormatError(
                f"SSD index {path} has format {fmt!r}, this build reads {FORMAT!r}"
            )
        stored = int(have) if have else 0
        if stored != slab_bytes and not (adopt_stored and stored):
            raise SSDFormatError(
                f"SSD directory was created with slab_bytes={stored or '?'}, not {slab_bytes}"
            )
        return stored

    def begin(self) -> Txn:
        """A read-only transaction."""
        return self.env.begin()

    @contextmanager
    def write(self, grows_bytes: int = 0) -> Iterator[Txn]:
        """A write transaction, committed when the block exits (aborted on an exception).
        Never held across device I/O (but by a put alone in flight, ``writer.py``): LMDB
        has one writer at a time, and a put's reservation needs it while other puts'
        writes are in flight. ``grows_bytes``: what its new records may take, where that
        is more than a few hundred (``index_room.RECORD_BYTES`` each)."""
        txn = self.begin_write(grows_bytes)
        try:
            yield txn
        except BaseException:
            txn.abort()
            raise
        self.commit(txn)

    def begin_write(self, grows_bytes: int = 0) -> Txn:
        """A write transaction the caller ends with ``commit`` or ``txn.abort()``; raises
        ``SSDIOError`` where the index file has no room for it (nothing written)."""
        txn = self.env.begin(write=True)
        if self.room is not None:
            try:  # under the writer lock: no other transaction grows the file meanwhile
                self.room.ensure(grows_bytes)
            except BaseException:
                txn.abort()
                raise
        return txn

    def commit(self, txn: Txn) -> None:
        txn.commit()
        if self.strict:
            self._on_sync()

    def sync(self) -> None:
        """Make every committed transaction durable."""
        self.env.sync(True)
        self._on_sync()

    def close(self) -> None:
        self.env.close()
        if self.room is not None:
            self.room.close()
            self.room = None

    # -- records --------------------------------------------------------------------
    def get(self, txn: Txn, fkey: bytes) -> Location | None:
        v = txn.get(fkey, db=self.keys)
        return None if v is None else Location._make(_LOC.unpack(v))

    def insert(self, txn: Txn, fkey: bytes, loc: Location, used: SlabDeltas | None = None) -> None:
        """Publish ``fkey`` at a slot that must be free (the data is already durable).
        With ``used``, slab use counts are batched there (flush it before commit)."""
        bb = self._add_used(txn, loc.slab, +1) if used is None else used.bump(txn, loc.slab, +1)
        if not txn.delete(_FREE.pack(bb, loc.slab, loc.slot), db=self.free):
            raise IntegrityError(
                f"publishing {fkey.hex()} into slot {loc.slab}/{loc.slot}, which is not free"
            )
        txn.put(fkey, _LOC.pack(loc.slab, loc.slot, loc.bucket, loc.seq, loc.gen), db=self.keys)
        txn.put(_LRU.pack(loc.bucket, loc.seq) + fkey, b"", db=self.lru)
        txn.put(_SLOT.pack(loc.slab, loc.slot), fkey, db=self.slots)

    def remove(
        self,
        txn: Txn,
        fkey: bytes,
        loc: Location,
        *,
        reason: bytes = b"",
        used: SlabDeltas | None = None,
    ) -> None:
        """Drop ``fkey``; its slot becomes free — or quarantined when ``reason`` is given.
        The slot is reusable only once this transaction commits."""
        txn.delete(fkey, db=self.keys)
        txn.delete(_LRU.pack(loc.bucket, loc.seq) + fkey, db=self.lru)
        txn.delete(_SLOT.pack(loc.slab, loc.slot), db=self.slots)
        bb = self._add_used(txn, loc.slab, -1) if used is None else used.bump(txn, loc.slab, -1)
        if reason:
            txn.put(_SLOT.pack(loc.slab, loc.slot), reason, db=self.quar)
        else:
            txn.put(_FREE.pack(bb, loc.slab, loc.slot), b"", db=self.free)

    def adopt(
        self,
        txn: Txn,
        found: list[tuple[bytes, int, int, int]],
        bucket_of: Callable[[float], int],
    ) -> int:
        """Rebuild: publish blocks found on disk as (fkey, created µs, slab, slot), with
        seq = gen = created µs; of two slots with one key the newer stays, the other is
        freed. Returns how many records were added (net)."""
        used = self.deltas()
        added = 0
        for fk, created, slab, slot in found:
            cur = self.get(txn, fk)
            if cur is not None:
                if cur.gen >= created:
                    continue
                self.remove(txn, fk, cur, used=used)
                added -= 1
            loc = Location(slab, slot, bucket_of(created / 1e6), created, created)
            self.insert(txn, fk, loc, used)
            added += 1
        used.flush(txn)
        return added

    def retouch(self, txn: Txn, fkey: bytes, loc: Location, bucket: int, seq: int) -> None:
        txn.delete(_LRU.pack(loc.bucket, loc.seq) + fkey, db=self.lru)
        txn.put(_LRU.pack(bucket, seq) + fkey, b"", db=self.lru)
        txn.put(fkey, _LOC.pack(loc.slab, loc.slot, bucket, seq, loc.gen), db=self.keys)

    def _add_used(self, txn: Txn, slab: int, delta: int) -> int:
        k = _U32.pack(slab)
        v = txn.get(k, db=self.slabs)
        if v is None:
            raise IntegrityError(f"slab {slab} has no record")
        bb, used = _SLAB.unpack(v)
        txn.put(k, _SLAB.pack(bb, used + delta), db=self.slabs)
        return int(bb)

    def deltas(self) -> SlabDeltas:
        return SlabDeltas(self)

    def seq_high_water(self, txn: Txn) -> int:
        v = txn.get(b"seq", db=self.meta)
        return int(v) if v else 0

    def set_seq_high_water(self, txn: Txn, seq: int) -> None:
        txn.put(b"seq", str(seq).encode(), db=self.meta)

    def note_probe(self, txn: Txn, t: float) -> None:
        """A degraded tier's probe: proves the index takes a write again."""
        txn.put(b"probe", repr(t).encode(), db=self.meta)

    # -- slabs ----------------------------------------------------------------------
    def slab_table(self, txn: Txn) -> dict[int, SlabInfo]:
        return {_U32.unpack(k)[0]: SlabInfo(*_SLAB.unpack(v)) for k, v in txn.cursor(db=self.slabs)}

    def create_slab(self, txn: Txn, slab: int, block_bytes: int, nslots: int) -> None:
        txn.put(_U32.pack(slab), _SLAB.pack(block_bytes, 0), db=self.slabs)
        for s in range(nslots):
            txn.put(_FREE.pack(block_bytes, slab, s), b"", db=self.free)

    def retire_slab(self, txn: Txn, slab: int, block_bytes: int, nslots: int) -> None:
        """Forget an empty slab: its free and quarantined slots go with it."""
        raw = txn.get(_U32.pack(slab), db=self.slabs)
        if raw is None:
            raise IntegrityError(f"slab {slab} has no record")
        info = SlabInfo(*_SLAB.unpack(raw))
        if info.used:
            raise IntegrityError(f"slab {slab} retired with {info.used} live blocks")
        for s in range(nslots):
            txn.delete(_FREE.pack(block_bytes, slab, s), db=self.free)
            txn.delete(_SLOT.pack(slab, s), db=self.quar)
        txn.delete(_U32.pack(slab), db=self.slabs)

    # -- scans ----------------------------------------------------------------------
    def iter_free(self, txn: Txn, block_bytes: int) -> Iterator[tuple[int, int]]:
        prefix = _BB.pack(block_bytes)
        cur = txn.cursor(db=self.free)
        if not cur.set_range(prefix):
            return
        for k in cur.iternext(keys=True, values=False):
            if not k.startswith(prefix):  # type: ignore[union-attr]
                return
            _, slab, slot = _FREE.unpack(k)
            yield slab, slot

    def iter_lru(self, txn: Txn, *, below_bucket: int | None = None) -> Iterator[bytes]:
        """Keys (fingerprint‖key) from least to most recently used."""
        for k in txn.cursor(db=self.lru).iternext(keys=True, values=False):
            if below_bucket is not None and _LRU.unpack_from(k)[0] >= below_bucket:
                return
            yield bytes(k[_LRU.size :])

    def iter_slab(self, txn: Txn, slab: int) -> Iterator[bytes]:
        prefix = _U32.pack(slab)
        cur = txn.cursor(db=self.slots)
        if not cur.set_range(prefix):
            return
        for k, v in cur:
            if not k.startswith(prefix):  # type: ignore[union-attr]
                return
            yield bytes(v)

    def iter_namespace(self, txn: Txn, fingerprint: bytes) -> Iterator[bytes]:
        cur = txn.cursor(db=self.keys)
        if not cur.set_range(fingerprint):
            return
        for k in cur.iternext(keys=True, values=False):
            if not k.startswith(fingerprint):  # type: ignore[union-attr]
                return
            yield bytes(k)

    def count(self, txn: Txn) -> int:
        return int(txn.stat(self.keys)["entries"])


class SlabDeltas:
    """Slab use-count changes of many inserts/removes in one transaction, written once
    per slab by ``flush`` instead of once per block."""

    def __init__(self, index: Index) -> None:
        self._index = index
        self._class: dict[int, int] = {}
        self._delta: Counter[int] = Counter()

    def bump(self, txn: Txn, slab: int, delta: int) -> int:
        bb = self._class.get(slab)
        if bb is None:
            bb = self._class[slab] = self._index._add_used(txn, slab, 0)
        self._delta[slab] += delta
        return bb

    def flush(self, txn: Txn) -> None:
        for slab, d in self._delta.items():
            if d:
                self._index._add_used(txn, slab, d)
        self._delta.clear()
