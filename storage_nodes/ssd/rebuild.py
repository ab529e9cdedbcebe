"""Rebuild the index from the slot headers: after a power cut or OS crash cut short an
index written without syncs, or when LMDB reports the index corrupt.

Every slot starts with its block's header (DESIGN §4: magic, version, fingerprint,
key, payload length, checksum, created-at), and the durable slab table says which
class each slab holds, so the headers alone name every block on disk. A slot counts
when its header is well formed, its length is its slab's class and its namespace was
not deleted after the block was written (``Tombstones``); of two slots with one key the
newer wins; blocks already idle past retention are left out. The payload checksum is
not read here (that would read the whole disk): every read checks it, so a block whose
write a power cut tore is a counted miss on its first read, never wrong bytes.
Recency restarts at each block's creation time — never later than its real last
access, so retention can only end early, never late; ``seq`` (and ``gen``) become the
creation time in µs, which orders the rebuilt blocks and tells two copies of a key apart.

Reads go through the engine's I/O backend: slots of up to 64 KiB are read whole,
a slab at a time in large sequential reads; bigger slots by their first 4 KiB page,
``queue_depth`` at a time. Headers are parsed with numpy, not one by one in Python.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from kvstore.block import FORMAT_VERSION, HEADER_BYTES, MAGIC
from kvstore.buffers import BufferPool
from storage_nodes.ssd.config import ALIGN_BYTES, SSDConfig, slot_bytes_for
from storage_nodes.ssd.errors import SSDIOError
from storage_nodes.ssd.index import Index
from storage_nodes.ssd.index_room import RECORD_BYTES
from storage_nodes.ssd.io_backend import IOBackend, IORequest
from storage_nodes.ssd.slabs import SlabFiles

log = logging.getLogger("storage_nodes.ssd")
_WHOLE_SLOT_MAX = 64 << 10  # read slots up to this size whole (sequentially)
_CHUNK_BYTES = 4 << 20
_COMMIT_EVERY = 200_000  # records per transaction (LMDB bounds a txn's dirty pages)
_MAGIC_U32 = int.from_bytes(MAGIC, "little")
_HEADER_DTYPE = np.dtype(
    {
        "names": ["magic", "version", "flags", "fp", "key", "plen", "created"],
        # void, not "S": numpy strips trailing NUL bytes from "S" fields (keys have them)
        "formats": ["<u4", "<u2", "<u2", "V16", "V16", "<u8", "<u8"],
        "offsets": [0, 4, 6, 8, 24, 40, 56],
        "itemsize": HEADER_BYTES,
    }
)


@dataclass(frozen=True, slots=True)
class RebuildReport:
    slabs: int
    slots_scanned: int
    blocks: int
    bytes_read: int
    seconds: float


def rebuild_index(
    config: SSDConfig,
    index: Index,
    table: dict[int, int],
    tombstones: dict[bytes, int],
    files: SlabFiles,
    io: IOBackend,
    staging: BufferPool,
) -> RebuildReport:
    """Fill the empty ``index`` from the headers of every slab in ``table``."""
    t0 = time.monotonic()
    expiry = config.expiry_bucket(config.clock())
    slots_of = {slab: config.slab_bytes // slot_bytes_for(bb) for slab, bb in table.items()}
    with index.write(sum(slots_of.values()) * RECORD_BYTES) as txn:
        for slab, bb in sorted(table.items()):
            index.create_slab(txn, slab, bb, slots_of[slab])
    scanned = read = blocks = high = 0
    pending: list[tuple[bytes, int, int, int]] = []  # fkey, created µs, slab, slot

    def flush() -> None:
        nonlocal blocks
        with index.write(len(pending) * RECORD_BYTES) as txn:
            blocks += index.adopt(txn, pending, config.bucket_of)
            index.set_seq_high_water(txn, max(high, index.seq_high_water(txn)))
        pending.clear()

    for slab, bb in sorted(table.items()):
        sb = slot_bytes_for(bb)
        nslots = config.slab_bytes // sb
        for first, headers in _scan(files, io, staging, slab, sb, nslots, config.queue_depth):
            scanned += len(headers)
            read += len(headers) * (sb if sb <= _WHOLE_SLOT_MAX else ALIGN_BYTES)
            ok = (
                (headers["magic"] == _MAGIC_U32)
                & (headers["version"] == FORMAT_VERSION)
                & (headers["flags"] == 0)
                & (headers["plen"] == bb)
            )
            for j in np.flatnonzero(ok).tolist():
                h = headers[j]
                fp, created = bytes(h["fp"]), int(h["created"])
                dead = tombstones.get(fp)
                if dead is not None and created <= dead:
                    continue
                if config.bucket_of(created / 1e6) < expiry:
                    continue
                pending.append((fp + bytes(h["key"]), created, slab, first + j))
                high = max(high, created)
            if len(pending) >= _COMMIT_EVERY:
                flush()
    flush()
    report = RebuildReport(len(table), scanned, blocks, read, time.monotonic() - t0)
    log.warning(
        "SSD %s: index rebuilt from slot headers: %d blocks in %d slabs (%d slots, "
        "%.1f MB read) in %.2f s",
        config.dir,
        report.blocks,
        report.slabs,
        report.slots_scanned,
        report.bytes_read / 1e6,
        report.seconds,
    )
    return report


def _scan(
    files: SlabFiles,
    io: IOBackend,
    staging: BufferPool,
    slab: int,
    sb: int,
    nslots: int,
    qd: int,
):  # type: ignore[no-untyped-def]
    """Yield (first slot, structured array of that run of slots' headers)."""
    fd = files.fd(slab)
    if sb <= _WHOLE_SLOT_MAX:
        per_read, stride, span = max(1, _CHUNK_BYTES // sb), sb, sb  # whole slots
    else:
        per_read, stride, span = 1, ALIGN_BYTES, ALIGN_BYTES  # first page of each slot
    reads = -(-nslots // per_read)
    batch = max(1, min(qd, (64 << 20) // (per_read * span)))
    buf = staging.acquire(batch * per_read * span)
    try:
        mv = memoryview(buf)
        for r0 in range(0, reads, batch):
            reqs, firsts = [], []
            for r in range(r0, min(reads, r0 + batch)):
                first = r * per_read
                count = min(per_read, nslots - first)
                at = (r - r0) * per_read * span
                if span == sb:
                    reqs.append(IORequest(fd, first * sb, mv[at : at + count * sb]))
                else:
                    reqs.append(IORequest(fd, first * sb, mv[at : at + ALIGN_BYTES]))
                firsts.append((first, count, at))
            res = io.read_batch(reqs)
            bad = [-x for x in res if x < 0]
            if bad:
                raise SSDIOError(f"rebuild: reading slab {slab} failed", bad[0])
            for first, count, at in firsts:
                view = np.ndarray(
                    (count,), dtype=_HEADER_DTYPE, buffer=buf, offset=at, strides=(stride,)
                )
                yield first, view.copy()
    finally:
        staging.release(buf)
