"""The replica simulator: one replica is the single engine, exactly; routing decides which
HBM a request sees; the shared store serves what a replica's own pool misses."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hitrate_properties import B, cap, retentions, tier_caps, traces

from kvstore.hitrate.config import ABSENT, UNBOUNDED, SimConfig
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.fleet import run_fleet
from kvstore.hitrate.replicas import FleetConfig, ReplicaSimulator
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.routing import ROUTINGS, make_router
from kvstore.hitrate.simulator import Simulator
from kvstore.units import Capacity


def replay(
    reqs: list[Request], config: SimConfig, n: int, routing: str, **fleet: bool
) -> tuple[SimResult, list[int]]:
    sim = ReplicaSimulator(config, FleetConfig(n, **fleet), make_router(routing, n))
    sim.feed(reqs)
    sim.check_integrity()
    return sim.result(), sim.router.loads


def single(reqs: list[Request], config: SimConfig) -> SimResult:
    sim = Simulator(config)
    sim.feed(reqs)
    return sim.result()


@settings(max_examples=60, deadline=None)
@given(
    traces(),
    tier_caps,
    tier_caps,
    tier_caps,
    retentions,
    st.sampled_from(ROUTINGS),
    st.booleans(),
    st.sampled_from(["lru", "s3fifo"]),
)
def test_one_replica_is_the_single_engine(
    reqs: list[Request],
    hbm: float,
    dram: float,
    ssd: float,
    ret: float,
    routing: str,
    own_dram: bool,
    policy: str,
) -> None:
    config = SimConfig(hbm=cap(hbm), dram=cap(dram), ssd=cap(ssd), retention_s=ret, policy=policy)
    got, loads = replay(reqs, config, 1, routing, dram_per_replica=own_dram)
    assert got == single(reqs, config)  # every field, the float ratio sum included
    assert loads == [len(reqs)]


@settings(max_examples=40, deadline=None)
@given(traces(), tier_caps, st.integers(2, 4), st.sampled_from(ROUTINGS))
def test_hits_add_up_and_the_store_never_hurts(
    reqs: list[Request], hbm: float, n: int, routing: str
) -> None:
    pools = SimConfig(hbm=cap(hbm), ssd=ABSENT)
    alone, loads = replay(reqs, pools, n, routing)
    with_store, _ = replay(reqs, replace(pools, ssd=UNBOUNDED), n, routing)
    assert sum(loads) == len(reqs)
    # Routing reads only HBM, which the store does not change: same routes, a superset of
    # present blocks (an unbounded SSD without retention holds every block ever seen).
    assert with_store.hit_tokens >= alone.hit_tokens
    assert with_store.tier("hbm").hit_tokens >= alone.tier("hbm").hit_tokens


def reqs_of(*chains: tuple[str | None, list[int]]) -> list[Request]:
    return [Request(float(i), len(k) * B, k, B, s) for i, (s, k) in enumerate(chains)]


ONE_SESSION = reqs_of(("a", [1]), ("a", [1, 2]), ("a", [1, 2, 3]), ("a", [1, 2, 3, 4]))
HBM_ONLY = SimConfig(hbm=Capacity(tokens=100 * B), ssd=ABSENT)


def test_round_robin_loses_the_prefix_that_sticky_keeps() -> None:
    rr, rr_loads = replay(ONE_SESSION, HBM_ONLY, 2, "round_robin")
    sticky, sticky_loads = replay(ONE_SESSION, HBM_ONLY, 2, "sticky")
    assert rr_loads == [2, 2] and sticky_loads == [4, 0]
    # Sticky: every request hits its whole previous chain (1 + 2 + 3 blocks).
    assert sticky.tier("hbm").hit_blocks == 6
    # Round robin: request 3 finds [1] on replica 0, request 4 finds [1, 2] on replica 1.
    assert rr.tier("hbm").hit_blocks == 3
    aware, _ = replay(ONE_SESSION, HBM_ONLY, 2, "cache_aware")
    assert aware == sticky


def test_the_shared_store_serves_what_a_replica_misses() -> None:
    config = replace(HBM_ONLY, ssd=UNBOUNDED)
    rr, _ = replay(ONE_SESSION, config, 2, "round_robin")
    # Every block of every earlier request: 6, three of them from the other replica's
    # commits via the SSD.
    assert (rr.tier("hbm").hit_blocks, rr.tier("ssd").hit_blocks) == (3, 3)


def test_shared_dram_versus_dram_per_replica() -> None:
    config = SimConfig(dram=Capacity(tokens=100 * B), ssd=ABSENT)
    shared, _ = replay(ONE_SESSION, config, 2, "round_robin")
    own, _ = replay(ONE_SESSION, config, 2, "round_robin", dram_per_replica=True)
    assert shared.tier("dram").hit_blocks == 6
    assert own.tier("dram").hit_blocks == 3


def test_run_fleet_reports_every_routing_and_the_store_benefit() -> None:
    config = replace(HBM_ONLY, ssd=UNBOUNDED)
    run = run_fleet(lambda: iter(ONE_SESSION), config, FleetConfig(2), ("sticky", "round_robin"))
    assert [o.routing for o in run.outcomes] == ["sticky", "round_robin"]
    b = run.store_benefit
    assert b is not None
    assert b.with_store == run.outcomes[1].result
    assert b.pools_alone.tier("hbm").hit_blocks == 3 and b.pools_alone.tier("ssd").hit_blocks == 0
    assert b.gain_points > 0
    # Without round_robin among the routings it is still replayed for the comparison.
    only = run_fleet(lambda: iter(ONE_SESSION), config, FleetConfig(2), ("sticky",))
    assert only.store_benefit == b
    # No store, nothing to compare.
    assert (
        run_fleet(lambda: iter(ONE_SESSION), HBM_ONLY, FleetConfig(2), ("sticky",)).store_benefit
        is None
    )


def test_fleet_config_refuses_no_replicas() -> None:
    with pytest.raises(ConfigError, match="at least 1"):
        FleetConfig(0)


def test_block_size_change_is_refused() -> None:
    sim = ReplicaSimulator(SimConfig(), FleetConfig(2), make_router("round_robin", 2))
    with pytest.raises(ConfigError, match="block sizes"):
        sim.feed([Request(0, 4, [1], 4), Request(1, 8, [1], 8)])


def test_capacity_in_the_result_is_per_replica() -> None:
    res, _ = replay(ONE_SESSION, HBM_ONLY, 3, "round_robin")
    assert res.tier("hbm").capacity_blocks == 100
    assert math.isinf(replay(ONE_SESSION, SimConfig(), 2, "sticky")[0].tier("ssd").capacity_blocks)


@settings(max_examples=40, deadline=None)
@given(traces(), tier_caps, tier_caps, st.integers(1, 3), st.sampled_from(ROUTINGS))
def test_instant_requests_fed_timed_are_the_plain_replay(
    reqs: list[Request], hbm: float, dram: float, n: int, routing: str
) -> None:
    """``feed_timed`` with every request done when it arrives is ``feed`` (in time order;
    equal times keep their input order), whatever the routing."""
    reqs = sorted(reqs, key=lambda r: r.time_s)
    config = SimConfig(hbm=cap(hbm), dram=cap(dram), ssd=ABSENT)
    plain, loads = replay(reqs, config, n, routing)
    sim = ReplicaSimulator(config, FleetConfig(n), make_router(routing, n))
    seen: list[int] = []
    replicas = sim.feed_timed([(r, r.time_s) for r in reqs],
                              lambda i, replica: seen.append(i))
    sim.check_integrity()
    assert sim.result() == plain and sim.router.loads == loads
    assert seen == list(range(len(reqs))) and len(replicas) == len(reqs)
    assert [replicas.count(r) for r in range(n)] == loads


def test_a_request_in_flight_neither_serves_nor_evicts_blocks() -> None:
    """A pool of 3 blocks. C ([7, 8, 9]) is admitted at t=1 and done at t=5; D, at t=3,
    still finds [1, 2, 3] (committed by A, done at t=0.5), which C evicts only when it
    ends; E, at t=2 (done at t=6), misses C's blocks, which are not computed yet. The
    plain replay (each request done at once) says the opposite for both."""
    tiny = SimConfig(hbm=Capacity(tokens=3 * B), ssd=ABSENT)
    a = Request(0.0, 3 * B, [1, 2, 3], B)
    c = Request(1.0, 3 * B, [7, 8, 9], B)
    e = Request(2.0, 2 * B, [7, 8], B)
    d = Request(3.0, 3 * B, [1, 2, 3], B)
    sim = ReplicaSimulator(tiny, FleetConfig(1), make_router("round_robin", 1))
    hits: list[int] = []
    last = [0]

    def looked_up(i: int, replica: int) -> None:
        hits.append(sim.tally.hit_tokens - last[0])
        last[0] = sim.tally.hit_tokens

    sim.feed_timed([(a, 0.5), (c, 5.0), (e, 6.0), (d, 3.5)], looked_up)
    sim.check_integrity()
    assert hits == [0, 0, 0, 3 * B]  # lookups in time order: a, c, e, d
    plain, _ = replay([a, c, e, d], tiny, 1, "round_robin")
    assert plain.hit_tokens == 2 * B  # E hits C's first two blocks, D nothing


def test_taken_at_arrival_evicts_at_once_but_serves_only_when_done() -> None:
    """``take_at_arrival``: C takes the pool's 3 blocks when it arrives (t=1), so D (t=3)
    no longer finds A's; E (t=2) still misses C's blocks, which C has not computed yet;
    F (t=6, after C is done) hits them."""
    tiny = SimConfig(hbm=Capacity(tokens=3 * B), ssd=ABSENT)
    a = Request(0.0, 3 * B, [1, 2, 3], B)
    c = Request(1.0, 3 * B, [7, 8, 9], B)
    e = Request(2.0, 2 * B, [7, 8], B)
    d = Request(3.0, 3 * B, [1, 2, 3], B)
    f = Request(6.0, 3 * B, [7, 8, 9], B)
    sim = ReplicaSimulator(tiny, FleetConfig(1), make_router("round_robin", 1))
    hits: list[int] = []
    last = [0]

    def looked_up(i: int, replica: int) -> None:
        hits.append(sim.tally.hit_tokens - last[0])
        last[0] = sim.tally.hit_tokens

    sim.feed_timed([(a, 0.5), (c, 5.0), (e, 9.0), (d, 9.5), (f, 7.0)], looked_up,
                   take_at_arrival=True)
    sim.check_integrity()
    assert hits == [0, 0, 0, 0, 3 * B]  # a, c, e, d, f
    assert sim._taken == []  # nothing left taken once every request is done
