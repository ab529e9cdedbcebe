"""The index of one DRAM size class: which slot holds each key, for which namespace,
its checksum and its recency.

The maps are plain dicts that the tier changes in place under its lock and never
replaces: ``rows`` hands the same dicts to the row copier, whose native look-up reads
them in the same call that copies (``RowCopier.copy_found``).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvstore.dram_pool import SizeClass
from kvstore.errors import IntegrityError
from kvstore.eviction import EvictionPolicy
from kvstore.keys import Key
from kvstore.row_copy import KeyIndex


class ClassIndex:
    """Index and recency of one size class (the tier locks)."""

    def __init__(self, sc: SizeClass, policy: EvictionPolicy, chunk_bytes: int) -> None:
        self.sc = sc
        self.policy = policy
        self.slot: dict[Key, int] = {}
        self.owner: dict[Key, bytes] = {}  # key -> namespace fingerprint
        self.stamp: dict[Key, int] = {}  # logical clock of last access, for cross-class choice
        self.csum: dict[Key, int] = {}  # xxh3-64 of the payload as committed
        self.retired: set[int] = set()  # slots of dropped blocks still held by a lease
        self.rows = KeyIndex(self.owner, self.slot, self.csum, sc.slots_per_chunk, chunk_bytes)

    def touch_held(self, keys: Sequence[Key], fingerprint: bytes, tick: int) -> int:
        """Refresh the recency of those ``keys`` held for ``fingerprint`` (others are
        skipped), as ``touch_found`` does; returns the logical clock after the last stamp."""
        touch, stamp, owner = self.policy.touch, self.stamp, self.owner
        for key in reversed(keys):
            if owner.get(key) == fingerprint and touch(key):
                tick += 1
                stamp[key] = tick
        return tick

    def touch_found(self, keys: Sequence[Key], n: int, tick: int) -> int:
        """Refresh the recency of ``keys[:n]``, all held (a read just found them, so no
        owner check), last first so the first ends most recent; pinned ones are outside
        the policy and keep their stamp. Returns the logical clock after the last stamp
        given."""
        touch, stamp = self.policy.touch, self.stamp
        for i in range(n - 1, -1, -1):
            key = keys[i]
            if touch(key):
                tick += 1
                stamp[key] = tick
        return tick

    def check_maps(self) -> None:
        """The maps agree with each other and ``rows`` reads them."""
        bb = self.sc.block_bytes
        slots = list(self.slot.values())
        if len(set(slots)) != len(slots):
            raise IntegrityError(f"class {bb}: two keys share a slot")
        if set(self.owner) != set(self.slot) or set(self.stamp) != set(self.slot):
            raise IntegrityError(f"class {bb}: owner/stamp maps disagree with the index")
        if set(self.csum) != set(self.slot):
            raise IntegrityError(f"class {bb}: checksums disagree with the index")
        r = self.rows
        if not (r.owner is self.owner and r.slots is self.slot and r.sums is self.csum):
            raise IntegrityError(f"class {bb}: the copier's index is not the tier's")
        if r.slots_per_chunk != self.sc.slots_per_chunk:
            raise IntegrityError(f"class {bb}: the copier's layout is not the pool's")
