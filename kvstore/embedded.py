"""Build the embedded store (DRAM over an optional SSD engine) from plain settings."""

from __future__ import annotations

import math
from pathlib import Path

from kvstore.dram import DramConfig, DramTier
from kvstore.manager import ManagerConfig, TierManager
from kvstore.tier import Tier

DEFAULT_RETENTION_S = 72 * 3600.0


def open_embedded(
    dram_bytes: int,
    ssd_dir: str | None = None,
    ssd_capacity_bytes: int | None = None,
    retention_s: float = DEFAULT_RETENTION_S,
    max_dirty_bytes: int | None = None,
    policy: str = "lru",
    dram_chunk_bytes: int | None = None,
    shared_fs_dir: str | None = None,
    shared_fs_capacity_bytes: int | None = None,
    shared_fs_id: str | None = None,
) -> TierManager:
    """DRAM tier of ``dram_bytes``; with ``ssd_dir``, the SSD engine below it; with
    ``shared_fs_dir`` (a directory on a distributed file system every host mounts),
    the shared-FS tier instead: this daemon's ``shared_fs_capacity_bytes`` of segments
    there, under ``shared_fs_id`` (default: the host name), and every peer's blocks."""
    tiers: list[Tier] = [
        DramTier(DramConfig(dram_bytes, chunk_bytes=dram_chunk_bytes, policy=policy))
    ]
    if ssd_dir is not None:
        from storage_nodes.ssd import SSDConfig, SSDTier

        if ssd_capacity_bytes is None:
            raise ValueError("an SSD tier needs a capacity")
        if retention_s != math.inf and retention_s <= 0:
            raise ValueError("retention must be positive")
        tiers.append(
            SSDTier(
                SSDConfig(
                    dir=Path(ssd_dir), capacity_bytes=ssd_capacity_bytes, retention_s=retention_s
                )
            )
        )
    if shared_fs_dir is not None:
        from storage_nodes.sharedfs import SharedFSConfig, SharedFSTier
        from storage_nodes.sharedfs.config import default_daemon_id

        if ssd_dir is not None:
            raise ValueError("one tier below DRAM: an SSD directory or a shared file system")
        if shared_fs_capacity_bytes is None:
            raise ValueError("a shared-FS tier needs a capacity")
        tiers.append(
            SharedFSTier(
                SharedFSConfig(
                    root=Path(shared_fs_dir),
                    capacity_bytes=shared_fs_capacity_bytes,
                    retention_s=retention_s,
                    daemon_id=shared_fs_id or default_daemon_id(),
                )
            )
        )
    return TierManager(tiers, ManagerConfig(max_dirty_bytes=max_dirty_bytes))
