"""SSD retention in trace time (DESIGN §6, §10): blocks idle longer than ``retention`` are
expired before the lookup of the request that finds them so."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Hashable, Sequence

from kvstore.errors import IntegrityError
from kvstore.eviction import EvictionPolicy


class Retention(ABC):
    """Tracks last-access times of one tier's blocks and removes the idle ones from its policy.

    Contract: ``expire(now)`` is called before each lookup with a non-decreasing ``now``;
    ``record(keys, evicted, now)`` after each commit with the chain just touched and the
    keys the policy evicted while inserting it.
    """

    @abstractmethod
    def expire(self, now_s: float) -> int:
        """Remove blocks idle for more than the retention; return how many."""

    @abstractmethod
    def record(self, keys: Sequence[Hashable], evicted: Sequence[Hashable], now_s: float) -> None:
        """Note that ``keys`` were touched at ``now_s`` and ``evicted`` left the tier."""

    def check_integrity(self) -> None:  # noqa: B027 - the null object has nothing to check
        """Raise ``IntegrityError`` if bookkeeping disagrees with the policy."""


class NoRetention(Retention):
    """Unbounded retention (or a tier without one): nothing ever expires."""

    def expire(self, now_s: float) -> int:
        return 0

    def record(self, keys: Sequence[Hashable], evicted: Sequence[Hashable], now_s: float) -> None:
        return None


class IdleExpiry(Retention):
    """Exact idle-time expiry.

    Why a queue of whole chains plus a ``key -> last time`` dict instead of a per-key ordered
    structure: recording a commit is then one C-level ``dict.update`` and one append, whatever
    the chain length; stale queue entries (keys touched again later) are skipped lazily when
    their chain reaches the front.
    """

    def __init__(
        self,
        policy: EvictionPolicy,
        retention_s: float,
        on_expire: Callable[[Hashable], None] | None = None,
    ) -> None:
        if not retention_s > 0 or math.isinf(retention_s):
            raise ValueError(f"retention must be a positive finite duration, got {retention_s}")
        self._policy = policy
        self._retention_s = retention_s
        self._last: dict[Hashable, float] = {}
        self._chains: deque[tuple[float, Sequence[Hashable]]] = deque()
        self._on_expire = on_expire
        self.expired_blocks = 0

    def expire(self, now_s: float) -> int:
        cutoff = now_s - self._retention_s
        chains, last, policy = self._chains, self._last, self._policy
        n = 0
        while chains and chains[0][0] < cutoff:
            t, keys = chains.popleft()
            for k in keys:
                if last.get(k) == t:
                    del last[k]
                    if policy.remove(k):
                        n += 1
                        if self._on_expire is not None:
                            self._on_expire(k)
        self.expired_blocks += n
        return n

    def record(self, keys: Sequence[Hashable], evicted: Sequence[Hashable], now_s: float) -> None:
        self._last.update(dict.fromkeys(keys, now_s))
        self._chains.append((now_s, keys))
        last, policy = self._last, self._policy
        for k in evicted:
            # A chain that repeats a key can evict it and insert it again in one commit.
            if k in policy:
                last[k] = now_s
            else:
                last.pop(k, None)

    def check_integrity(self) -> None:
        held = set(self._policy)
        if held != set(self._last):
            raise IntegrityError(
                f"retention: {len(held)} blocks held but {len(self._last)} with an access time"
            )
