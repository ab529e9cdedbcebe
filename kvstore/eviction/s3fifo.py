"""S3-FIFO (Yang et al., SOSP '23): a small probationary FIFO, a main FIFO and a ghost
FIFO of recently evicted keys.

Why offer it: one-hit wonders (a prompt seen once) are common in agent traffic and
LRU lets each of them push a useful block out; S3-FIFO evicts them from the small queue
first. Frequency counters saturate at 3, as in the paper.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator

from kvstore.errors import IntegrityError
from kvstore.eviction.base import EvictionPolicy

_MAX_FREQ = 3
_SMALL_FRACTION = 0.1


class S3FIFOPolicy(EvictionPolicy):
    name = "s3fifo"

    def __init__(self, capacity: float) -> None:
        super().__init__(capacity)
        self._small: OrderedDict[Hashable, int] = OrderedDict()  # key -> freq
        self._main: OrderedDict[Hashable, int] = OrderedDict()
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()

    def _small_target(self) -> float:
        if self._capacity == math.inf:
            return math.inf
        return max(1, int(self._capacity * _SMALL_FRACTION))

    def access(self, key: Hashable) -> list[Hashable]:
        if self.touch(key):
            return []
        if key in self._ghost:
            del self._ghost[key]
            self._main[key] = 0
        else:
            self._small[key] = 0
        out: list[Hashable] = []
        while len(self) > self._capacity:
            victim = self.pop_victim()
            if victim is None:  # pragma: no cover
                break
            out.append(victim)
        return out

    def touch(self, key: Hashable) -> bool:
        for q in (self._small, self._main):
            f = q.get(key)
            if f is not None:
                q[key] = min(f + 1, _MAX_FREQ)
                return True
        return False

    def remove(self, key: Hashable) -> bool:
        return self._small.pop(key, None) is not None or self._main.pop(key, None) is not None

    def _next_victim(self, *, mutate: bool) -> Hashable | None:
        small, main = self._small, self._main
        # Simulate on copies when peeking: promotions reorder queues.
        if not mutate:
            small, main = OrderedDict(small), OrderedDict(main)
        while small or main:
            if small and (len(small) >= self._small_target() or not main):
                k, f = small.popitem(last=False)
                if f > 0:
                    main[k] = 0
                    continue
                if mutate:
                    self._remember_ghost(k)
                return k
            k, f = main.popitem(last=False)
            if f > 0:
                main[k] = f - 1
                continue
            return k
        return None

    def _remember_ghost(self, key: Hashable) -> None:
        self._ghost[key] = None
        limit = self._capacity if self._capacity != math.inf else len(self)
        while len(self._ghost) > max(limit, 1):
            self._ghost.popitem(last=False)

    def peek_victim(self) -> Hashable | None:
        return self._next_victim(mutate=False)

    def pop_victim(self) -> Hashable | None:
        return self._next_victim(mutate=True)

    def __contains__(self, key: object) -> bool:
        return key in self._small or key in self._main

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def __iter__(self) -> Iterator[Hashable]:
        yield from self._small
        yield from self._main

    def check_integrity(self) -> None:
        super().check_integrity()
        if set(self._small) & set(self._main):
            raise IntegrityError("s3fifo: a key is in both the small and the main queue")
        if any(not 0 <= f <= _MAX_FREQ for f in (*self._small.values(), *self._main.values())):
            raise IntegrityError("s3fifo: frequency counter out of range")
