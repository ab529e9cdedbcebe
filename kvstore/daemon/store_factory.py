"""Builds the store the daemon serves: DRAM over the embedded SSD engine or a cluster."""

from __future__ import annotations

import importlib.util

from kvstore.daemon.config import DaemonConfig
from kvstore.errors import InvalidArgument
from kvstore.tier import KVStore


def open_store(config: DaemonConfig) -> KVStore:
    from kvstore.embedded import open_embedded

    if config.nodes:
        opener = None
        if importlib.util.find_spec("storage_nodes.cluster") is not None:
            from storage_nodes import cluster

            opener = getattr(cluster, "open_cluster_tier", None)
        if opener is None:
            raise InvalidArgument(
                "--nodes: the storage-node cluster is not available yet (storage_nodes.cluster)"
            )
        from kvstore.dram import DramConfig, DramTier
        from kvstore.manager import ManagerConfig, TierManager

        return TierManager(
            [DramTier(DramConfig(config.dram_bytes)), opener(list(config.nodes))],
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
