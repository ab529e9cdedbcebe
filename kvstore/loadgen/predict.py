"""What the hit-rate model predicts for the store under test: the ``kvstore hitrate``
simulator, with each tier's capacity in blocks read from the store's ``Stats``.

Capacities are per size class (DESIGN §6): a tier's ``capacity_blocks`` for the run's
``block_bytes`` is what it could hold of this run's blocks, which is exact while the run's
class is the only one in the store (a daemon shared with other block sizes lends chunks
between classes, and the prediction is then an upper bound).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from kvstore.hitrate.config import ABSENT, TIER_NAMES, SimConfig
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.simulator import Simulator
from kvstore.loadgen.errors import LoadgenError
from kvstore.tier import StoreStats, TierStats
from kvstore.units import Capacity


@dataclass(frozen=True, slots=True)
class TierCapacities:
    """Blocks of the run's size class each present tier holds (absent tiers left out)."""

    block_bytes: int
    blocks: dict[str, int]
    policy: str = "lru"

    def sim_config(self, block_tokens: int) -> SimConfig:
        """Capacities as token counts, ``blocks × B``, which the simulator turns back into
        exactly ``blocks`` blocks; SSD retention off (see ``predict``)."""
        caps: dict[str, Capacity] = {name: ABSENT for name in TIER_NAMES}
        for name, n in self.blocks.items():
            caps[name] = Capacity(tokens=n * block_tokens)
        return SimConfig(
            hbm=caps["hbm"],
            dram=caps["dram"],
            ssd=caps["ssd"],
            bytes_per_token=1.0,  # unused: every capacity is in tokens
            policy=self.policy,
            retention_s=math.inf,
        )


def _class_blocks(tier: TierStats, block_bytes: int) -> int:
    for c in tier.size_classes:
        if c.block_bytes == block_bytes:
            return int(c.capacity_blocks)
    raise LoadgenError(
        f"the store's {tier.name} tier reports no size class of {block_bytes} bytes; "
        "register the namespace before reading capacities"
    )


def capacities_from_stats(stats: StoreStats, block_bytes: int) -> TierCapacities:
    blocks: dict[str, int] = {}
    policy = "lru"
    for tier in stats.tiers:
        if tier.name not in TIER_NAMES:
            continue
        blocks[tier.name] = _class_blocks(tier, block_bytes)
        if tier.name == "dram":
            policy = tier.info.get("policy", policy) or policy
    if not blocks:
        raise LoadgenError("the store reports no hbm, dram or ssd tier")
    return TierCapacities(block_bytes=block_bytes, blocks=blocks, policy=policy)


def predict(
    requests: Iterable[Request], capacities: TierCapacities, block_tokens: int
) -> SimResult:
    """Replay ``requests`` (the same stream the load run replayed, in the same order)
    through the model. Retention is off: a replay takes minutes of wall time, far below
    any SSD retention a daemon runs with, so nothing expires in the store either."""
    sim = Simulator(capacities.sim_config(block_tokens))
    sim.feed(requests)
    return sim.result()
