"""The index's integrity check: every cross-reference between its sub-databases
re-derived from the ``keys`` records (``SSDTier.check_integrity``)."""

from __future__ import annotations

from collections import Counter

from kvstore.errors import IntegrityError
from storage_nodes.ssd.config import slot_bytes_for
from storage_nodes.ssd.index import _FREE, _LOC, _LRU, _SLOT, FKEY_BYTES, Index, Location, Txn


def check_index(index: Index, txn: Txn, *, chunks: int, slab_bytes: int) -> None:
    """Raise ``IntegrityError`` on the first mismatch."""
    slabs = index.slab_table(txn)
    nslots = {s: slab_bytes // slot_bytes_for(i.block_bytes) for s, i in slabs.items()}
    for s in slabs:
        if not 0 <= s < chunks:
            raise IntegrityError(f"slab {s} outside the {chunks} chunks the capacity allows")
    hw = index.seq_high_water(txn)
    used: Counter[int] = Counter()
    taken: set[tuple[int, int]] = set()
    for k, v in txn.cursor(db=index.keys):
        loc = Location(*_LOC.unpack(v))
        if len(k) != FKEY_BYTES:
            raise IntegrityError(f"index key of {len(k)} bytes")
        if loc.slab not in slabs or not 0 <= loc.slot < nslots[loc.slab]:
            raise IntegrityError(f"key {bytes(k).hex()} points outside any slab: {loc}")
        if (loc.slab, loc.slot) in taken:
            raise IntegrityError(f"two keys share slab {loc.slab} slot {loc.slot}")
        taken.add((loc.slab, loc.slot))
        if txn.get(_SLOT.pack(loc.slab, loc.slot), db=index.slots) != k:
            raise IntegrityError(f"slot map disagrees for key {bytes(k).hex()}")
        if txn.get(_LRU.pack(loc.bucket, loc.seq) + k, db=index.lru) is None:
            raise IntegrityError(f"recency index lacks key {bytes(k).hex()}")
        if loc.seq > hw or loc.gen > hw:
            raise IntegrityError(
                f"key {bytes(k).hex()} has seq {loc.seq} above high water {hw}"
            )
        used[loc.slab] += 1
    n = len(taken)
    for name, db in (("lru", index.lru), ("slots", index.slots)):
        if txn.stat(db)["entries"] != n:
            raise IntegrityError(
                f"{name} holds {txn.stat(db)['entries']} entries, keys holds {n}"
            )
    free: Counter[int] = Counter()
    for k in txn.cursor(db=index.free).iternext(keys=True, values=False):
        bb, slab, slot = _FREE.unpack(k)
        info = slabs.get(slab)
        if info is None or info.block_bytes != bb or slot >= nslots[slab]:
            raise IntegrityError(f"free slot {slab}/{slot} of class {bb} matches no slab")
        if (slab, slot) in taken:
            raise IntegrityError(f"slot {slab}/{slot} is both free and in use")
        free[slab] += 1
    quar: Counter[int] = Counter()
    for k in txn.cursor(db=index.quar).iternext(keys=True, values=False):
        slab, slot = _SLOT.unpack(k)
        if slab not in slabs or slot >= nslots[slab] or (slab, slot) in taken:
            raise IntegrityError(f"quarantined slot {slab}/{slot} is invalid or in use")
        if txn.get(_FREE.pack(slabs[slab].block_bytes, slab, slot), db=index.free) is not None:
            raise IntegrityError(f"quarantined slot {slab}/{slot} is also free")
        quar[slab] += 1
    for s, info in slabs.items():
        if info.used != used[s]:
            raise IntegrityError(
                f"slab {s} records {info.used} used slots, index has {used[s]}"
            )
        if used[s] + free[s] + quar[s] != nslots[s]:
            raise IntegrityError(
                f"slab {s}: {used[s]} used + {free[s]} free + {quar[s]} quarantined "
                f"!= {nslots[s]} slots"
            )
