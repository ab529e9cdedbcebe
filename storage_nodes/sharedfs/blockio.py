"""Moving blocks between caller rows and segment slots.

Reads: one batch of slot reads (``queue_depth`` in flight); as each slot lands its
header is checked (magic, version, fingerprint, key, length) and the payload in the
caller's row is checked against the header's checksum (DESIGN §4: the check reads what
the caller gets), overlapping the reads still in flight; the first failure in key order
ends the prefix. Where the backend takes any memory (``user_memory``: FUSE does, even
with O_DIRECT) a slot is read scattered: its header into staging, its payload straight
into the caller's row (the padding after it is neither read nor written: two segments a
request, as io_uring's iovecs take them), so no block is copied; elsewhere the whole
slot lands in staging and the payload is copied out, then checked.
Writes: one batch of slot writes, each slot's header made just before it is issued (so
hashing overlaps the writes in flight), gathered from the caller's row where the
backend allows (else encoded into staging); the caller syncs the segments touched,
alongside the manifest frame that names the slots.
Both split work into batches of at most ``staging_max_bytes``.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import xxhash

from kvstore.block import (
    HEADER_BYTES,
    check_header,
    check_header_fields,
    encode_block_into,
    make_header,
)
from kvstore.errors import BlockChecksumError, BlockError
from kvstore.slot_io import IORequest, ReadFailure, ReadOutcome
from storage_nodes.sharedfs.catalog import Loc
from storage_nodes.sharedfs.segments import slot_offset
from storage_nodes.sharedfs.state import Context, NsState


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
    scatter = ctx.io.user_memory
    hb = sb - bb if scatter else sb  # staging per slot: a page for the header, or all of it
    buf = ctx.io.alloc(len(part) * hb)
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
            stage = buf[j * hb : (j + 1) * hb]
            if scatter:
                i = start + j
                row = out[i * bb : (i + 1) * bb]
                reqs.append(IORequest(fd, off, row, head=stage[:HEADER_BYTES]))
            else:
                reqs.append(IORequest(fd, off, stage))
        verdicts: list[ReadFailure | int] = [0] * len(reqs)  # a checksum or why not
        digest = xxhash.xxh3_64_intdigest

        def check(j: int, res: int) -> None:  # on an I/O thread, as each read lands
            i = start + j
            if res < 0:
                verdicts[j] = ReadFailure(i, part[j], errno=-res)
                return
            row = out[i * bb : (i + 1) * bb]  # rows past a failure may be written: unspecified
            stage = buf[j * hb : (j + 1) * hb]
            try:
                if scatter:
                    _, csum = check_header_fields(stage[:HEADER_BYTES],
                                                  fingerprint=st.fingerprint, key=keys[i],
                                                  payload_len=bb)
                else:
                    payload, csum = check_header(stage, fingerprint=st.fingerprint,
                                                 key=keys[i], payload_len=bb)
                    row[:] = payload
            except BlockError as e:
                verdicts[j] = ReadFailure(i, part[j], error=e)
                return
            if digest(row) != csum:
                err = BlockChecksumError(f"payload checksum mismatch for key {keys[i].hex()}")
                # Scattered, the row is what was read: the slot itself is bad.
                in_copy = not scatter and digest(payload) == csum
                verdicts[j] = ReadFailure(i, part[j], error=err, in_copy=in_copy)
                return
            verdicts[j] = csum

        if reqs:
            ctx.io.read_batch(reqs, check)
        if scatter and _refused(verdicts):
            ctx.io.refuse_user_memory()
            return _read_part(ctx, st, keys, part, start, out, sums)  # through staging
        for v in verdicts:
            if isinstance(v, ReadFailure):
                return v
            sums.append(v)
        return failure
    finally:
        for fd in fds:
            ctx.files.release(fd)
        ctx.io.free(buf)


@dataclass
class Written:
    """What ``write_group`` wrote: 0 or a negative errno (nothing of the group may be
    published then), and the segments written, open until the block exits, to sync."""

    err: int
    fds: list[int]


@contextlib.contextmanager
def write_group(ctx: Context, st: NsState, keys: Sequence[bytes], rows: Sequence[memoryview],
                slots: Sequence[tuple[int, int]], checksums: Sequence[int] | None
                ) -> Iterator[Written]:
    """Write ``rows[i]`` encoded for ``keys[i]`` into ``slots[i]``, not yet durable: the
    caller syncs ``fds`` inside the block, together with the manifest frame that names
    the slots (multi-host rule 3). ``checksums[i]`` (made at commit) goes into the
    header as given; ``None``: computed from the row."""
    acquired: list[int] = []
    try:
        err = _write(ctx, st, keys, rows, slots, checksums, acquired)
        yield Written(err, list(dict.fromkeys(acquired)))
    finally:
        for fd in acquired:
            ctx.files.release(fd)


def _write(ctx: Context, st: NsState, keys: Sequence[bytes], rows: Sequence[memoryview],
           slots: Sequence[tuple[int, int]], checksums: Sequence[int] | None,
           acquired: list[int]) -> int:
    sb, bb = st.slot_bytes, st.block_bytes
    gather = ctx.io.user_memory
    hb = sb - bb if gather else sb  # staging per slot: a page for the header, or all of it
    buf = ctx.io.alloc(len(keys) * hb)
    try:
        created_us = int(ctx.config.clock() * 1_000_000)
        reqs = []

        def encode(j: int) -> None:  # on an I/O thread, just before slot j is written
            view = buf[j * hb : (j + 1) * hb]
            csum = None if checksums is None else checksums[j]
            if gather:
                view[:HEADER_BYTES] = make_header(st.fingerprint, keys[j], rows[j],
                                                  created_us, csum).pack()
                return
            n = encode_block_into(view, st.fingerprint, keys[j], rows[j], created_us, csum)
            view[n:] = bytes(sb - n)  # no stale bytes of an earlier block in the padding

        for j, (seg, slot) in enumerate(slots):
            try:
                fd = ctx.files.acquire(ctx.segment_path(st, ctx.me, seg), write=True)
            except OSError as e:
                return -(e.errno or errno.EIO)
            acquired.append(fd)
            view = buf[j * hb : (j + 1) * hb]
            if gather:
                reqs.append(IORequest(fd, slot_offset(slot, sb), rows[j],
                                      head=view[:HEADER_BYTES]))
            else:
                reqs.append(IORequest(fd, slot_offset(slot, sb), view))
        bad = [r for r in ctx.io.write_batch(reqs, encode) if r < 0]
        if gather and -errno.EINVAL in bad:  # the slots are still only reserved: redo
            ctx.io.refuse_user_memory()
            return _write(ctx, st, keys, rows, slots, checksums, acquired)
        return bad[0] if bad else 0
    finally:
        ctx.io.free(buf)


def _refused(verdicts: Sequence[ReadFailure | int]) -> bool:
    return any(isinstance(v, ReadFailure) and v.errno == errno.EINVAL for v in verdicts)
