"""Finding room for a put in this daemon's own capacity.

A namespace takes free slots of its own segments first, then a new segment while this
daemon's capacity has chunks left, then the slot of the least recently used block of
all its namespaces. If that block belongs to another namespace, a whole segment moves:
an empty one of any namespace if there is one, else the victim's (its blocks are
dropped, the file removed, the namespace's manifest says SEGMENT_FREE), and a new
segment is created for the asking namespace. Only this daemon's own files are ever
touched: a daemon evicts nothing it did not write.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from kvstore.block import now_us
from storage_nodes.sharedfs import manifest as mf
from storage_nodes.sharedfs.publish import append
from storage_nodes.sharedfs.segments import SegmentHeader
from storage_nodes.sharedfs.state import Context, NsState

log = logging.getLogger("storage_nodes.sharedfs")

#: Eviction for a put of ``n`` slots looks at the ``8 × n`` least recently used blocks
#: and takes them from as few segments as it can (``OwnSpace.evict_batch``): one or two
#: segment syncs per put instead of one per segment the strict LRU victims lie in.
EVICT_WINDOW_PER_SLOT = 8


@dataclass
class Reservation:
    slots: list[tuple[int, int]] = field(default_factory=list)
    victims: list[mf.DropEntry] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What to do outside the lock: hand ``seg`` of ``donor`` over (if set), then create
    a segment for the asking namespace."""

    donor: NsState | None = None
    seg: int = 0
    keys: tuple[bytes, ...] = ()


def reserve(ctx: Context, st: NsState, n: int) -> Reservation:
    """Up to ``n`` slots of ``st``'s own segments, evicting as DESIGN §6 says; slots of
    evicted blocks are listed in ``victims`` (to be DROPped with the put's records)."""
    res = Reservation()
    while len(res.slots) < n:
        with ctx.lock:
            plan = _step(ctx, st, n, res)
        if plan is None:
            break
        if plan.donor is not None:
            _hand_over(ctx, plan)
        if not _create_segment(ctx, st):
            break
    return res


def _step(ctx: Context, st: NsState, n: int, res: Reservation) -> _Plan | None:
    """Fill ``res`` from what is at hand; return what needs I/O, or None (done, or no
    room). Caller holds ``ctx.lock``."""
    floor = ctx.floor()
    while len(res.slots) < n:
        slot = st.own.take_free()
        if slot is not None:
            res.slots.append(slot)
            continue
        if ctx.segments_in_use() < ctx.config.chunks:
            ctx.creating += 1
            return _Plan()
        victim_ns = _oldest_space(ctx)
        if victim_ns is None:
            return None
        if victim_ns is st:
            need = n - len(res.slots)
            for key, b in st.own.evict_batch(need, EVICT_WINDOW_PER_SLOT * need):
                if st.catalog.access.get(key, 0) >= floor:
                    ctx.counts["retention_violations_total"] += 1
                st.catalog.drop(key, ctx.me, b.seg, b.slot)
                res.slots.append((b.seg, b.slot))
                res.victims.append(mf.DropEntry(key, b.seg, b.slot))
                ctx.counts["evictions"] += 1
            continue
        return _take_segment(ctx, victim_ns)
    return None


def _oldest_space(ctx: Context) -> NsState | None:
    best, best_seq = None, None
    for other in ctx.spaces.values():
        seq = other.own.oldest_seq()
        if seq is not None and (best_seq is None or seq < best_seq):
            best, best_seq = other, seq
    return best


def _take_segment(ctx: Context, victim_ns: NsState) -> _Plan | None:
    """Pick a segment to hand over: an empty one anywhere, else the victim's."""
    donor: NsState | None = None
    seg: int | None = None
    for other in ctx.spaces.values():
        seg = other.own.empty_segment()
        if seg is not None:
            donor = other
            break
    if donor is None or seg is None:
        donor, seg = victim_ns, next(iter(victim_ns.own.lru.values())).seg
        if donor.own.segments[seg].reserved:
            return None  # a put is writing into it right now: no room this time
    floor = ctx.floor()
    keys = tuple(donor.own.remove_segment(seg))
    for k in keys:
        if donor.catalog.access.get(k, 0) >= floor:
            ctx.counts["retention_violations_total"] += 1
    donor.catalog.drop_segment(ctx.me, seg)
    ctx.counts["evictions"] += len(keys)
    ctx.creating += 1
    return _Plan(donor, seg, keys)


def _hand_over(ctx: Context, plan: _Plan) -> None:
    donor = plan.donor
    assert donor is not None
    with donor.publish:
        append(ctx, donor, mf.segment_free(plan.seg))
    try:
        ctx.files.unlink(ctx.segment_path(donor, ctx.me, plan.seg))
    except OSError as e:
        log.warning("cannot remove handed-over segment %x: %s", plan.seg, e)
    ctx.add({"segments_handed_over": 1})


def _create_segment(ctx: Context, st: NsState) -> bool:
    """Create one segment file for ``st`` (its chunk is already counted in
    ``ctx.creating``) and publish it; False if the mount refused."""
    seg = ctx.next_seg_id()
    path = ctx.segment_path(st, ctx.me, seg)
    header = SegmentHeader(seg, st.fingerprint, st.slot_bytes, st.own.slots_per_segment,
                           now_us(), ctx.me)
    try:
        ctx.files.create(path, header)
    except OSError as e:
        log.error("cannot create segment %s: %s", path, e)
        with ctx.lock:
            ctx.creating -= 1
            ctx.counts["io_errors_total"] += 1
        return False
    with st.publish:
        with ctx.lock:
            ctx.creating -= 1
            st.own.add_segment(seg)
            ctx.counts["segments_created"] += 1
        append(ctx, st, mf.segment_add(seg))
    return True
