"""N engine replicas behind a router, in front of one shared store (``--replicas N``).

Each replica has its own HBM (its engine's KV pool) and, with ``--dram-per-replica``, its own
DRAM; otherwise the DRAM is one tier shared by all, and the SSD is always shared. A request
is routed first (``routing.py``), then DESIGN §10 applies unchanged to the tiers that request
can see — its replica's HBM, the DRAM it reaches, the shared SSD: expire idle SSD blocks,
hit the longest prefix present in their union (each hit block attributed to the fastest
tier), commit the whole chain to each of those tiers, last→first. Other replicas' tiers are
neither read nor touched. With one replica every routing reduces to the single-engine
``Simulator``, figure for figure (``tests/.../test_hitrate_replicas.py`` checks it).
"""

from __future__ import annotations

import math
from collections.abc import Container, Hashable, Iterable
from dataclasses import dataclass

from kvstore.eviction import make_policy
from kvstore.hitrate.config import TIER_NAMES, SimConfig, is_absent
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.routing import Router
from kvstore.hitrate.simulator import (
    SimTier,
    account,
    build_tier,
    first_of_block_size,
    model_time,
)
from kvstore.hitrate.tally import HitTally

_NOTHING: frozenset[Hashable] = frozenset()


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """How many replicas, and whether each has its own DRAM (``--dram-per-replica``)."""

    replicas: int
    dram_per_replica: bool = False

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {self.replicas}")


class ReplicaSimulator:
    """Replays requests through ``fleet.replicas`` replicas; capacities in ``config`` are per
    replica for HBM (and DRAM with ``dram_per_replica``), for the whole store otherwise.
    ``result()`` sums every replica's hits; ``router.loads`` says where requests went."""

    def __init__(self, config: SimConfig, fleet: FleetConfig, router: Router) -> None:
        make_policy(config.policy, 0)  # unknown policy names fail before any input is read
        if router.replicas != fleet.replicas:
            raise ConfigError("the router and the fleet disagree on the number of replicas")
        self.config = config
        self.fleet = fleet
        self.router = router
        self._block_tokens = 0
        self._hbm: list[SimTier | None] = []
        self._dram: list[SimTier | None] = []  # one per replica, or one shared
        self._ssd: SimTier | None = None
        self._now_s = -math.inf
        self.tally = HitTally()

    def _build(self, block_tokens: int) -> None:
        self._block_tokens = block_tokens
        n, c = self.fleet.replicas, self.config
        self._hbm = [build_tier(c, "hbm", block_tokens) for _ in range(n)]
        drams = n if self.fleet.dram_per_replica else 1
        self._dram = [build_tier(c, "dram", block_tokens) for _ in range(drams)]
        self._ssd = build_tier(c, "ssd", block_tokens)

    def advance(self, request: Request) -> float:
        """As ``Simulator.advance``: the block-size check, the clock, SSD expiry."""
        if first_of_block_size(self._block_tokens, request):
            self._build(request.block_tokens)
        self._now_s = model_time(self.config, request, self._now_s)
        if self._ssd is not None:
            self._ssd.retention.expire(self._now_s)
        return self._now_s

    def _tiers_of(self, replica: int) -> tuple[SimTier | None, SimTier | None, SimTier | None]:
        dram = self._dram[replica] if self.fleet.dram_per_replica else self._dram[0]
        return self._hbm[replica], dram, self._ssd

    def step(self, req: Request, now: float) -> int:
        """Route ``req``, account its hits on its replica's view, commit; its hit tokens."""
        keys = req.keys if isinstance(req.keys, list) else list(req.keys)
        hbm: list[Container[Hashable]] = [t.policy if t else _NOTHING for t in self._hbm]
        replica = self.router.route(req, hbm)
        tiers = self._tiers_of(replica)
        p0, p1, p2 = (t.policy if t is not None else _NOTHING for t in tiers)
        hit = account(self.tally, req, keys, p0, p1, p2, self.config.replay_keep_tokens)
        last_first = keys[::-1]
        for t in tiers:
            if t is not None:
                t.commit(keys, last_first, now)
        return hit

    def feed(self, requests: Iterable[Request]) -> None:
        advance, step = self.advance, self.step
        for req in requests:
            step(req, advance(req))

    def result(self) -> SimResult:
        """Hits of all replicas together; capacities as configured (per replica for HBM)."""
        b = self._block_tokens
        capacity = [self.config.capacity_blocks(name, b) if b else 0 for name in TIER_NAMES]
        present = [not is_absent(self.config.capacity(name)) for name in TIER_NAMES]
        return self.tally.result(b, capacity, present)

    def check_integrity(self) -> None:
        for t in [*self._hbm, *self._dram, self._ssd]:
            if t is not None:
                t.policy.check_integrity()
                t.retention.check_integrity()
        self.tally.check_integrity("replica simulator")
