"""The hit-rate model of DESIGN §10, driven through the same eviction policies as the DRAM tier.

Per request: expire idle SSD blocks, find the longest prefix present in the union of the
tiers (each hit block attributed to the fastest tier holding it), then commit the whole
chain to every tier, last→first. Tiers never influence each other: each is a policy of its
own capacity over the same stream of commits.
"""

from __future__ import annotations

import math
from collections.abc import Container, Hashable, Iterable
from dataclasses import dataclass

from kvstore.eviction import EvictionPolicy, make_policy
from kvstore.hitrate.config import TIER_NAMES, SimConfig, is_absent
from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.request import Request
from kvstore.hitrate.result import SimResult
from kvstore.hitrate.retention import IdleExpiry, NoRetention, Retention
from kvstore.hitrate.tally import HitTally

_NOTHING: frozenset[Hashable] = frozenset()
"""Stands in for an absent tier in membership tests: C-speed ``in``, always False."""


@dataclass(slots=True)
class SimTier:
    """One simulated tier: its policy and retention (a null object where none applies)."""

    name: str
    capacity_blocks: float
    policy: EvictionPolicy
    retention: Retention

    def commit(self, keys: list[Hashable], last_first: list[Hashable], now_s: float) -> None:
        """Insert/touch the chain ``keys``; ``last_first`` is the same chain reversed."""
        evicted = self.policy.access_many(last_first)
        self.retention.record(keys, evicted, now_s)


def build_tier(config: SimConfig, name: str, block_tokens: int) -> SimTier | None:
    """Tier ``name`` as ``config`` sizes it for blocks of ``block_tokens``; None if absent.
    Only the SSD has a retention (DESIGN §6)."""
    if is_absent(config.capacity(name)):
        return None
    blocks = config.capacity_blocks(name, block_tokens)
    policy = make_policy(config.policy, blocks)
    retention: Retention = NoRetention()
    if name == "ssd" and not math.isinf(config.retention_s):
        retention = IdleExpiry(policy, config.retention_s)
    return SimTier(name, blocks, policy, retention)


def account(
    tally: HitTally,
    req: Request,
    keys: list[Hashable],
    p0: Container[Hashable],
    p1: Container[Hashable],
    p2: Container[Hashable],
    replay_keep_tokens: int,
) -> int:
    """Add ``req``'s longest present prefix over the tiers ``p0`` (fastest) … ``p2`` to
    ``tally``, each hit block attributed to the fastest tier holding it; return its hit
    tokens. Shared by every simulator so that they all do the §10 arithmetic one way."""
    c0 = c1 = c2 = 0
    # The hot loop: membership only, attribution by counting.
    for k in keys:
        if k in p0:
            c0 += 1
        elif k in p1:
            c1 += 1
        elif k in p2:
            c2 += 1
        else:
            break
    h = c0 + c1 + c2
    b = req.block_tokens
    big_l = req.input_tokens
    tok = [c0 * b, c1 * b, c2 * b]
    # Blocks from index L // B on weigh less than B (the partial tail, or nothing).
    for i in range(big_l // b, h):
        k = keys[i]
        ti = 0 if k in p0 else 1 if k in p1 else 2
        tok[ti] -= b - max(0, big_l - i * b)
    return tally.add(big_l, (c0, c1, c2), tok, replay_keep_tokens)


def first_of_block_size(current: int, request: Request) -> bool:
    """True when ``request`` is a replay's first (its tiers are built for its block size);
    a request of another block size than the replay's is a ``ConfigError``."""
    if request.block_tokens == current:
        return False
    if current:
        raise ConfigError(
            f"requests with block sizes {current} and {request.block_tokens} "
            "in one replay; replay each block size separately"
        )
    return True


def model_time(config: SimConfig, request: Request, now_s: float) -> float:
    """The replay's clock after ``request``: trace time never runs backwards, so a
    late-logged request is replayed "now"."""
    return max(now_s, request.time_s * config.time_scale)


class Simulator:
    """Replays requests through up to three tiers; ``result()`` may be read at any time.

    The tier layout is fixed by the first request's block size (capacities in bytes are
    blocks of that size); a later request with another block size is a ``ConfigError``.
    """

    def __init__(self, config: SimConfig) -> None:
        make_policy(config.policy, 0)  # unknown policy names fail before any input is read
        self.config = config
        self._block_tokens = 0
        self._tiers: list[SimTier | None] = [None, None, None]
        self._now_s = -math.inf
        self.tally = HitTally()

    # -- set-up -------------------------------------------------------------------------

    def _build(self, block_tokens: int) -> None:
        self._block_tokens = block_tokens
        for i, name in enumerate(TIER_NAMES):
            self._tiers[i] = build_tier(self.config, name, block_tokens)

    @property
    def block_tokens(self) -> int:
        """The run's block size; 0 before the first request."""
        return self._block_tokens

    @property
    def tiers(self) -> list[SimTier]:
        """The present tiers, fastest first."""
        return [t for t in self._tiers if t is not None]

    def membership(self) -> tuple[Container[Hashable], Container[Hashable], Container[Hashable]]:
        """Each tier's policy for ``key in``; an empty set for an absent tier."""
        a, b, c = (t.policy if t is not None else _NOTHING for t in self._tiers)
        return a, b, c

    def advance(self, request: Request) -> float:
        """Move the clock to ``request`` and expire idle SSD blocks; return the model time."""
        if first_of_block_size(self._block_tokens, request):
            self._build(request.block_tokens)
        self._now_s = model_time(self.config, request, self._now_s)
        for t in self._tiers:
            if t is not None:
                t.retention.expire(self._now_s)
        return self._now_s

    # -- the model ----------------------------------------------------------------------

    def lookup(self, request: Request) -> tuple[int, list[int]]:
        """Longest present prefix and the tier index (0 hbm, 1 dram, 2 ssd) of each hit
        block; no side effects (``step`` inlines the same loop)."""
        p0, p1, p2 = self.membership()
        where: list[int] = []
        for k in request.keys:
            if k in p0:
                where.append(0)
            elif k in p1:
                where.append(1)
            elif k in p2:
                where.append(2)
            else:
                break
        return len(where), where

    def commit(self, keys: list[Hashable], now_s: float) -> None:
        last_first = keys[::-1]
        for t in self._tiers:
            if t is not None:
                t.commit(keys, last_first, now_s)

    def feed(self, requests: Iterable[Request]) -> None:
        """Replay ``requests`` in order, accumulating totals."""
        advance, step = self.advance, self.step
        for req in requests:
            step(req, advance(req))

    def step(self, req: Request, now: float) -> int:
        """Look ``req`` up, account its hits, commit its chain; return its hit tokens.
        ``now`` comes from ``advance(req)``."""
        keys = req.keys
        if not isinstance(keys, list):
            keys = list(keys)
        p0, p1, p2 = self.membership()
        hit = account(self.tally, req, keys, p0, p1, p2, self.config.replay_keep_tokens)
        self.commit(keys, now)
        return hit

    # -- results ------------------------------------------------------------------------

    def result(self) -> SimResult:
        b = self._block_tokens
        capacity: list[float] = []
        for i, name in enumerate(TIER_NAMES):
            t = self._tiers[i]
            cap = self.config.capacity_blocks(name, b) if b else 0
            capacity.append(t.capacity_blocks if t is not None else cap)
        present = [not is_absent(self.config.capacity(name)) for name in TIER_NAMES]
        return self.tally.result(b, capacity, present)

    def check_integrity(self) -> None:
        for t in self.tiers:
            t.policy.check_integrity()
            t.retention.check_integrity()
        self.tally.check_integrity("simulator")
