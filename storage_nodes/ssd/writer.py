"""Group commit: reserve slots, write the data, then publish in one transaction.

The order is the crash-safety argument: a block is named by the index only after its
bytes were written to the slots it names, and those slots were free in a committed
transaction. When the data is synced is the ``DataSync`` policy's (``syncer.py``): in
``per_put`` (and strict) mode the writes and their sync complete before the publish, so
a block is named only once durable; in the default ``behind`` mode a power cut may drop
writes the index names — the fast mode's index is then rebuilt from the slot headers,
and a slot whose write was lost holds its previous block whole (a valid block of
another key) or fails its checksum (a counted miss), never wrong bytes.

The publishing transaction is short (the records of one group, no sync of its own in
the default index mode) and, with another put in flight, begins only once the writes
(and sync) completed: LMDB has one writer at a time, so a transaction held across the
device round would make the other put's reservation (its eviction transaction) wait for
this put's I/O. With the writer lock free during I/O, two group commits overlap — the
second reserves, encodes and submits while the first's writes are in flight — which is
what keeps the device's queue from draining between puts. A put alone in flight (in the
default ``data_sync="behind"``) instead fills its publishing transaction while its writes
are in flight, and commits it once they completed: nobody waits for the lock then, and
the ~250 µs of records no longer follow the last write with the device idle. The commit
still comes after every write of the group; a failed write or sync aborts it and
publishes nothing of the group. Readers never wait.

On a full store a put also evicts, while its writes are in flight, the room the next
put of its size will need (``SlotAllocator.stock``): the next put then reserves free
slots without a write transaction, and its first write goes in ~0.15 ms into the call
instead of after an eviction (0.1–0.7 ms on a store whose least recent blocks are
scattered over its slabs). Beside another put the eviction still runs during this put's
writes, and the other put's reservation finds its room made. At most one put's room is
kept ahead, and only at capacity.

A put of 16 blocks or more that is alone in flight reserves only a quarter of its slots
before its first write goes in and the rest while those writes are in flight
(``_first_reserved``); their writes join the same batch. On a full store a reservation
is an eviction, so a one-caller put no longer leaves the device idle through most of it.
Beside another put it reserves everything at once: the other put's writes keep the
device busy meanwhile, and one transaction costs less CPU. Where the later rows can join
the batch (rows moved direct, checksums given), the put has looked up only its first
writes' keys too, and looks up the rest as it reserves their slots (``later``,
``lookup.PutLookup``). The order above still holds: every
slot is free in a committed transaction before it is written, and the group is published
once, after all of its writes. A put that syncs its data reserves everything first (its
files must be known before the batch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from storage_nodes.ssd.allocator import SlotAllocator
from storage_nodes.ssd.blockio import BlockIO
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.index import Index, Location, Slot, Txn
from storage_nodes.ssd.lookup import LiveIndex
from storage_nodes.ssd.recency import Recency, Stamp
from storage_nodes.ssd.syncer import DataSync


def _first_reserved(n: int) -> int:
    """Slots a put of ``n`` blocks reserves before its first write goes in; the rest are
    reserved while those writes are in flight, and their writes join the same batch.

    On a full store a reservation is an eviction (an LMDB write transaction of the blocks
    that make room) and the device idles through it: ~230 µs of a ~2.9 ms put of 32
    blocks here, with its first write submitted ~460 µs into the call. A quarter first
    leaves the device working on those (a quarter of 32 is ~0.5 ms of writes) while the
    rest are reserved; a put of fewer than 16 reserves all at once, as before. Only a put
    alone in flight splits (``GroupCommit._write``)."""
    return n if n < 16 else n // 4


class GroupCommit:
    def __init__(
        self,
        config: SSDConfig,
        index: Index,
        view: LiveIndex,
        recency: Recency,
        alloc: SlotAllocator,
        blocks: BlockIO,
        sync: DataSync,
    ) -> None:
        self._config = config
        self._index = index
        self._view = view
        self._recency = recency
        self._alloc = alloc
        self._blocks = blocks
        self._sync = sync
        self._lock = threading.Lock()
        self._writing = 0  # puts between their first reservation and their publish

    def write(
        self,
        fingerprint: bytes,
        block_bytes: int,
        idx: list[int],
        fkeys: list[bytes],
        data: memoryview,
        stamps: Sequence[Stamp],
        checksums: Sequence[int] | None = None,
        later: Callable[[], list[int]] | None = None,
    ) -> tuple[int, int]:
        """Store rows ``idx`` of ``data`` (``checksums[i]``, made at commit, for row ``i``;
        ``None``: computed); returns (inserted, raced: published meanwhile by another
        put). Rows that find no room are left out (the head of the chain is kept).
        ``later``: the rows after ``idx`` still to be looked up (``PutLookup.later``),
        called once — while the first writes are in flight when this put reserves in
        two steps, else at once — and stored after ``idx``; not called if not even
        ``idx`` finds room. Raises the store's I/O or LMDB error; nothing of the group
        is published then."""
        with self._counted():
            # Alone, the device idles through a reservation: reserve in two steps. Beside
            # another put its writes keep the device busy, and one transaction costs less
            # CPU than two (two callers of 16 were CPU-bound: +14 % reserving at once).
            whole = self._sync.per_put or not self._alone()
            idx = list(idx)
            if later is not None and (whole or not idx):
                idx += later()
                later = None
            if later is not None:
                first = len(idx)  # the first writes' keys, the only ones looked up yet
            else:
                first = len(idx) if whole else _first_reserved(len(idx))
            slots = self._alloc.reserve(block_bytes, first)
            keys = [fkeys[i][16:] for i in idx]
            sums = None if checksums is None else [checksums[i] for i in idx]
            rest: list[Slot] = []
            early: list[tuple[Txn, set[int], int]] = []  # the publish, filled during the writes

            def more_slots() -> list[Slot]:
                if later is not None:  # write_slots reads rows, keys and sums as it goes
                    extra = later()
                    idx.extend(extra)
                    keys.extend(fkeys[i][16:] for i in extra)
                    if sums is not None and checksums is not None:
                        sums.extend(checksums[i] for i in extra)
                rest.extend(self._alloc.reserve(block_bytes, len(idx) - first))
                return rest

            def in_flight(written: Sequence[Slot]) -> None:
                # The next put's room is made now (``SlotAllocator.stock``), while the
                # device works. Alone, this put also fills its publishing transaction (it
                # commits only after its writes completed): nobody waits for the writer
                # lock meanwhile. With another put in flight that would hold up the other
                # put until these writes end, so it publishes after them instead.
                self._alloc.stock(block_bytes, len(idx))
                if self._alone():
                    done = list(written)
                    early.append(self._filled(idx[: len(done)], fkeys, done, stamps))

            if not slots:
                return 0, 0
            # short of ``first``: no room for more
            split = len(slots) == first and (later is not None or len(slots) < len(idx))
            try:
                written = self._blocks.write_slots(
                    fingerprint,
                    block_bytes,
                    keys,
                    data,
                    idx,
                    slots,
                    sums,
                    sync=self._sync.per_put,
                    more_slots=more_slots if split else None,
                    in_flight=None if self._sync.per_put else in_flight,
                    grows_to=len(fkeys) if later is not None else 0,
                )
            except BaseException:
                for txn, _, _ in early:
                    txn.abort()
                self._alloc.release(slots + rest)
                raise
            slots, slabs = written.slots, written.slabs
            idx = idx[: len(slots)]
            try:
                filled = early[0] if early else self._filled(idx, fkeys, slots, stamps)
                txn, published, raced = filled
                try:
                    self._index.set_seq_high_water(txn, self._recency.high_water)
                    self._config.crash_point("inside_index_commit")
                except BaseException:
                    txn.abort()
                    raise
                # Noted for the syncer as the commit makes them visible, in one step: a
                # put that then finds these keys present acknowledges them on the
                # strength of this data, and its ``sync`` must cover it. (Noted after the
                # commit, such a sync could return with these writes unsynced; before
                # it, a crash in the syncer's round would not tell whether the put had
                # published — the crash-point tests rely on that order.)
                with self._sync.publishing(slabs):
                    self._index.commit(txn)
            except BaseException:
                self._alloc.release(slots)
                raise
            self._alloc.settle(slots, published)
            return len(published), raced

    def ahead(
        self, n: int, block_bytes: int, data: memoryview, checksums: Sequence[int] | None
    ) -> int:
        """Of a put of ``n`` blocks, how many keys are looked up before its first writes
        go in (``PutLookup``): those of its first reservation where the rest can join
        its batch later — one batch, rows moved without a staging copy, checksums made
        at commit (an encoder job covers only the rows known at its start); else all."""
        if (
            checksums is None
            or n > self._blocks.per_batch(block_bytes)
            or not self._blocks.direct(block_bytes, data)
        ):
            return n
        return _first_reserved(n)

    @contextmanager
    def _counted(self) -> Iterator[None]:
        """Counts this put among those between reservation and publish (``_alone``)."""
        with self._lock:
            self._writing += 1
        try:
            yield
        finally:
            with self._lock:
                self._writing -= 1

    def _alone(self) -> bool:
        """Whether this put is the only one between reservation and publish now."""
        with self._lock:
            return self._writing == 1

    def _filled(
        self, idx: list[int], fkeys: list[bytes], slots: list[Slot], stamps: Sequence[Stamp]
    ) -> tuple[Txn, set[int], int]:
        """A write transaction holding the group's records (``_publish``), not committed;
        aborted if filling it fails."""
        txn = self._index.begin_write()
        try:
            return (txn, *self._publish(txn, idx, fkeys, slots, stamps))
        except BaseException:
            txn.abort()
            raise

    def _publish(
        self,
        txn: Txn,
        idx: list[int],
        fkeys: list[bytes],
        slots: list[Slot],
        stamps: Sequence[Stamp],
    ) -> tuple[set[int], int]:
        """Index records for the group, inside the publishing transaction."""
        expiry = self._view.expiry()
        published: set[int] = set()
        raced = 0
        index = self._index
        used = index.deltas()
        for j, i in enumerate(idx):
            fk = fkeys[i]
            cur = index.get(txn, fk)
            if cur is not None:
                if self._view.live(fk, cur, expiry):
                    raced += 1  # another put published it first; our slot stays free
                    continue
                index.remove(txn, fk, cur, used=used)  # replace the expired copy
            bucket, seq = stamps[i]
            slab, slot = slots[j]
            index.insert(txn, fk, Location(slab, slot, bucket, seq, seq), used)
            published.add(j)
        used.flush(txn)
        return published, raced
