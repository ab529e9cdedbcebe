"""Moving encoded blocks between caller rows and slab slots.

Reads: one batch of slot reads into aligned staging memory, then each slot is verified
(magic, version, fingerprint, key, length, checksum) before its payload is copied out.
Writes: encode into aligned staging, one batch of slot writes, one data sync per slab
touched. Both split work into batches of at most ``staging_max_bytes``.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.block import encode_block_into, verify_block
from kvstore.errors import BlockError
from storage_nodes.ssd.config import SSDConfig, slot_bytes_for
from storage_nodes.ssd.errors import SSDIOError
from storage_nodes.ssd.index import Location
from storage_nodes.ssd.io_backend import IOBackend, IORequest
from storage_nodes.ssd.slabs import SlabFiles, StagingPool


@dataclass(frozen=True, slots=True)
class ReadFailure:
    """Why block ``index`` of a read was not returned: an errno or a failed check."""

    index: int
    loc: Location
    errno: int = 0
    error: BlockError | None = None


@dataclass(frozen=True, slots=True)
class ReadOutcome:
    copied: int
    failure: ReadFailure | None = None


class BlockIO:
    def __init__(self, config: SSDConfig, files: SlabFiles, io: IOBackend) -> None:
        self._config = config
        self._files = files
        self._io = io
        self._staging = StagingPool()

    def per_batch(self, block_bytes: int) -> int:
        return max(1, self._config.staging_max_bytes // slot_bytes_for(block_bytes))

    def read_prefix(
        self,
        fingerprint: bytes,
        block_bytes: int,
        keys: Sequence[bytes],
        locs: Sequence[Location],
        out: memoryview,
    ) -> ReadOutcome:
        """Copy verified payloads of ``locs`` into rows of ``out`` until the first failure."""
        sb = slot_bytes_for(block_bytes)
        step = self.per_batch(block_bytes)
        copied = 0
        for start in range(0, len(locs), step):
            part = locs[start : start + step]
            buf = self._staging.acquire(len(part) * sb)
            try:
                mv = memoryview(buf)
                reqs = []
                for j, loc in enumerate(part):
                    try:
                        fd = self._files.fd(loc.slab)
                    except SSDIOError as e:
                        return ReadOutcome(
                            copied, ReadFailure(start + j, loc, errno=e.errno or errno.EIO)
                        )
                    reqs.append(IORequest(fd, loc.slot * sb, mv[j * sb : (j + 1) * sb]))
                res = self._io.read_batch(reqs)
                for j, loc in enumerate(part):
                    i = start + j
                    if res[j] < 0:
                        return ReadOutcome(copied, ReadFailure(i, loc, errno=-res[j]))
                    try:
                        payload = verify_block(
                            mv[j * sb : (j + 1) * sb],
                            fingerprint=fingerprint,
                            key=keys[i],
                            payload_len=block_bytes,
                        )
                    except BlockError as e:
                        return ReadOutcome(copied, ReadFailure(i, loc, error=e))
                    out[i * block_bytes : (i + 1) * block_bytes] = payload
                    copied += 1
            finally:
                self._staging.release(buf)
        return ReadOutcome(copied)

    def write_durable(
        self,
        fingerprint: bytes,
        block_bytes: int,
        keys: Sequence[bytes],
        rows: Sequence[memoryview],
        slots: Sequence[tuple[int, int]],
    ) -> None:
        """Write ``rows[i]`` encoded for ``keys[i]`` into ``slots[i]`` and sync the data.
        Raises ``SSDIOError`` on any failure (nothing is published then)."""
        sb = slot_bytes_for(block_bytes)
        buf = self._staging.acquire(len(keys) * sb)
        try:
            mv = memoryview(buf)
            now_us = int(self._config.clock() * 1_000_000)
            reqs = []
            fds: dict[int, None] = {}
            for j, (key, row, (slab, slot)) in enumerate(zip(keys, rows, slots, strict=True)):
                view = mv[j * sb : (j + 1) * sb]
                encode_block_into(view, fingerprint, key, row, now_us)
                fd = self._files.fd(slab)
                fds[fd] = None
                reqs.append(IORequest(fd, slot * sb, view))
            res = self._io.write_batch(reqs)
            bad = [r for r in res if r < 0]
            if bad:
                raise SSDIOError(f"{len(bad)} of {len(res)} slot writes failed", -bad[0])
            self._config.crash_hook("before_data_sync")
            bad = [r for r in self._io.sync(list(fds)) if r < 0]
            if bad:
                raise SSDIOError("data sync failed", -bad[0])
            self._config.crash_hook("after_data_sync")
        finally:
            self._staging.release(buf)
