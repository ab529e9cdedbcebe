"""``TierStats`` for one daemon on a shared mount: its own capacity in blocks per size
class, its counters, and what the I/O path and visibility bound really are."""

from __future__ import annotations

from kvstore.tier import SizeClassStats, TierStats
from storage_nodes.sharedfs.segments import slots_per_segment
from storage_nodes.sharedfs.state import Context


def build_stats(ctx: Context, registered: set[int], mode: str) -> TierStats:
    cfg = ctx.config
    with ctx.lock:
        counters = dict(ctx.counts)
        spaces = list(ctx.spaces.values())
        free_chunks = max(0, cfg.chunks - ctx.segments_in_use())
        by_class: dict[int, tuple[int, int, int]] = {}  # bb -> (segments, used, slot bytes)
        for st in spaces:
            segs, used, _ = by_class.get(st.block_bytes, (0, 0, st.slot_bytes))
            by_class[st.block_bytes] = (segs + len(st.own.segments),
                                        used + st.own.used_blocks(), st.slot_bytes)
        blocks = sum(st.own.used_blocks() for st in spaces)
        visible = sum(len(st.catalog) for st in spaces)
        peers = {o for st in spaces for o in st.catalog.owners()} - {ctx.me}
        segments = sum(len(st.own.segments) for st in spaces)
    from storage_nodes.sharedfs.config import slot_bytes_for

    classes = []
    used_bytes = 0
    for bb in sorted(set(by_class) | registered):
        segs, used, sb = by_class.get(bb, (0, 0, slot_bytes_for(bb)))
        per = slots_per_segment(cfg.segment_bytes, sb)
        used_bytes += used * sb
        classes.append(SizeClassStats(bb, (segs + free_chunks) * per, used))
    counters.update(blocks=blocks, visible_blocks=visible, peers=len(peers),
                    segments=segments, degraded=int(mode != "ok"))
    info = {
        "root": str(cfg.root),
        "daemon_id": ctx.me,
        "epoch": str(ctx.epoch),
        "io_backend": ctx.io.name,
        "direct_io": "on" if ctx.io.direct else "off (pages dropped before each read)",
        "mode": mode,
        "segment_bytes": str(cfg.segment_bytes),
        "retention_s": str(cfg.retention_s),
        "visibility_bound_s": f"{cfg.visibility_bound_s:g}",
        "clock_skew_s": f"{cfg.clock_skew_s:g}",
    }
    return TierStats("ssd", cfg.capacity_bytes, used_bytes, tuple(classes), counters, info)
