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
from collections.abc import Callable, Container, Hashable, Iterable, Sequence
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


class _Visible:
    """A pool's blocks less those ``taken`` by requests still computing them."""

    __slots__ = ("held", "taken")

    def __init__(self, held: Container[Hashable], taken: set[Hashable]) -> None:
        self.held, self.taken = held, taken

    def __contains__(self, key: object) -> bool:
        return key in self.held and key not in self.taken


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
        # Per replica, HBM blocks taken by requests in flight, not computed yet (feed_timed).
        self._taken: list[set[Hashable]] = []

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
        replica, hit = self.look_up(req)
        self.commit(req, replica, now)
        return hit

    def _hbm_view(self, replica: int) -> Container[Hashable]:
        """What a lookup finds in ``replica``'s HBM: its blocks, less those taken by
        requests in flight that have not computed them yet (``feed_timed``)."""
        t = self._hbm[replica]
        if t is None:
            return _NOTHING
        taken = self._taken[replica] if self._taken else None
        return _Visible(t.policy, taken) if taken else t.policy

    def look_up(self, req: Request) -> tuple[int, int]:
        """Route ``req`` and account its hits on its replica's view: (replica, hit tokens)."""
        keys = req.keys if isinstance(req.keys, list) else list(req.keys)
        hbm = [self._hbm_view(r) for r in range(self.fleet.replicas)]
        replica = self.router.route(req, hbm)
        _, dram, ssd = self._tiers_of(replica)
        p1, p2 = (t.policy if t is not None else _NOTHING for t in (dram, ssd))
        return replica, account(self.tally, req, keys, hbm[replica], p1, p2,
                                self.config.replay_keep_tokens)

    def _take(self, req: Request, replica: int) -> None:
        """``req`` is admitted on ``replica``: its pool takes the blocks it lacks now
        (evicting the least recent), which stay invisible until it is done."""
        t = self._hbm[replica]
        if t is None:
            return
        keys = req.keys if isinstance(req.keys, list) else list(req.keys)
        view = self._hbm_view(replica)
        new = [k for k in keys if k not in view]
        t.policy.access_many(keys[::-1])
        self._taken[replica].update(new)

    def _computed(self, replica: int, req: Request) -> None:
        """``req`` is done on ``replica``: its blocks are computed, whoever else took them."""
        taken = self._taken[replica]
        for k in req.keys:
            taken.discard(k)

    def commit(self, req: Request, replica: int, now: float) -> None:
        """Commit ``req``'s chain to the tiers its replica sees, last→first."""
        keys = req.keys if isinstance(req.keys, list) else list(req.keys)
        last_first = keys[::-1]
        for t in self._tiers_of(replica):
            if t is not None:
                t.commit(keys, last_first, now)

    def feed(self, requests: Iterable[Request]) -> None:
        """Each request looked up and committed before the next arrives (a trace's
        requests are instants: DESIGN §10)."""
        advance, step = self.advance, self.step
        for req in requests:
            step(req, advance(req))

    def feed_timed(self, requests: Sequence[tuple[Request, float]],
                   on_lookup: Callable[[int, int], None] | None = None,
                   take_at_arrival: bool = False) -> list[int]:
        """Requests that take time, as ``(request, done_s)`` with ``done_s >= time_s``: each
        is looked up (and routed) when it arrives, at ``time_s``, and committed when it is
        done, at ``done_s``, so a request arriving in between neither finds its blocks nor
        loses blocks to them. (A model of concurrent requests on one pool; measured against
        the engine's pools it did worse than ``feed``: see the README.) Events run in time
        order (a commit
        before a lookup at the same instant); returns the replica of each request.
        ``on_lookup(i, replica)`` is called after request ``i``'s lookup (the only event
        that counts hits: the tally's change since the previous call is request ``i``'s).

        ``take_at_arrival``: a request's replica also takes the HBM blocks it lacks when it
        arrives (evicting the least recent then, as an engine allocating a request's blocks
        does), though they stay invisible to other lookups until it is done."""
        self._taken = [set() for _ in range(self.fleet.replicas)]
        taking: set[int] = set()  # requests that took blocks and are not done
        events = sorted([(done, 0, i) for i, (_, done) in enumerate(requests)]
                        + [(req.time_s, 1, i) for i, (req, _) in enumerate(requests)])
        replica: list[int] = [-1] * len(requests)
        pending: list[int] = []  # commits whose own lookup has not run yet (done == time)
        for t, kind, i in events:
            req = requests[i][0]
            if kind == 1:
                self.advance(req)
                replica[i] = self.look_up(req)[0]
                if on_lookup is not None:
                    on_lookup(i, replica[i])
                if i in pending:
                    pending.remove(i)
                    self.commit(req, replica[i], self._now_s)
                elif take_at_arrival:
                    self._take(req, replica[i])
                    taking.add(i)
            elif replica[i] < 0:
                pending.append(i)
            else:
                self._now_s = max(self._now_s, t * self.config.time_scale)
                if i in taking:
                    taking.discard(i)
                    self._computed(replica[i], req)
                self.commit(req, replica[i], self._now_s)
        self._taken = []
        return replica

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
