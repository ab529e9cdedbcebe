"""Moving encoded blocks between caller rows and slab slots.

Reads: one batch of slot reads into aligned staging memory; each slot's header is checked
(magic, version, fingerprint, key, length), its payload copied out, and the copy checked
against the header's checksum (DESIGN §4: the check reads what the caller gets).
Writes: encode into aligned staging (the payload copies run on the encoder's thread,
``encoder.py``), one batch of slot writes, one data sync per slab touched. Both split
work into batches of at most ``staging_max_bytes``.

Zero copy: a payload of whole pages sits on its own pages in the slot
(``payload_offset_for``), so when the caller's rows are page aligned (the DRAM tier's
pool, the daemon's shared-memory segment) and the backend takes vectored requests, each
slot moves as one request of two segments — its header page in staging, its payload in
the caller's row — and no payload is copied: a write takes the row as it is, a read
lands in the destination row and is checked there.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

import xxhash

from kvstore.block import FORMAT_VERSION, HEADER_BYTES, MAGIC, check_header_fields
from kvstore.buffers import BufferPool, buffer_address
from kvstore.errors import BlockChecksumError, BlockError
from kvstore.slot_io import ReadFailure, ReadOutcome
from storage_nodes.ssd.config import ALIGN_BYTES, SSDConfig, payload_offset_for, slot_bytes_for
from storage_nodes.ssd.encoder import Encoder
from storage_nodes.ssd.errors import SSDIOError
from storage_nodes.ssd.index import Location, Slot
from storage_nodes.ssd.io_backend import IOBackend, IORequest
from storage_nodes.ssd.slabs import SlabFiles
from storage_nodes.ssd.slot_reads import SlotReads

# magic, version, flags, fingerprint, key, payload length, xxh3-64, created-at µs (§4)
_HEADER = struct.Struct("<4sHH16s16sQQQ")
#: blocks per encoder task: the io_uring backend hands the kernel writes this often
_ENCODE_CHUNK = 4


class SlotsWritten(NamedTuple):
    """What a ``write_slots`` call wrote: the slots, in key order, and their slabs."""

    slots: list[Slot]
    slabs: list[int]


class BlockIO:
    def __init__(self, config: SSDConfig, files: SlabFiles, io: IOBackend) -> None:
        self._config = config
        self._files = files
        self._io = io
        self.staging = BufferPool()
        self._encoder = Encoder()

    def close(self) -> None:
        """Stop the encoder's thread (after the last put)."""
        self._encoder.close()

    def per_batch(self, block_bytes: int) -> int:
        return max(1, self._config.staging_max_bytes // slot_bytes_for(block_bytes))

    def direct(self, block_bytes: int, rows: memoryview) -> bool:
        """Whether ``rows`` can be the payload segments of vectored slot transfers."""
        return (
            payload_offset_for(block_bytes) == ALIGN_BYTES
            and self._io.vectored
            and buffer_address(rows) % ALIGN_BYTES == 0
        )

    def read_prefix(
        self,
        fingerprint: bytes,
        block_bytes: int,
        keys: Sequence[bytes],
        locs: Sequence[Location],
        out: memoryview,
        *,
        more: Callable[[], Sequence[Location]] | None = None,
    ) -> ReadOutcome:
        """Copy verified payloads of ``locs`` into rows of ``out`` until the first failure.
        Each block is verified and copied as its read completes, while others are in flight.
        ``more`` gives the locations of the keys after ``locs`` (the present ones, in
        order); it is called once, when the reads of ``locs`` are in flight, and the reads
        it adds join their batch — a get's look-ups overlap its first reads."""
        step = self.per_batch(block_bytes)
        direct = self.direct(block_bytes, out)
        locs = list(locs)
        sums: list[int] = []
        start = 0
        while start < len(locs):
            room = min(step, len(keys) - start)  # the most this batch holds, grown or not
            n, failure = self._read_batch(
                fingerprint, block_bytes, keys, locs, start, room, out, sums, direct, more
            )
            more = None
            if failure is not None:
                return ReadOutcome(failure.index, failure, sums[: failure.index])
            start += n
        return ReadOutcome(start, None, sums)

    def _read_batch(
        self,
        fingerprint: bytes,
        block_bytes: int,
        keys: Sequence[bytes],
        locs: list[Location],
        start: int,
        room: int,
        out: memoryview,
        sums: list[int],
        direct: bool,
        more: Callable[[], Sequence[Location]] | None,
    ) -> tuple[int, ReadFailure | None]:
        """Read ``locs[start : start + room]`` as one backend batch, grown by what ``more``
        finds (up to ``room``; the rest is appended to ``locs`` for later batches).
        Returns how many blocks the batch held and its first failure, if any."""
        bb = block_bytes
        sb = slot_bytes_for(bb)
        stage = ALIGN_BYTES if direct else sb  # staging per slot: its header page, or all
        part, fds, unopened = self._opened(locs[start : start + room], start)
        failed = [] if unopened is None else [unopened]
        if more is not None and (failed or len(part) == room):
            if not failed:  # no room to grow: the rest are read by the next batches
                locs.extend(more())
            more = None
        buf = self.staging.acquire(room * stage)
        try:
            mv = memoryview(buf)
            found = [more] if more is not None else []

            def grow() -> SlotReads | None:
                if not found:  # asked again once the added reads are in: nothing more
                    return None
                added = found.pop()()
                locs.extend(added)
                first = start + len(part)
                extra, extra_fds, bad = self._opened(added[: room - len(part)], first)
                failed.extend([bad] if bad is not None else [])
                staging = mv[len(part) * stage :]
                reqs = SlotReads(extra, extra_fds, sb, staging, stage, out, bb, first, direct)
                part.extend(extra)  # before any of their reads completes
                return reqs or None

            reqs = SlotReads(part, fds, sb, mv, stage, out, bb, start, direct)
            failure = self._read_part(
                fingerprint, bb, keys, part, reqs, mv, out, start, sums, direct,
                grow if found else None,
            )
        finally:
            self.staging.release(buf)
        return len(part), failure or (failed[0] if failed else None)

    def _opened(
        self, locs: Sequence[Location], start: int
    ) -> tuple[list[Location], list[int], ReadFailure | None]:
        """``locs`` up to the first whose slab file cannot be opened, their files, and
        that slab's failure (the block at index ``start + j``), if any."""
        fds: list[int] = []
        for j, loc in enumerate(locs):
            try:
                fds.append(self._files.fd(loc.slab))
            except SSDIOError as e:  # a missing slab file: the blocks from here on
                return list(locs[:j]), fds, ReadFailure(start + j, loc, errno=e.errno or errno.EIO)
        return list(locs), fds, None

    def _read_part(
        self,
        fingerprint: bytes,
        block_bytes: int,
        keys: Sequence[bytes],
        part: Sequence[Location],
        reqs: Sequence[IORequest],
        mv: memoryview,
        out: memoryview,
        start: int,
        sums: list[int],
        direct: bool,
        grow: Callable[[], Sequence[IORequest] | None] | None,
    ) -> ReadFailure | None:
        """One batch of reads (``grow``: the backend's ``between``, which extends ``part``);
        returns the failure with the lowest index, if any, and appends the stored
        checksums of the blocks before it to ``sums``."""
        bb = block_bytes
        stage = ALIGN_BYTES if direct else slot_bytes_for(bb)
        po = payload_offset_for(bb)
        failures: dict[int, ReadFailure] = {}
        stored: dict[int, int] = {}
        digest = xxhash.xxh3_64_intdigest

        def landed(j: int, res: int) -> None:
            i = start + j
            if res < 0:
                failures[j] = ReadFailure(i, part[j], errno=-res)
                return
            at = j * stage
            try:
                _, csum = check_header_fields(
                    mv[at : at + HEADER_BYTES],
                    fingerprint=fingerprint,
                    key=keys[i],
                    payload_len=bb,
                )
            except BlockError as e:
                failures[j] = ReadFailure(i, part[j], error=e)
                return
            row = out[i * bb : (i + 1) * bb]
            payload = None if direct else mv[at + po : at + po + bb]
            if payload is not None:
                row[:] = payload
            if digest(row) != csum:
                # Which copy is bad decides whether the slot is quarantined; a direct
                # read has one copy only, the slot's.
                err = BlockChecksumError(f"payload checksum mismatch for key {keys[i].hex()}")
                in_copy = payload is not None and digest(payload) == csum
                failures[j] = ReadFailure(i, part[j], error=err, in_copy=in_copy)
                return
            stored[j] = csum

        if reqs:
            self._io.read_batch(reqs, landed, between=grow)
        end = min(failures) if failures else len(part)
        sums.extend(stored[j] for j in range(end))
        return failures[end] if failures else None

    def probe(self, slabs: Sequence[int]) -> str | None:
        """A degraded tier's health check through the engine's own I/O path: write and
        sync a page of a probe file, read it back, read the first page of every slab.
        None when all of it worked, else what failed."""
        buf = self.staging.acquire((len(slabs) + 1) * ALIGN_BYTES)
        try:
            mv = memoryview(buf)
            page = mv[:ALIGN_BYTES]
            try:
                fd = self._files.open_probe()
            except OSError as e:
                return f"cannot create a probe file: {e.strerror}"
            try:
                w = self._io.write_and_sync([IORequest(fd, 0, page)], [fd])
                if w[0][0] < 0 or not w[1] or w[1][0] < 0:
                    return "a probe write or its sync failed"
                reqs = [IORequest(fd, 0, page)]
                for j, slab in enumerate(slabs):
                    try:
                        sfd = self._files.fd(slab)
                    except SSDIOError as e:
                        return str(e)
                    reqs.append(
                        IORequest(sfd, 0, mv[(j + 1) * ALIGN_BYTES : (j + 2) * ALIGN_BYTES])
                    )
                bad = [-r for r in self._io.read_batch(reqs) if r < 0]
                return f"reads fail with errno {bad[0]}" if bad else None
            finally:
                self._files.drop_probe(fd)
        finally:
            self.staging.release(buf)

    def write_slots(
        self,
        fingerprint: bytes,
        block_bytes: int,
        keys: Sequence[bytes],
        data: memoryview,
        rows: Sequence[int],
        slots: Sequence[Slot],
        checksums: Sequence[int] | None = None,
        *,
        sync: bool = True,
        more_slots: Callable[[], Sequence[Slot]] | None = None,
        in_flight: Callable[[Sequence[Slot]], None] | None = None,
        grows_to: int = 0,
    ) -> SlotsWritten:
        """Encode row ``rows[j]`` of ``data`` for ``keys[j]`` into ``slots[j]`` and write
        them; with ``sync``, also sync the data (``data_sync="per_put"``). ``checksums[j]``
        (made at commit) goes into the header as given; ``None``: the checksum of the copy
        being written. ``more_slots`` (not with ``sync``), called once the writes to
        ``slots`` are in flight, gives slots for the keys after them (as many as it can):
        those writes join the batch; it may first extend ``keys``, ``rows`` and
        ``checksums`` (in place, up to ``grows_to`` keys in all) where the rows move
        direct and the checksums are given. ``in_flight(slots)`` is called once every write is
        submitted (before any is waited for), with the slots they write. Returns the slots
        written (``slots``, then the further ones) and the slabs they lie in. Raises
        ``SSDIOError`` on any failure.
        Safe to call from several threads at once (each call has its own staging buffer
        and, with io_uring, its own ring)."""
        if sync and more_slots is not None:
            raise ValueError("write_slots: more_slots cannot be synced with the batch")
        sb = slot_bytes_for(block_bytes)
        bb = block_bytes
        po = payload_offset_for(bb)
        direct = self.direct(bb, data)
        stage = ALIGN_BYTES if direct else sb  # staging per slot: its header page, or all
        if grows_to > len(keys) and (not direct or checksums is None):
            raise ValueError("write_slots: only direct rows with checksums can grow")
        buf = self.staging.acquire(max(len(keys), grows_to) * stage)
        try:
            mv = memoryview(buf)
            now_us = int(self._config.clock() * 1_000_000)
            fds: dict[int, None] = {}
            slabs: dict[int, None] = {}
            fd_of = self._files.fd
            written = list(slots)

            def requests(first: int, more: Sequence[Slot]) -> list[IORequest]:
                out = []
                for j, (slab, slot) in enumerate(more, first):
                    fd = fd_of(slab)
                    fds[fd] = None
                    slabs[slab] = None
                    at = mv[j * stage : (j + 1) * stage]
                    if direct:
                        row = data[rows[j] * bb : (rows[j] + 1) * bb]
                        out.append(IORequest(fd, slot * sb, row, head=at))
                    else:
                        out.append(IORequest(fd, slot * sb, at))
                return out

            reqs = requests(0, slots)
            pack = _HEADER.pack_into
            chunk = _ENCODE_CHUNK
            job = None
            if not direct or checksums is None:  # a copy to make, or checksums to take
                job = self._encoder.start(
                    mv, stage, data, bb, rows, chunk, checksums is None, po, copy=not direct
                )
            pad = bytes(po - HEADER_BYTES)

            def encode(j: int) -> None:
                # DESIGN §4, written in place once the encoder copied (and hashed) row j
                sums = job.ready(j) if job is not None else []
                csum = sums[j % chunk] if checksums is None else checksums[j]
                at = j * stage
                pack(mv, at, MAGIC, FORMAT_VERSION, 0, fingerprint, keys[j], bb, csum, now_us)
                mv[at + HEADER_BYTES : at + po] = pad  # staging is reused: no stale bytes

            crash = self._config.crash_point

            asked = told = False

            def between() -> list[IORequest] | None:
                # first: the sync's crash point and the further slots' writes; once those
                # are submitted too (or if there are none), ``in_flight``
                nonlocal asked, told
                if not asked:
                    asked = True
                    if sync:
                        crash("before_data_sync")
                    if more_slots is not None:
                        more = list(more_slots())[: len(keys) - len(written)]
                        first = len(written)
                        written.extend(more)
                        if more:
                            return requests(first, more)
                if in_flight is not None and not told:
                    told = True
                    in_flight(written)
                return None

            try:
                res, synced = self._io.write_and_sync(
                    reqs, list(fds) if sync else [], prepare=encode, between=between
                )
            finally:
                if job is not None:
                    job.finish()  # no copy may land in the staging buffer once released
            if res and min(res) < 0:  # min: this runs after the last write, device idle
                bad = [r for r in res if r < 0]
                raise SSDIOError(f"{len(bad)} of {len(res)} slot writes failed", -bad[0])
            if len(res) != len(written):
                # the backend stopped before the further writes (it never does without
                # an error, which raised above): never name a slot that was not written
                raise SSDIOError("slot writes were not all made", errno.EIO)
            if sync:
                bad = [r for r in synced if r < 0]
                if bad or len(synced) != len(fds):
                    raise SSDIOError("data sync failed", -bad[0] if bad else errno.EIO)
                crash("after_data_sync")
            return SlotsWritten(written, list(slabs))
        finally:
            self.staging.release(buf)
