"""Store and tier statistics as protocol messages, and back (DESIGN §7: ``Stats``)."""

from __future__ import annotations

from kvstore.tier import SizeClassStats, StoreStats, TierStats
from kvstore.wire.proto import kvstore_pb2 as pb


def tier_stats_to_proto(t: TierStats) -> pb.TierStats:
    return pb.TierStats(
        name=t.name,
        capacity_bytes=t.capacity_bytes,
        used_bytes=t.used_bytes,
        size_classes=[
            pb.SizeClassStats(
                block_bytes=c.block_bytes,
                capacity_blocks=c.capacity_blocks,
                used_blocks=c.used_blocks,
            )
            for c in t.size_classes
        ],
        counters={k: int(v) for k, v in t.counters.items()},
        info={k: str(v) for k, v in t.info.items()},
    )


def stats_to_proto(st: StoreStats) -> pb.StatsResponse:
    return pb.StatsResponse(
        tiers=[tier_stats_to_proto(t) for t in st.tiers],
        counters={k: int(v) for k, v in st.counters.items()},
    )


def stats_from_proto(resp: pb.StatsResponse) -> StoreStats:
    return StoreStats(
        tiers=tuple(tier_stats_from_proto(t) for t in resp.tiers),
        counters=dict(resp.counters),
    )


def tier_stats_from_proto(t: pb.TierStats) -> TierStats:
    return TierStats(
        name=t.name,
        capacity_bytes=t.capacity_bytes,
        used_bytes=t.used_bytes,
        size_classes=tuple(
            SizeClassStats(c.block_bytes, c.capacity_blocks, c.used_blocks) for c in t.size_classes
        ),
        counters=dict(t.counters),
        info=dict(t.info),
    )
