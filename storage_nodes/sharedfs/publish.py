"""Applying records: this daemon's own appends, and what peers' manifests say.

Own changes are applied to the catalog first (under ``ctx.lock``) and then appended to
the namespace's manifest (under its ``publish`` lock, taken first), so a snapshot taken
by a compaction always includes everything appended after it or before it. A failed
append rolls the manifest to a new generation, whose snapshot already says it.
A put splits its append: ``write`` under the publish lock, ``sync_written`` after it
(while its slots' sync runs, and sharing fdatasyncs with concurrent puts).
"""

from __future__ import annotations

from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs.catalog import Loc
from storage_nodes.sharedfs.manifest_log import Ticket
from storage_nodes.sharedfs.state import Context, NsState, replace_expired, snapshot


def append(ctx: Context, st: NsState, data: bytes) -> None:
    """Make ``data`` (whole frames, already applied) durable; caller holds ``st.publish``."""
    if not data:
        return
    if st.log.append(data):
        ctx.add({"manifest_appends": 1})
    else:
        roll(ctx, st)


def write(ctx: Context, st: NsState, data: bytes) -> Ticket | None:
    """``append``'s first half (caller holds ``st.publish``): ``data`` is written, and
    durable once ``sync_written`` returns. None when there is nothing left to sync
    (no data, or the write failed and a roll's snapshot says it instead)."""
    if not data:
        return None
    ticket = st.log.write(data)
    if ticket is None:
        roll(ctx, st)
    return ticket


def sync_written(ctx: Context, st: NsState, ticket: Ticket | None) -> None:
    """``append``'s second half, without ``st.publish``: the frames up to ``ticket``
    durable, or a new generation whose snapshot says them."""
    if ticket is None:
        return
    if st.log.sync(ticket):
        ctx.add({"manifest_appends": 1})
        return
    with st.publish:
        if st.log.generation == ticket.generation:  # nobody rolled since: we do
            roll(ctx, st)


def roll(ctx: Context, st: NsState) -> bool:
    """Start a new manifest generation from the current state; holds ``st.publish``."""

    def snap(generation: int) -> bytes:
        with ctx.lock:
            return snapshot(ctx, st, generation)

    ok = st.log.roll(snap)
    if ok:
        ctx.add({"manifest_rolls": 1})
    return ok


def flush_deferred(ctx: Context, st: NsState) -> None:
    """Append what was decided while applying peers' records (a peer's DELETE_NS drops
    our blocks too, and our manifest must say so, or a restart would bring them back)."""
    with st.publish:
        with ctx.lock:
            data, st.deferred = b"".join(st.deferred), []
        append(ctx, st, data)


def flush_touches(ctx: Context, st: NsState) -> int:
    """Publish the access times noted since the last flush, one TOUCH frame per bucket."""
    with st.publish:
        with ctx.lock:
            pending, st.pending_touch = st.pending_touch, {}
        if not pending:
            return 0
        by_bucket: dict[int, list[bytes]] = {}
        for key, bucket in pending.items():
            by_bucket.setdefault(bucket, []).append(key)
        append(ctx, st, b"".join(mf.touches(b, keys) for b, keys in sorted(by_bucket.items())))
        ctx.add({"touches_published": len(pending)})
        return len(pending)


def apply_peer(ctx: Context, st: NsState, owner: str, records: list[mf.Record],
               replace: bool) -> None:
    """Fold a peer's manifest records into the catalog (and into our own recency, for
    our blocks it touched or deleted)."""
    own_dropped: list[mf.DropEntry] = []
    with ctx.lock:
        cat, floor = st.catalog, ctx.floor()
        if replace:
            cat.drop_owner(owner)
        for rec in records:
            kind = rec.kind
            if kind == mf.PUT:
                for e in rec.value:
                    if e.key in cat.first and not cat.live(e.key, floor):
                        own_dropped += replace_expired(ctx, st, e.key)
                    cat.put(e.key, Loc(owner, e.seg, e.slot, e.born_s), e.access_s)
            elif kind == mf.TOUCH:
                access_s, keys = rec.value
                access = cat.access
                for k in keys:
                    cur = access.get(k)
                    if cur is not None and access_s >= cur:
                        access[k] = access_s
                        st.own.touch(k, ctx.next_seq())
            elif kind == mf.DROP:
                for e in rec.value:
                    cat.drop(e.key, owner, e.seg, e.slot)
            elif kind == mf.SEGMENT_FREE:
                cat.drop_segment(owner, rec.value)
                ctx.files.forget(ctx.segment_path(st, owner, rec.value))
            elif kind == mf.DELETE_NS:
                for key, loc in cat.drop_born_before(rec.value):
                    if loc.owner == ctx.me:
                        b = st.own.remove(key)
                        if b is not None:
                            st.own.free.append((b.seg, b.slot))
                            own_dropped.append(mf.DropEntry(key, b.seg, b.slot))
        if own_dropped:
            st.deferred.append(mf.drops(own_dropped))
        ctx.counts["tail_records"] += len(records)


def forget_peer(ctx: Context, st: NsState, owner: str) -> None:
    """A peer's files of this namespace are gone (collected, or the namespace deleted)."""
    with ctx.lock:
        st.catalog.drop_owner(owner)
    ctx.files.forget_under(ctx.layout.owner_dir(st.tenant, st.fingerprint, owner))
