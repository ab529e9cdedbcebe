"""Cluster statistics: node stats folded into one ``TierStats`` of blocks, not copies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from kvstore.tier import SizeClassStats, TierStats
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.errors import NodeUnavailable
from storage_nodes.cluster.placement import balanced_capacity_blocks

#: Counters every tier reports under one name, so dashboards and the daemon read one set.
_SHARED = ("retention_violations_total", "corrupt_blocks_total", "evictions")


def aggregate(
    config: ClusterConfig,
    per_node: Mapping[int, TierStats | NodeUnavailable],
    healthy: tuple[bool, ...],
    block_sizes: Iterable[int],
    cluster_counters: Mapping[str, int],
) -> TierStats:
    """Usage is ``⌈Σ used / R⌉``; class capacity is what the cluster holds before its
    fullest node must evict (``balanced_capacity_blocks``), the raw ``Σ / R`` goes in
    ``info``. Node counters are summed as ``node_*``, the client's own are ``cluster_*``
    (``corrupt_blocks_total`` adds the bad blocks the client itself caught)."""
    r = config.replicas
    cap_bytes = used_bytes = 0
    classes: dict[int, tuple[list[int], list[int]]] = {bb: ([], []) for bb in block_sizes}
    counters: Counter[str] = Counter()
    down = []
    retention = []
    for i, st in sorted(per_node.items()):
        if isinstance(st, NodeUnavailable):
            down.append(config.nodes[i])
            continue
        if "retention_s" in st.info:
            retention.append(f"{config.nodes[i]}={st.info['retention_s']}")
        cap_bytes += st.capacity_bytes
        used_bytes += st.used_bytes
        for c in st.size_classes:
            caps, used = classes.setdefault(c.block_bytes, ([], []))
            caps.append(c.capacity_blocks)
            used.append(c.used_blocks)
        counters.update({f"node_{k}": v for k, v in st.counters.items()})
    counters.update({f"cluster_{k}": v for k, v in cluster_counters.items()})
    for name in _SHARED:
        counters[name] = counters.get(f"node_{name}", 0)
    counters["corrupt_blocks_total"] += cluster_counters.get("corrupt_blocks", 0)
    info = {
        "nodes": ",".join(config.nodes),
        "healthy_nodes": str(sum(healthy)),
        "ejected": ",".join(n for n, ok in zip(config.nodes, healthy, strict=True) if not ok),
        "unreachable": ",".join(down),
        "replicas": str(r),
        "write_quorum": str(config.write_quorum),
        "node_retention_s": ",".join(retention),  # node=seconds, for the nodes that answered
        "raw_capacity_blocks": ",".join(
            f"{bb}:{sum(caps) // r}" for bb, (caps, _) in sorted(classes.items())
        ),
    }
    size_classes = tuple(
        SizeClassStats(bb, balanced_capacity_blocks(caps, r), -(-sum(used) // r))
        for bb, (caps, used) in sorted(classes.items())
    )
    return TierStats(
        config.name, cap_bytes // r, -(-used_bytes // r), size_classes, dict(counters), info
    )
