"""This daemon's own blocks of one namespace: segments, free slots and recency.

Only the owner ever evicts, expires or rewrites these slots. Recency is exact for what
this daemon did (every get/put/touch moves a key, last→first, DESIGN §6) and coarse for
what peers did (their TOUCH records move a key when the owner reads them). The order is
a global sequence number, so the least recently used block of all namespaces can be
found by comparing the heads of each namespace's order.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from kvstore.errors import IntegrityError


class OwnBlock(NamedTuple):
    seg: int
    slot: int
    born_s: int
    seq: int


@dataclass
class Segment:
    seg_id: int
    slots: int
    used: int = 0
    reserved: int = 0


@dataclass
class OwnSpace:
    """Not thread-safe: the tier guards it with its lock."""

    tenant: str
    fingerprint: bytes
    block_bytes: int
    slot_bytes: int
    slots_per_segment: int
    segments: dict[int, Segment] = field(default_factory=dict)
    lru: OrderedDict[bytes, OwnBlock] = field(default_factory=OrderedDict)
    free: list[tuple[int, int]] = field(default_factory=list)

    # -- segments ---------------------------------------------------------------------
    def add_segment(self, seg_id: int, used_slots: set[int] | None = None) -> None:
        used_slots = used_slots or set()
        self.segments[seg_id] = Segment(seg_id, self.slots_per_segment)
        # popped from the end: slot 0 first, so a segment fills front to back
        self.free.extend(
            (seg_id, s) for s in reversed(range(self.slots_per_segment)) if s not in used_slots
        )

    def remove_segment(self, seg_id: int) -> list[bytes]:
        """Forget a segment and every block in it; returns the keys that went."""
        gone = [k for k, b in self.lru.items() if b.seg == seg_id]
        for k in gone:
            del self.lru[k]
        self.free = [s for s in self.free if s[0] != seg_id]
        del self.segments[seg_id]
        return gone

    def empty_segment(self) -> int | None:
        """A segment holding nothing and written by no one (cheapest to hand over)."""
        for seg in self.segments.values():
            if seg.used == 0 and seg.reserved == 0:
                return seg.seg_id
        return None

    # -- slots ------------------------------------------------------------------------
    def take_free(self) -> tuple[int, int] | None:
        if not self.free:
            return None
        seg, slot = self.free.pop()
        self.segments[seg].reserved += 1
        return seg, slot

    def unreserve(self, seg: int, slot: int, *, still_free: bool) -> None:
        s = self.segments.get(seg)
        if s is None:
            return
        s.reserved -= 1
        if still_free:
            self.free.append((seg, slot))

    def insert(self, key: bytes, block: OwnBlock) -> None:
        """Publish a reserved slot as holding ``key``."""
        self.lru[key] = block
        self.lru.move_to_end(key)
        self.segments[block.seg].used += 1

    def adopt(self, key: bytes, block: OwnBlock) -> None:
        """Recovery: a block the manifest names (its slot is not on the free list)."""
        if key in self.lru:
            self.remove(key)
        self.lru[key] = block
        self.segments[block.seg].used += 1

    def remove(self, key: bytes) -> OwnBlock | None:
        b = self.lru.pop(key, None)
        if b is not None:
            self.segments[b.seg].used -= 1
        return b

    def evict_batch(self, n: int, window: int) -> list[tuple[bytes, OwnBlock]]:
        """Take ``n`` slots (or fewer, if fewer blocks are held) among the ``window``
        least recently used blocks, as few segments as possible: the oldest block's
        segment first, then the segment of the oldest block left. A put syncs each
        segment it wrote, so LRU victims spread over every segment cost one sync each;
        this keeps eviction within the ``window`` oldest (approximate LRU) and the syncs
        to one or two. Each taken slot stays reserved for the put (``unreserve`` releases it)."""
        if n <= 0:
            return []
        cand: dict[int, list[bytes]] = {}  # segment -> keys, oldest first; dicts keep
        for i, (key, b) in enumerate(self.lru.items()):  # the order of first appearance
            if i >= max(window, n):
                break
            cand.setdefault(b.seg, []).append(key)
        out: list[tuple[bytes, OwnBlock]] = []
        for keys in cand.values():
            for key in keys[: n - len(out)]:
                b = self.lru.pop(key)
                seg = self.segments[b.seg]
                seg.used -= 1
                seg.reserved += 1
                out.append((key, b))
            if len(out) == n:
                break
        return out

    def oldest_seq(self) -> int | None:
        if not self.lru:
            return None
        return next(iter(self.lru.values())).seq

    def touch(self, key: bytes, seq: int) -> bool:
        b = self.lru.get(key)
        if b is None:
            return False
        self.lru[key] = b._replace(seq=seq)
        self.lru.move_to_end(key)
        return True

    # -- checks -----------------------------------------------------------------------
    def used_blocks(self) -> int:
        return len(self.lru)

    def check(self) -> None:
        used: dict[int, int] = dict.fromkeys(self.segments, 0)
        seen: set[tuple[int, int]] = set()
        last = -1
        for key, b in self.lru.items():
            if b.seg not in used:
                raise IntegrityError(f"block {key.hex()} in unknown segment {b.seg:x}")
            if not 0 <= b.slot < self.slots_per_segment:
                raise IntegrityError(f"block {key.hex()} in slot {b.slot} out of range")
            if (b.seg, b.slot) in seen:
                raise IntegrityError(f"two blocks in segment {b.seg:x} slot {b.slot}")
            if b.seq < last:
                raise IntegrityError("recency order does not follow sequence numbers")
            last = b.seq
            seen.add((b.seg, b.slot))
            used[b.seg] += 1
        for s in self.free:
            if s in seen:
                raise IntegrityError(f"slot {s} is both free and in use")
        if len(set(self.free)) != len(self.free):
            raise IntegrityError("a free slot is listed twice")
        for seg_id, seg in self.segments.items():
            if seg.used != used[seg_id]:
                raise IntegrityError(
                    f"segment {seg_id:x} counts {seg.used} blocks, holds {used[seg_id]}"
                )
            free_here = sum(1 for s in self.free if s[0] == seg_id)
            if seg.used + free_here + seg.reserved != seg.slots:
                raise IntegrityError(
                    f"segment {seg_id:x}: {seg.used} used + {free_here} free + "
                    f"{seg.reserved} reserved != {seg.slots} slots"
                )
