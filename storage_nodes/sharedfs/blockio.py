"""Moving blocks between caller rows and segment slots.

Reads: one batch of slot reads (``queue_depth`` in flight) into backend staging
memory; as each slot lands its header is checked (magic, version, fingerprint, key,
length), its payload copied out and the copy checked against the header's checksum
(DESIGN §4: the check reads what the caller gets), overlapping the reads still in
flight; the first failure in key order ends the prefix.
Writes: one batch of slot writes, each slot encoded into staging just before it is
issued (so encoding overlaps the writes in flight), one sync per segment touched.
Both split work into batches of at most ``staging_max_bytes``.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass, field

import xxhash

from kvstore.block import check_header, encode_block_into
from kvstore.errors import BlockChecksumError, BlockError
from storage_nodes.sharedfs.catalog import Loc
from storage_nodes.sharedfs.io_backend import IORequest
from storage_nodes.sharedfs.segments import slot_offset
from storage_nodes.sharedfs.state import Context, NsState


@dataclass(frozen=True, slots=True)
class ReadFailure:
    """Why block ``index`` was not returned: an errno (``ENOENT``: the segment is gone)
    or a failed header check."""

    index: int
    loc: Loc
    errno: int = 0
    error: BlockError | None = None
    in_copy: bool = False  # the slot is sound; the copy in the destination was not


@dataclass(frozen=True, slots=True)
class ReadOutcome:
    copied: int
    failure: ReadFailure | None = None
    checksums: list[int] = field(default_factory=list)  # stored, one per copied block


def per_batch(ctx: Context, slot_bytes: int) -> int:
    return max(1, ctx.config.staging_max_bytes // slot_bytes)


def read_prefix(ctx: Context, st: NsState, keys: Sequence[bytes], locs: Sequence[Loc],
                out: memoryview) -> ReadOutcome:
    step = per_batch(ctx, st.slot_bytes)
    sums: list[int] = []
    for start in range(0, len(locs), step):
        part = locs[start : start + step]
        fail = _read_part(ctx, st, keys, part, start, out, sums)
        if fail is not None:
            return ReadOutcome(fail.index, fail, sums)
    return ReadOutcome(len(locs), None, sums)


def _read_part(ctx: Context, st: NsState, keys: Sequence[bytes], part: Sequence[Loc],
               start: int, out: memoryview, sums: list[int]) -> ReadFailure | None:
    sb, bb = st.slot_bytes, st.block_bytes
    buf = ctx.io.alloc(len(part) * sb)
    fds: list[int] = []
    failure: ReadFailure | None = None
    try:
        reqs = []
        for j, loc in enumerate(part):
            try:
                fd = ctx.files.acquire(ctx.segment_path(st, loc.owner, loc.seg))
            except OSError as e:
                failure = ReadFailure(start + j, loc, errno=e.errno or errno.EIO)
                break
            fds.append(fd)
            off = slot_offset(loc.slot, sb)
            ctx.io.fresh(fd, off, sb)
            reqs.append(IORequest(fd, off, buf[j * sb : (j + 1) * sb]))
        verdicts: list[ReadFailure | int] = [0] * len(reqs)  # a checksum or why not

        def check(j: int, res: int) -> None:  # on an I/O thread, as each read lands
            i = start + j
            if res < 0:
                verdicts[j] = ReadFailure(i, part[j], errno=-res)
                return
            try:
                payload, csum = check_header(buf[j * sb : (j + 1) * sb],
                                             fingerprint=st.fingerprint, key=keys[i],
                                             payload_len=bb)
            except BlockError as e:
                verdicts[j] = ReadFailure(i, part[j], error=e)
                return
            row = out[i * bb : (i + 1) * bb]  # rows past a failure may be written: unspecified
            row[:] = payload
            if xxhash.xxh3_64_intdigest(row) != csum:
                err = BlockChecksumError(f"payload checksum mismatch for key {keys[i].hex()}")
                in_copy = xxhash.xxh3_64_intdigest(payload) == csum
                verdicts[j] = ReadFailure(i, part[j], error=err, in_copy=in_copy)
                return
            verdicts[j] = csum

        if reqs:
            ctx.io.read_batch(reqs, check)
        for v in verdicts:
            if isinstance(v, ReadFailure):
                return v
            sums.append(v)
        return failure
    finally:
        for fd in fds:
            ctx.files.release(fd)
        ctx.io.free(buf)


def write_group(ctx: Context, st: NsState, keys: Sequence[bytes], rows: Sequence[memoryview],
                slots: Sequence[tuple[int, int]], checksums: Sequence[int] | None) -> int:
    """Write ``rows[i]`` encoded for ``keys[i]`` into ``slots[i]`` and sync; returns 0 or
    a negative errno (nothing of the group may be published then). ``checksums[i]``
    (made at commit) goes into the header as given; ``None``: computed from the row."""
    sb = st.slot_bytes
    buf = ctx.io.alloc(len(keys) * sb)
    fds: dict[int, None] = {}
    acquired: list[int] = []
    try:
        created_us = int(ctx.config.clock() * 1_000_000)
        reqs = []

        def encode(j: int) -> None:  # on an I/O thread, just before slot j is written
            view = buf[j * sb : (j + 1) * sb]
            n = encode_block_into(view, st.fingerprint, keys[j], rows[j], created_us,
                                  None if checksums is None else checksums[j])
            view[n:] = bytes(sb - n)  # no stale bytes of an earlier block in the padding

        for j, (seg, slot) in enumerate(slots):
            try:
                fd = ctx.files.acquire(ctx.segment_path(st, ctx.me, seg), write=True)
            except OSError as e:
                return -(e.errno or errno.EIO)
            acquired.append(fd)
            fds[fd] = None
            reqs.append(IORequest(fd, slot_offset(slot, sb), buf[j * sb : (j + 1) * sb]))
        bad = [r for r in ctx.io.write_batch(reqs, encode) if r < 0]
        if bad:
            return bad[0]
        bad = [r for r in ctx.io.sync(list(fds)) if r < 0]
        return bad[0] if bad else 0
    finally:
        for fd in acquired:
            ctx.files.release(fd)
        ctx.io.free(buf)
