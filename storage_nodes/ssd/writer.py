"""Group commit: reserve slots, write and sync the data, then publish in one transaction.

The order is the crash-safety argument: a block is named by the index only after its
bytes are durable, and the slots it lands in were free in a committed transaction. The
publishing transaction is filled while the device works (once every write and the data
sync are submitted) and committed only after the sync completed: its records cost no
time on the critical path, and a failed write or sync aborts it, so nothing of the group
is ever published without its data. Other writers wait for LMDB's writer lock meanwhile
(one device round at most); readers never wait.
"""

from __future__ import annotations

from collections.abc import Sequence

from storage_nodes.ssd.allocator import Slot, SlotAllocator
from storage_nodes.ssd.blockio import BlockIO
from storage_nodes.ssd.config import SSDConfig
from storage_nodes.ssd.index import Index, Location, Txn
from storage_nodes.ssd.lookup import LiveIndex
from storage_nodes.ssd.recency import Recency, Stamp


class GroupCommit:
    def __init__(
        self,
        config: SSDConfig,
        index: Index,
        view: LiveIndex,
        recency: Recency,
        alloc: SlotAllocator,
        blocks: BlockIO,
    ) -> None:
        self._config = config
        self._index = index
        self._view = view
        self._recency = recency
        self._alloc = alloc
        self._blocks = blocks

    def write(
        self,
        fingerprint: bytes,
        block_bytes: int,
        idx: list[int],
        fkeys: list[bytes],
        data: memoryview,
        stamps: Sequence[Stamp],
        checksums: Sequence[int] | None = None,
    ) -> tuple[int, int]:
        """Store rows ``idx`` of ``data`` (``checksums[i]``, made at commit, for row ``i``;
        ``None``: computed); returns (inserted, raced: published meanwhile by another
        put). Rows that find no room are left out (the head of the chain is kept).
        Raises the store's I/O or LMDB error; nothing of the group is published then."""
        slots = self._alloc.reserve(block_bytes, len(idx))
        idx = idx[: len(slots)]
        if not idx:
            return 0, 0
        bb = block_bytes
        txn: Txn | None = None
        published: set[int] = set()
        raced = 0

        def while_busy() -> None:  # the device writes the group meanwhile
            nonlocal txn, published, raced
            txn = self._index.begin_write()
            published, raced = self._publish(txn, idx, fkeys, slots, stamps)
            self._index.set_seq_high_water(txn, self._recency.high_water)

        try:
            self._blocks.write_durable(
                fingerprint,
                bb,
                [fkeys[i][16:] for i in idx],
                data,
                idx,
                slots,
                None if checksums is None else [checksums[i] for i in idx],
                while_busy=while_busy,
            )
            assert txn is not None  # while_busy ran, or write_durable raised
            self._config.crash_point("inside_index_commit")
            self._index.commit(txn)
        except BaseException:
            if txn is not None:
                txn.abort()
            self._alloc.release(slots, still_free=True)
            raise
        self._alloc.release([slots[j] for j in published], still_free=False)
        unused = [slots[j] for j in range(len(idx)) if j not in published]
        self._alloc.release(unused, still_free=True)
        return len(published), raced

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
