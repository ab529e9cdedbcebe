"""A ``--replicas`` run: every routing asked for, its sweep points, and what the shared store
buys ``round_robin`` — each a replay of the input through a ``ReplicaSimulator``.

Per-point replay (no one-pass engine): routing makes a replica's HBM contents depend on its
capacity (``cache_aware`` reads them), so there is no single stack to answer every capacity.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from kvstore.hitrate.config import ABSENT, SimConfig, is_absent
from kvstore.hitrate.replicas import FleetConfig, ReplicaSimulator
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.routing import RoundRobin, make_router
from kvstore.hitrate.sweep import SweepPoint, SweepSpec

Requests = Callable[[], Iterator[Request]]
"""Returns a fresh iterator over the whole input each call (one per replay)."""


@dataclass(frozen=True, slots=True)
class RoutingOutcome:
    """One routing's figures: the configured point, requests per replica, sweep points."""

    routing: str
    result: SimResult
    requests_per_replica: tuple[int, ...]
    sweep: tuple[SweepPoint, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreBenefit:
    """``round_robin`` with the replicas' HBM pools alone (no DRAM, no SSD) and with the
    configured shared store: what the store buys a router that ignores cache contents."""

    pools_alone: SimResult
    with_store: SimResult

    @property
    def gain_points(self) -> float:
        """Token hit rate added by the store, in percentage points."""
        return 100 * (self.with_store.token_hit_rate - self.pools_alone.token_hit_rate)


@dataclass(frozen=True, slots=True)
class FleetRun:
    fleet: FleetConfig
    outcomes: tuple[RoutingOutcome, ...]
    store_benefit: StoreBenefit | None  # None when the run has no store (DRAM and SSD absent)


def replay(
    requests: Requests, config: SimConfig, fleet: FleetConfig, routing: str
) -> tuple[SimResult, tuple[int, ...]]:
    """One replay: the result and how many requests each replica served."""
    sim = ReplicaSimulator(config, fleet, make_router(routing, fleet.replicas))
    sim.feed(requests())
    return sim.result(), tuple(sim.router.loads)


def has_store(config: SimConfig) -> bool:
    return not (is_absent(config.dram) and is_absent(config.ssd))


def run_fleet(
    requests: Requests,
    config: SimConfig,
    fleet: FleetConfig,
    routings: Sequence[str],
    specs: Sequence[SweepSpec] = (),
) -> FleetRun:
    """Every routing at the configured point and each sweep point, plus the store benefit.
    Costs ``len(routings) × (1 + points)`` replays, and one more without ``round_robin``."""
    outcomes = []
    for routing in routings:
        result, loads = replay(requests, config, fleet, routing)
        points = tuple(
            SweepPoint(
                spec.tier,
                cap,
                replay(requests, config.with_capacity(spec.tier, cap), fleet, routing)[0],
            )
            for spec in specs
            for cap in spec.points
        )
        outcomes.append(RoutingOutcome(routing, result, loads, points))
    benefit = None
    if has_store(config):
        rr = next((o.result for o in outcomes if o.routing == RoundRobin.name), None)
        if rr is None:
            rr = replay(requests, config, fleet, RoundRobin.name)[0]
        alone = replay(requests, replace(config, dram=ABSENT, ssd=ABSENT), fleet, RoundRobin.name)
        benefit = StoreBenefit(pools_alone=alone[0], with_store=rr)
    return FleetRun(fleet, tuple(outcomes), benefit)
