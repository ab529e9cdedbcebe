"""The data path of ``SharedFSTier``: get, put, touch, delete, sweep."""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Sequence

from kvstore.errors import InvalidArgument
from kvstore.tier import PutResult
from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs.alloc import Reservation, reserve
from storage_nodes.sharedfs.blockio import ReadFailure, Written, per_batch, read_prefix, write_group
from storage_nodes.sharedfs.catalog import Loc
from storage_nodes.sharedfs.manifest_log import Ticket
from storage_nodes.sharedfs.own import OwnBlock
from storage_nodes.sharedfs.publish import append, sync_written, write
from storage_nodes.sharedfs.state import Context, NsState, own_loc, release_own, replace_expired

log = logging.getLogger("storage_nodes.sharedfs")
_GONE = (errno.ENOENT, errno.ESTALE)


def get(ctx: Context, st: NsState, keys: list[bytes], out: memoryview,
        checksums: list[int] | None = None) -> int:
    with ctx.lock:
        locs = st.catalog.prefix(keys, ctx.floor())
        ctx.counts["gets"] += 1
    hits = 0
    if locs:
        res = read_prefix(ctx, st, keys, locs, out)
        hits = res.copied
        if checksums is not None:
            checksums.extend(res.checksums[:hits])
        if res.failure is not None:
            _read_failed(ctx, st, keys[res.failure.index], res.failure)
    ctx.add({"hits": hits, "misses": len(keys) - hits})
    if hits:
        note_touch(ctx, st, keys[:hits])
    return hits


def _read_failed(ctx: Context, st: NsState, key: bytes, f: ReadFailure) -> None:
    loc = f.loc
    if f.in_copy:  # the stored block is sound; the copy into the caller's rows was not
        ctx.add({"corrupt_blocks_total": 1})
        return
    with ctx.lock:
        # The copy read, not just its slot (Loc holds the birth time): a key put again
        # into the same slot while we read is a newer copy, not the one that failed.
        if loc not in st.catalog.locations(key):
            ctx.counts["read_races"] += 1  # the catalog moved on while we read: a plain miss
            return
        if f.errno in _GONE:
            if loc.owner != ctx.me:
                st.catalog.drop_segment(loc.owner, loc.seg)  # collected or handed over
                ctx.files.forget(ctx.segment_path(st, loc.owner, loc.seg))
                return
        elif f.errno:
            ctx.counts["io_errors_total"] += 1
            return  # a transient error (a server down): the block may read next time
        if loc.owner != ctx.me:
            # The owner evicted it and reused the slot (its manifest will say so), or
            # is rewriting it right now: a miss, and forgotten until the owner says more.
            ctx.counts["stale_slots_total"] += 1
            st.catalog.drop(key, loc.owner, loc.seg, loc.slot)
            return
        ctx.counts["corrupt_blocks_total"] += 1
    log.warning("own block %s in segment %x slot %d failed its check: %s",
                key.hex(), loc.seg, loc.slot, f.error or f"errno {f.errno}")
    _forget_own(ctx, st, [(key, loc)])


def _forget_own(ctx: Context, st: NsState, copies: Sequence[tuple[bytes, Loc]]) -> None:
    """Forget own copies that cannot serve: one that failed its read check, or a put's
    whose segment sync failed after its frame was published. Each leaves the own space,
    its slot goes back on the free list, its catalog entry goes and a DROP records it.

    Only a copy this daemon still holds is forgotten, told by its slot *and* birth time.
    Meanwhile it may have been evicted, expired or deleted (forgotten and DROPped then),
    or its key put again, elsewhere or into this very slot. Then nothing is done, not
    even to the catalog: an entry for that key at that slot is the newer copy's (a
    catalog drop, like a DROP record, names key and slot, not the copy), and dropping
    it would lose the newer copy here, in every peer's catalog and at a restart. Birth
    times are whole seconds (as manifests carry them): a copy put into the same slot
    within the same second is taken for the old one and forgotten too, a later miss.

    Takes ``st.publish``, then ``ctx.lock`` (the caller holds neither), and appends the
    DROPs before letting go of ``st.publish`` (see ``release_own``)."""
    drops: list[mf.DropEntry] = []
    with st.publish:
        with ctx.lock:
            for key, loc in copies:
                if own_loc(ctx, key, st) == loc:
                    drops.append(release_own(ctx, st, key, loc.seg, loc.slot))
        if drops:
            append(ctx, st, mf.drops(drops))


def note_touch(ctx: Context, st: NsState, keys: Sequence[bytes]) -> None:
    """Recency last→first for live keys. Own blocks move in this daemon's order at once
    and their access time is published when it moves to a newer bucket; a peer's block
    gets a published touch once per bucket (its owner orders evictions by them)."""
    with ctx.lock:
        floor, bucket = ctx.floor(), ctx.bucket_now()
        cat, own, pending = st.catalog, st.own, st.pending_touch
        if st.touch_bucket != bucket:
            st.touch_bucket, st.touched_now = bucket, set()
        for k in reversed(keys):
            cur = cat.access.get(k)
            if cur is None or cur < floor:
                continue
            mine = own.touch(k, ctx.next_seq())
            if cur < bucket:
                cat.access[k] = bucket
                pending[k] = bucket
            elif not mine and k not in st.touched_now:
                pending[k] = bucket
            if not mine:
                st.touched_now.add(k)


def put(ctx: Context, st: NsState, keys: list[bytes], data: memoryview,
        present_ok: bool, checksums: Sequence[int] | None = None) -> PutResult:
    bb = st.block_bytes
    with ctx.lock:
        floor = ctx.floor()
        present = {i for i, k in enumerate(keys) if st.catalog.live(k, floor)}
        ctx.counts["puts"] += 1
    if not present_ok and present:
        raise InvalidArgument("put: key already present and present_ok=False")
    new = [i for i in range(len(keys)) if i not in present]
    inserted = raced = 0
    step = per_batch(ctx, st.slot_bytes)
    groups = [new[s : s + step] for s in range(0, len(new), step)]
    for group in reversed(groups):  # last→first: the head of the chain is written last
        ins, rac, ok = _put_group(ctx, st, keys, data, group, bb, checksums)
        inserted += ins
        raced += rac
        if not ok:
            break
    note_touch(ctx, st, keys)  # the whole chain, last→first: its head ends most recent
    dropped = len(new) - inserted - raced
    ctx.add({"inserted": inserted, "present": len(present) + raced, "dropped": dropped})
    return PutResult(inserted=inserted, present=len(present) + raced, dropped=dropped)


def _put_group(ctx: Context, st: NsState, keys: list[bytes], data: memoryview,
               group: list[int], bb: int, checksums: Sequence[int] | None
               ) -> tuple[int, int, bool]:
    res = reserve(ctx, st, len(group))
    take = group[: len(res.slots)]
    writing = write_group(
        ctx, st, [keys[i] for i in take], [data[i * bb : (i + 1) * bb] for i in take],
        res.slots[: len(take)], None if checksums is None else [checksums[i] for i in take],
    ) if take else contextlib.nullcontext(Written(0, []))
    with writing as w:
        # The segments' sync starts at once, on a helper thread; this one publishes and
        # syncs the frame meanwhile (multi-host rule 3: the put waits for the longer of
        # the two syncs, not their sum). A crash between them can leave the frame durable
        # and a slot not: every read checks key and checksum, so that slot is a miss for
        # anyone, never wrong bytes.
        syncing = ctx.syncs.submit(ctx.io.sync, w.fds) if w.fds and not w.err else None
        try:
            published, raced, ticket = _publish(ctx, st, keys, take, res, w.err)
            sync_written(ctx, st, ticket)  # the DROPs of the victims, at least
        finally:
            bad = [r for r in syncing.result() if r < 0] if syncing is not None else []
        err = w.err or (bad[0] if bad else 0)
    if err:
        log.warning("shared-fs put of %d blocks dropped: %s", len(take), errno.errorcode.get(
            -err, str(err)))
        if not w.err:  # written but not durable: take back what was published
            ctx.add({"io_errors_total": 1})
            _forget_own(ctx, st, [(e.key, Loc(ctx.me, e.seg, e.slot, e.born_s))
                                  for e in published])
            published = []
    return len(published), raced, not err and len(take) == len(group)


def _publish(ctx: Context, st: NsState, keys: list[bytes], take: list[int],
             res: Reservation, err: int) -> tuple[list[mf.PutEntry], int, Ticket | None]:
    """The written slots into the catalog (after their writes completed: a local read
    then finds their bytes) and the manifest frame (with the DROPs of the victims)
    written, not yet synced; returns what was published, how many keys were published
    meanwhile by someone else, and the frame's ticket."""
    published: list[mf.PutEntry] = []
    expired: list[mf.DropEntry] = []  # copies of the keys that expired, not yet swept
    raced = 0
    with st.publish:
        with ctx.lock:
            floor, now = ctx.floor(), ctx.config.clock()
            access, born = ctx.config.bucket_of(now), int(now)
            for j in reversed(range(len(take))):
                key, (seg, slot) = keys[take[j]], res.slots[j]
                if err or st.catalog.live(key, floor):
                    if not err:
                        raced += 1  # published meanwhile by another put (or a peer)
                    st.own.unreserve(seg, slot, still_free=True)
                    continue
                expired += replace_expired(ctx, st, key)
                st.own.unreserve(seg, slot, still_free=False)
                st.own.insert(key, OwnBlock(seg, slot, born, ctx.next_seq()))
                st.catalog.put(key, Loc(ctx.me, seg, slot, born), access)
                published.append(mf.PutEntry(key, seg, slot, access, born))
            for seg, slot in res.slots[len(take) :]:
                st.own.unreserve(seg, slot, still_free=True)
            if err:
                ctx.counts["io_errors_total"] += 1
        gone = res.victims + expired  # evicted or replaced: DROPped before the PUTs
        frame = (mf.drops(gone) if gone else b"") + (mf.puts(published) if published else b"")
        ticket = write(ctx, st, frame)
    return published, raced, ticket


def delete_namespace(ctx: Context, st: NsState) -> int:
    """DELETE_NS: every block of the namespace born up to now goes, on every daemon (each
    owner drops its own when it reads the record)."""
    t_s = int(ctx.config.clock())
    with st.publish:
        with ctx.lock:
            gone = st.catalog.drop_born_before(t_s)
            for key, loc in gone:
                if loc.owner == ctx.me and st.own.remove(key) is not None:
                    st.own.free.append((loc.seg, loc.slot))
            st.pending_touch.clear()
        append(ctx, st, mf.delete_ns(t_s))
    return len({k for k, _ in gone})


def sweep(ctx: Context, st: NsState) -> int:
    """Expire own blocks idle longer than the retention."""
    with st.publish:
        with ctx.lock:
            floor = ctx.floor()
            access = st.catalog.access
            drops = [release_own(ctx, st, key, b.seg, b.slot)
                     for key, b in list(st.own.lru.items())
                     if access.get(key, b.born_s) < floor]
            ctx.counts["expired_total"] += len(drops)
        if drops:
            append(ctx, st, mf.drops(drops))
    return len(drops)


def locations_of(ctx: Context, st: NsState, key: bytes) -> list[Loc]:
    with ctx.lock:
        return st.catalog.locations(key)
