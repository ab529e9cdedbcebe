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
) -> TierManager:
    """DRAM tier of ``dram_bytes``; with ``ssd_dir``, the SSD engine below it."""
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
    return TierManager(tiers, ManagerConfig(max_dirty_bytes=max_dirty_bytes))
