"""How a router in front of N engine replicas picks one for each request (``--routing``).

The policies are vllm-router's, made deterministic so that a replay is reproducible:

* ``round_robin``: request ``i`` (from 0, in replay order) goes to replica ``i mod N``.
* ``consistent_hash``: the request's *session key* (below) is hashed (blake2b, 64 bits) onto a
  ring holding ``VNODES`` points per replica; the request goes to the first point at or after
  it. Stable across runs and machines (no Python ``hash()``, which is salted per process).
* ``cache_aware``: the replica whose HBM holds the longest prefix of the request's blocks
  (counted from the first block, as the lookup counts hits), if that prefix is more than
  ``CACHE_THRESHOLD`` of the request's blocks; ties go to the least loaded of the best, then
  the lowest index. A shorter best match (a shared system prompt, nothing at all) goes to the
  least loaded replica: without that fallback every request that shares a first block would
  pile onto one replica (vllm-router's ``--cache-threshold``, whose fallback is the replica
  with the smallest cache; its balance guard on requests in flight has no counterpart here).
* ``kv_aware``: vllm-router's policy fed by the replicas' KV events (``--policy kv_aware``):
  the replica whose HBM holds the longest prefix of the request's blocks, *any* length (no
  threshold); ties go to the *highest* index among the best (the router takes Rust's
  ``max_by_key``, which keeps the last of equal maxima). No block held anywhere (a score of
  0, or a request with no full block) goes to the least loaded replica (ties: the lowest
  index, ``min_by_key`` keeping the first). The router also inserts the blocks it expects
  the chosen replica to compute as speculative entries for 2 s, until that replica's events
  arrive; a replay commits a request's blocks to the chosen replica's HBM before the next
  request is routed, which is what those entries stand for, so they need no model here.
* ``sticky``: a session's first request goes to the least loaded replica (ties: lowest index);
  every later request of that session goes to the same replica.

*Load* is the number of requests routed to a replica so far: the replay has no notion of
requests in flight. The *session key* is the request's session id where the trace has one
(kv-cache-tester: the session file's name), else its first block's key (Mooncake, access
logs: requests that share a first block share a prefix, the nearest thing to a session);
a request with no blocks and no session has the empty key.
"""

from __future__ import annotations

import bisect
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Container, Hashable, Sequence
from typing import ClassVar

from kvstore.hitrate.errors import ConfigError
from kvstore.hitrate.request import Request

CACHE_THRESHOLD = 0.3
"""``cache_aware`` follows a match only above this share of the request's blocks (vllm-router's
``--cache-threshold`` default)."""

VNODES = 64
"""Ring points per replica: enough that each replica's share of keys is within a few % of 1/N."""


def session_key(req: Request) -> bytes:
    """The key ``consistent_hash`` and ``sticky`` use, as stable bytes (see the module doc)."""
    if req.session is not None:
        return b"s:" + req.session.encode("utf-8")
    if not req.keys:
        return b""
    k = req.keys[0]
    if isinstance(k, bytes):
        return b"b:" + k
    return b"k:" + repr(int(k) if isinstance(k, int) else k).encode("utf-8")


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


class Router(ABC):
    """Picks a replica in ``[0, replicas)`` per request and counts each replica's load."""

    name: ClassVar[str]

    def __init__(self, replicas: int) -> None:
        if replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {replicas}")
        self.replicas = replicas
        self.loads = [0] * replicas

    def route(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int:
        """The replica for ``req``; ``hbm[r]`` answers ``key in`` for replica ``r``'s HBM."""
        r = self._choose(req, hbm)
        self.loads[r] += 1
        return r

    def least_loaded(self, among: Sequence[int] | None = None) -> int:
        """The replica with the fewest requests so far (ties: the lowest index)."""
        loads = self.loads
        return min(range(self.replicas) if among is None else among, key=loads.__getitem__)

    @abstractmethod
    def _choose(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int: ...


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, replicas: int) -> None:
        super().__init__(replicas)
        self._next = 0

    def _choose(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int:
        r = self._next
        self._next = (r + 1) % self.replicas
        return r


class ConsistentHash(Router):
    name = "consistent_hash"

    def __init__(self, replicas: int) -> None:
        super().__init__(replicas)
        points = ((r, v) for r in range(replicas) for v in range(VNODES))
        ring = sorted((_hash64(f"replica-{r}-{v}".encode()), r) for r, v in points)
        self._points = [h for h, _ in ring]
        self._owners = [r for _, r in ring]

    def _choose(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int:
        i = bisect.bisect_left(self._points, _hash64(session_key(req)))
        return self._owners[i % len(self._owners)]


def held_prefix(keys: Sequence[Hashable], held: Container[Hashable]) -> int:
    """How many of ``keys``, from the first, ``held`` holds without a gap: a pool's prefix
    hit, which both cache-aware policies route by."""
    n = 0
    for k in keys:
        if k not in held:
            break
        n += 1
    return n


class CacheAware(Router):
    name = "cache_aware"

    def _choose(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int:
        best, tied = -1, [0]
        for r, held in enumerate(hbm):
            n = held_prefix(req.keys, held)
            if n > best:
                best, tied = n, [r]
            elif n == best:
                tied.append(r)
        if best <= CACHE_THRESHOLD * len(req.keys):
            return self.least_loaded()
        return tied[0] if len(tied) == 1 else self.least_loaded(tied)


class KvAware(Router):
    name = "kv_aware"

    def _choose(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int:
        best, pick = 0, -1
        for r, held in enumerate(hbm):
            n = held_prefix(req.keys, held)
            if n and n >= best:  # ``>=``: the last of equal maxima, as the router's
                best, pick = n, r
        return self.least_loaded() if pick < 0 else pick


class Sticky(Router):
    name = "sticky"

    def __init__(self, replicas: int) -> None:
        super().__init__(replicas)
        self._home: dict[bytes, int] = {}

    def _choose(self, req: Request, hbm: Sequence[Container[Hashable]]) -> int:
        key = session_key(req)
        r = self._home.get(key)
        if r is None:
            r = self._home[key] = self.least_loaded()
        return r


ROUTERS: dict[str, type[Router]] = {
    c.name: c for c in (RoundRobin, ConsistentHash, CacheAware, KvAware, Sticky)
}
ROUTINGS: tuple[str, ...] = tuple(ROUTERS)


def make_router(name: str, replicas: int) -> Router:
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise ConfigError(
            f"--routing: unknown routing {name!r}; known: {', '.join(ROUTINGS)}"
        ) from None
    return cls(replicas)


def parse_routings(text: str | None) -> tuple[str, ...]:
    """``a,b,…`` as known routing names, in the order given, each once; None = all."""
    if text is None:
        return ROUTINGS
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise ConfigError(f"--routing: no routing named in {text!r}")
    for n in names:
        if n not in ROUTERS:
            raise ConfigError(f"--routing: unknown routing {n!r}; known: {', '.join(ROUTINGS)}")
    return tuple(dict.fromkeys(names))
