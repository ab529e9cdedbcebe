"""Frozen configuration of one replay (the flags of ``kvstore hitrate``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvstore.hitrate.errors import ConfigError
from kvstore.units import Capacity

TIER_NAMES: tuple[str, ...] = ("hbm", "dram", "ssd")
"""Fastest first: a hit block is attributed to the first of these that holds it (DESIGN §10)."""

ABSENT = Capacity(bytes_=0)
UNBOUNDED = Capacity()


def is_absent(capacity: Capacity) -> bool:
    """``0`` (bytes or tokens) means the tier does not exist, not a tier that holds nothing."""
    return not capacity.unbounded and (capacity.bytes_ or capacity.tokens or 0) == 0


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Tier sizes and the model's knobs. ``retention_s`` applies to the SSD tier only and is
    compared with trace time × ``time_scale``."""

    hbm: Capacity = ABSENT
    dram: Capacity = ABSENT
    ssd: Capacity = UNBOUNDED
    bytes_per_token: float = 890.0
    policy: str = "lru"
    retention_s: float = 72 * 3600.0
    time_scale: float = 1.0
    replay_keep_tokens: int = 140

    def __post_init__(self) -> None:
        # At least a byte: below it capacities in blocks overflow to infinity (1e-320).
        if not 1 <= self.bytes_per_token < math.inf:
            raise ConfigError(
                f"--bytes-per-token must be a number >= 1, got {self.bytes_per_token}"
            )
        if not self.retention_s > 0:
            raise ConfigError(f"--retention must be positive, got {self.retention_s}s")
        if not self.time_scale > 0 or math.isinf(self.time_scale):
            raise ConfigError(f"--time-scale must be a positive number, got {self.time_scale}")
        if self.replay_keep_tokens < 0:
            raise ConfigError(f"--replay-keep must not be negative, got {self.replay_keep_tokens}")

    def capacity(self, tier: str) -> Capacity:
        return {"hbm": self.hbm, "dram": self.dram, "ssd": self.ssd}[tier]

    def with_capacity(self, tier: str, capacity: Capacity) -> SimConfig:
        if tier == "hbm":
            return replace(self, hbm=capacity)
        if tier == "dram":
            return replace(self, dram=capacity)
        if tier == "ssd":
            return replace(self, ssd=capacity)
        raise ConfigError(f"unknown tier {tier!r}; known: {', '.join(TIER_NAMES)}")

    def capacity_blocks(self, tier: str, block_tokens: int) -> float:
        """Blocks the tier holds (``math.inf`` if unbounded, 0 if absent), DESIGN §10 rounding."""
        cap = self.capacity(tier)
        if is_absent(cap):
            return 0
        return cap.blocks(block_tokens, self.bytes_per_token)
