"""One preallocated host buffer carved into fixed-size chunks, lent to size classes.

Why chunks: a DRAM tier serves several block sizes (one per registered ``block_bytes``)
out of one budget. Giving every class a fixed share wastes memory when the mix
changes; per-block malloc fragments it. Chunks of ``chunk_bytes`` are lent to a class
on demand and taken back whole when another class needs room (DESIGN §6).

The buffer is a torch tensor so it can be pinned (page-locked) when CUDA is present:
HBM↔DRAM copies from pinned memory run at full PCIe/NVLink speed and can be async.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from kvstore.errors import IntegrityError, InvalidArgument


def slot_offset(slot: int, slots_per_chunk: int, chunk_bytes: int, block_bytes: int) -> int:
    """Where slot ``slot`` of a class lies in the buffer (``kvstore/_rowcopy.c`` computes
    the same in its index look-up)."""
    chunk, idx = divmod(slot, slots_per_chunk)
    return chunk * chunk_bytes + idx * block_bytes


@dataclass
class SizeClass:
    """The slots of one block size. A slot id encodes ``chunk * slots_per_chunk + index``,
    so taking a chunk away never renumbers the slots of other chunks."""

    block_bytes: int
    slots_per_chunk: int
    chunks: set[int] = field(default_factory=set)
    free: list[int] = field(default_factory=list)

    @property
    def slot_count(self) -> int:
        return len(self.chunks) * self.slots_per_chunk

    def chunk_of(self, slot: int) -> int:
        return slot // self.slots_per_chunk


class DramPool:
    """The shared buffer and its chunk allocator. Not thread-safe: the tier locks."""

    def __init__(self, capacity_bytes: int, chunk_bytes: int, *, pin_memory: bool) -> None:
        if chunk_bytes <= 0 or capacity_bytes < 0:
            raise InvalidArgument("DRAM capacity must be >= 0 and chunk size > 0")
        self.chunk_bytes = chunk_bytes
        self.n_chunks = capacity_bytes // chunk_bytes
        self.capacity_bytes = self.n_chunks * chunk_bytes
        self.pinned = pin_memory
        if pin_memory:
            self.tensor = torch.empty(self.capacity_bytes, dtype=torch.uint8, pin_memory=True)
        else:
            # numpy asks the kernel for transparent huge pages on large buffers (torch's
            # allocator does not): out of cache, copies over 4 KiB pages pay a TLB miss
            # per page (memcpy out of cache: 21 vs 17 GB/s here, bench/RESULTS.md).
            self.tensor = torch.from_numpy(np.empty(self.capacity_bytes, np.uint8))
        self._np = self.tensor.numpy() if self.capacity_bytes else np.empty(0, np.uint8)
        self.view = self._np.data
        self.free_chunks: list[int] = list(range(self.n_chunks - 1, -1, -1))
        self.classes: dict[int, SizeClass] = {}

    def size_class(self, block_bytes: int) -> SizeClass:
        sc = self.classes.get(block_bytes)
        if sc is None:
            if block_bytes > self.chunk_bytes:
                raise InvalidArgument(
                    f"block of {block_bytes} bytes does not fit a DRAM chunk of {self.chunk_bytes}"
                    " bytes: raise the chunk size"
                )
            sc = SizeClass(block_bytes, self.chunk_bytes // block_bytes)
            self.classes[block_bytes] = sc
        return sc

    def offset(self, sc: SizeClass, slot: int) -> int:
        return slot_offset(slot, sc.slots_per_chunk, self.chunk_bytes, sc.block_bytes)

    def slot_view(self, sc: SizeClass, slot: int) -> memoryview:
        off = self.offset(sc, slot)
        return self.view[off : off + sc.block_bytes]

    def grant_chunk(self, sc: SizeClass) -> bool:
        """Lend a free chunk to ``sc``; False when none is free."""
        if not self.free_chunks:
            return False
        chunk = self.free_chunks.pop()
        sc.chunks.add(chunk)
        base = chunk * sc.slots_per_chunk
        # pop() hands out descending slots: a put inserts a chain last→first, so its
        # blocks land in ascending memory in chain order and a read of the chain is one
        # copy.
        sc.free.extend(range(base, base + sc.slots_per_chunk))
        return True

    def release_chunk(self, sc: SizeClass, chunk: int) -> None:
        """Take back a chunk all of whose slots are free in ``sc``."""
        lo, hi = chunk * sc.slots_per_chunk, (chunk + 1) * sc.slots_per_chunk
        remaining = [s for s in sc.free if not lo <= s < hi]
        if len(sc.free) - len(remaining) != sc.slots_per_chunk:
            raise IntegrityError(f"chunk {chunk} still has live slots")
        sc.free = remaining
        sc.chunks.remove(chunk)
        self.free_chunks.append(chunk)

    def move(self, sc: SizeClass, src_slot: int, dst_slot: int) -> None:
        self.slot_view(sc, dst_slot)[:] = self.slot_view(sc, src_slot)

    def check_integrity(self, live_slots: dict[int, set[int]]) -> None:
        """``live_slots[block_bytes]`` = slots holding data in that class."""
        owned = list(self.free_chunks)
        for bb, sc in self.classes.items():
            owned.extend(sc.chunks)
            valid = {
                c * sc.slots_per_chunk + i for c in sc.chunks for i in range(sc.slots_per_chunk)
            }
            free = set(sc.free)
            live = live_slots.get(bb, set())
            if len(free) != len(sc.free):
                raise IntegrityError(f"class {bb}: a slot is on the free list twice")
            if free & live:
                raise IntegrityError(f"class {bb}: a live slot is also free")
            if free | live != valid:
                raise IntegrityError(f"class {bb}: slots leaked or out of range")
        if sorted(owned) != list(range(self.n_chunks)):
            raise IntegrityError("DRAM chunks leaked or lent twice")
