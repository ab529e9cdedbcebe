"""The eviction-policy contract shared by the DRAM tier and the hit-rate simulator.

A policy tracks *which* keys a fixed-capacity cache holds and in what order they leave;
it never owns data. The interface is deliberately lean — ``access(key) -> evicted`` —
so that the simulator can drive millions of accesses per second through the exact code
the DRAM tier uses, and the two cannot drift apart.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Iterator
from typing import ClassVar

from kvstore.errors import IntegrityError, InvalidArgument


class EvictionPolicy(ABC):
    """A set of at most ``capacity`` keys with a replacement rule.

    * ``access(key)`` admits ``key`` if absent (or refreshes it if present) and returns the
      keys evicted to stay within capacity — possibly ``key`` itself when capacity is 0.
    * ``touch(key)`` refreshes a present key and never admits.
    * Nothing else changes recency; ``in``/``len``/``peek_victim`` are side-effect free.
    """

    name: ClassVar[str]

    def __init__(self, capacity: float) -> None:
        self._capacity = _check_capacity(capacity)

    @property
    def capacity(self) -> float:
        return self._capacity

    @abstractmethod
    def access(self, key: Hashable) -> list[Hashable]:
        """Admit or refresh ``key``; return evicted keys (in eviction order)."""

    def access_many(self, keys: Iterable[Hashable]) -> list[Hashable]:
        """``access`` each key in order; all evictions, in order."""
        out: list[Hashable] = []
        for k in keys:
            ev = self.access(k)
            if ev:
                out.extend(ev)
        return out

    @abstractmethod
    def touch(self, key: Hashable) -> bool:
        """Refresh ``key`` if present; return whether it was."""

    @abstractmethod
    def remove(self, key: Hashable) -> bool:
        """Forget ``key`` without counting it as an eviction; return whether it was held."""

    @abstractmethod
    def peek_victim(self) -> Hashable | None:
        """The key the next eviction would take, or ``None`` when empty."""

    @abstractmethod
    def pop_victim(self) -> Hashable | None:
        """Evict and return the next victim, or ``None`` when empty."""

    def resize(self, capacity: float) -> list[Hashable]:
        """Change capacity; returns the keys evicted to fit."""
        self._capacity = _check_capacity(capacity)
        out: list[Hashable] = []
        while len(self) > self._capacity:
            victim = self.pop_victim()
            if victim is None:  # pragma: no cover - len() > 0 guarantees a victim
                break
            out.append(victim)
        return out

    @abstractmethod
    def __contains__(self, key: object) -> bool: ...

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Hashable]:
        """Keys from the next victim to the most protected."""

    def check_integrity(self) -> None:
        if len(self) > self._capacity:
            raise IntegrityError(f"{self.name}: {len(self)} keys over capacity {self._capacity}")
        seen = list(self)
        if len(seen) != len(set(seen)) or len(seen) != len(self):
            raise IntegrityError(f"{self.name}: iteration disagrees with len()")


def _check_capacity(capacity: float) -> float:
    if capacity != math.inf and (capacity < 0 or int(capacity) != capacity):
        raise InvalidArgument(f"capacity must be a non-negative integer or inf, got {capacity}")
    return capacity if capacity == math.inf else int(capacity)
