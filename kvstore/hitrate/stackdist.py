"""LRU stack distances for a single-pass capacity sweep.

LRU is a stack algorithm: a cache of capacity C holds exactly the C most recently used keys,
so a key is present in every LRU of capacity >= its *depth* (1 + the number of distinct keys
used since it). With idle expiry added, expired keys are always the least recent ones, so a
key is present iff ``depth <= C`` and it has not expired — still one pass for all C.

Depths come from a Fenwick tree over access positions. The keys themselves live in an
``LRUPolicy`` of the deepest capacity swept (the same code as the DRAM tier): anything it
evicts is deeper than every capacity of interest and is forgotten, which bounds memory.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from kvstore.errors import IntegrityError
from kvstore.eviction import LRUPolicy
from kvstore.hitrate.retention import IdleExpiry, NoRetention, Retention

_MIN_SLOTS = 1024


class Fenwick:
    """Counts over positions ``1..size``: point add, prefix sum, O(log size)."""

    __slots__ = ("_tree", "size")

    def __init__(self, size: int, ones: int = 0) -> None:
        """``ones`` leading positions start at 1 (built in O(size))."""
        self.size = size
        tree = [0] * (size + 1)
        for i in range(1, ones + 1):
            tree[i] += 1
            j = i + (i & -i)
            if j <= size:
                tree[j] += tree[i]
        for i in range(ones + 1, size + 1):
            j = i + (i & -i)
            if j <= size:
                tree[j] += tree[i]
        self._tree = tree

    def add(self, i: int, delta: int) -> None:
        tree, size = self._tree, self.size
        while i <= size:
            tree[i] += delta
            i += i & -i

    def prefix(self, i: int) -> int:
        tree = self._tree
        s = 0
        while i > 0:
            s += tree[i]
            i &= i - 1
        return s


class LruStack:
    """Depth of every key of an LRU stack, up to ``max_depth`` (may be ``math.inf``)."""

    def __init__(self, max_depth: float, retention_s: float = math.inf) -> None:
        self._policy = LRUPolicy(max_depth)
        self._pos: dict[Hashable, int] = {}
        self._clock = 0
        self._tree = Fenwick(_MIN_SLOTS)
        self._retention: Retention = (
            NoRetention()
            if math.isinf(retention_s)
            else IdleExpiry(self._policy, retention_s, on_expire=self._forget)
        )

    def _forget(self, key: Hashable) -> None:
        self._tree.add(self._pos.pop(key), -1)

    def expire(self, now_s: float) -> None:
        self._retention.expire(now_s)

    def depth(self, key: Hashable) -> float:
        """1 for the most recent key; ``math.inf`` for one never seen, evicted or expired."""
        p = self._pos.get(key)
        if p is None:
            return math.inf
        return len(self._pos) - self._tree.prefix(p) + 1

    def commit(self, keys: Sequence[Hashable], now_s: float) -> None:
        """Access ``keys`` last→first, as a tier's commit does."""
        if self._clock + len(keys) > self._tree.size:
            self._compact(len(keys))
        pos, tree = self._pos, self._tree
        clock = self._clock
        for k in reversed(keys):
            old = pos.get(k)
            if old is not None:
                tree.add(old, -1)
            clock += 1
            pos[k] = clock
            tree.add(clock, 1)
        self._clock = clock
        policy = self._policy
        evicted = policy.access_many(keys[::-1])
        for k in evicted:
            if k not in policy and k in pos:
                tree.add(pos.pop(k), -1)
        self._retention.record(keys, evicted, now_s)

    def _compact(self, incoming: int) -> None:
        """Renumber live keys 1..n in recency order (the policy iterates least recent first)."""
        order = list(self._policy)
        n = len(order)
        self._pos = {k: i for i, k in enumerate(order, 1)}
        self._clock = n
        self._tree = Fenwick(max(_MIN_SLOTS, 2 * (n + incoming)), ones=n)

    def check_integrity(self) -> None:
        self._policy.check_integrity()
        if set(self._pos) != set(self._policy):
            raise IntegrityError("stack: positions disagree with the policy's keys")
        if self._tree.prefix(self._tree.size) != len(self._pos):
            raise IntegrityError("stack: Fenwick total disagrees with the live key count")
        self._retention.check_integrity()
