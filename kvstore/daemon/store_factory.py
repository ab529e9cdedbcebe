"""Builds the store the daemon serves: DRAM over the embedded SSD engine or a cluster."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from kvstore.daemon.config import DaemonConfig
from kvstore.errors import InvalidArgument
from kvstore.tier import KVStore, Tier

if TYPE_CHECKING:
    from storage_nodes.cluster import ClusterTier

log = logging.getLogger(__name__)


def open_store(config: DaemonConfig) -> KVStore:
    from kvstore.embedded import open_embedded

    if config.nodes:
        from kvstore.dram import DramConfig, DramTier
        from kvstore.manager import ManagerConfig, TierManager

        cluster = open_cluster(config)
        return TierManager(
            [DramTier(DramConfig(config.dram_bytes)), cluster],
            ManagerConfig(max_dirty_bytes=config.max_dirty_bytes),
        )
    return open_embedded(
        dram_bytes=config.dram_bytes,
        ssd_dir=config.ssd_dir,
        ssd_capacity_bytes=config.ssd_capacity_bytes,
        retention_s=config.retention_s,
        max_dirty_bytes=config.max_dirty_bytes,
        shared_fs_dir=config.shared_fs_dir,
        shared_fs_capacity_bytes=config.shared_fs_capacity_bytes,
        shared_fs_id=config.shared_fs_id,
    )


def open_cluster(config: DaemonConfig) -> Tier:
    """The cluster tier for ``--nodes`` with the daemon's flags, checked to keep blocks for
    the daemon's ``--retention`` (nodes enforce retention; the daemon only promises it)."""
    from storage_nodes.cluster import open_cluster_tier
    from storage_nodes.cluster.config import node_token

    link = config.cluster
    replicas, quorum = link.resolved(len(config.nodes))
    token = node_token(link.token_file)
    tier = open_cluster_tier(
        list(config.nodes),
        replicas=replicas,
        write_quorum=quorum,
        tls=link.tls,
        tls_ca_file=link.tls_ca_file,
        auth_token=token,
    )
    try:
        check_node_retention(tier, config.retention_s)
    except BaseException:
        tier.close()
        raise
    return tier


def check_node_retention(tier: ClusterTier, retention_s: float) -> None:
    """Refuse nodes that keep idle blocks for another time than the daemon's
    ``--retention``; nodes that do not answer now are checked by nobody (logged)."""
    told = tier.stats().info.get("node_retention_s", "")
    answered = dict(item.rpartition("=")[::2] for item in told.split(",") if item)
    wrong = {n: float(v) for n, v in answered.items() if not math.isclose(float(v), retention_s)}
    if wrong:
        node, kept = next(iter(sorted(wrong.items())))
        raise InvalidArgument(
            f"--retention {_duration(retention_s)}: node {node} keeps idle blocks for "
            f"{_duration(kept)}; run every node with the daemon's --retention"
        )
    unchecked = len(tier.config.nodes) - len(answered)
    if unchecked:
        log.warning("%d storage nodes did not answer: their retention is unchecked", unchecked)


def _duration(s: float) -> str:
    if math.isinf(s):
        return "inf"
    return f"{s / 3600:g}h" if s >= 3600 and s % 3600 == 0 else f"{s:g}s"
