"""S3-FIFO (Yang et al., SOSP '23): a small probationary FIFO, a main FIFO and a ghost
FIFO of recently evicted keys.

Why offer it: one-hit wonders (a prompt seen once) are common in agent traffic and
LRU lets each of them push a useful block out; S3-FIFO evicts them from the small queue
first. Frequency counters saturate at 3, as in the paper.

``peek_victim`` is O(1) amortised and side-effect free. An eviction first promotes the
small queue's re-used head to the main queue and rotates the main queue's re-used head
(decrementing its counters); a peek finds the key that process would end on by reading
the queues in place, without performing it, and remembers the answer until an operation
that could change it. The next pop performs the same steps, so each key a peek reads is
paid for by the pop (or by the touches that made it worth rotating) — no copy of the
queues, whatever their size.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Iterator

from kvstore.errors import IntegrityError
from kvstore.eviction.base import EvictionPolicy

_MAX_FREQ = 3
_SMALL_FRACTION = 0.1
#: Where the remembered victim was found, which decides what invalidates it:
_FROM_SMALL = "small"  # a never re-used head of the small queue
_FROM_MAIN = "main"  # the first never re-used key of the main queue
_PROMOTED = "promoted"  # the first key promoted from the small queue (main all re-used)
_ROTATED = "rotated"  # main all re-used, nothing promoted: the first least-used key
_STALE = "stale"


class S3FIFOPolicy(EvictionPolicy):
    name = "s3fifo"

    def __init__(self, capacity: float) -> None:
        super().__init__(capacity)
        self._small: OrderedDict[Hashable, int] = OrderedDict()  # key -> freq
        self._main: OrderedDict[Hashable, int] = OrderedDict()
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._victim: Hashable | None = None  # the remembered peek
        self._found: str = _STALE  # where it was found; _STALE: recompute

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
            # A new unused key at the main tail comes before any promotion.
            if self._found not in (_FROM_SMALL, _FROM_MAIN):
                self._found = _STALE
        else:
            self._small[key] = 0
            # A longer small queue may let the eviction scan further into it.
            if self._found != _FROM_SMALL:
                self._found = _STALE
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
                # Every key the scan passed before the victim is re-used already, so a
                # touch changes the answer only when it lands on the victim itself.
                if key == self._victim:
                    self._found = _STALE
                return True
        return False

    def remove(self, key: Hashable) -> bool:
        self._found = _STALE
        return self._small.pop(key, None) is not None or self._main.pop(key, None) is not None

    def resize(self, capacity: float) -> list[Hashable]:
        self._found = _STALE
        return super().resize(capacity)

    def _plan(self) -> tuple[Hashable | None, str]:
        """The key ``pop_victim`` would return now, and where it sits — read in place."""
        small, main = self._small, self._main
        target = self._small_target()
        was_empty = not main
        promoted = 0
        first: Hashable | None = None
        for k, f in small.items():
            # pop_victim serves the small queue while it is at or over its target (or
            # while nothing is in main); re-used keys leave it for main as it goes.
            if not (len(small) - promoted >= target or (was_empty and promoted == 0)):
                break
            if f == 0:
                return k, _FROM_SMALL
            if promoted == 0:
                first = k
            promoted += 1
        for k, f in main.items():
            if f == 0:
                return k, _FROM_MAIN
        if promoted:
            return first, _PROMOTED  # main rotates once, then reaches the promoted keys
        # Every key in main was re-used: whole rotations keep the order and take one from
        # each counter, so the first key with the smallest counter reaches 0 first.
        best, best_f = None, _MAX_FREQ + 1
        for k, f in main.items():
            if f < best_f:
                best, best_f = k, f
        return best, _ROTATED

    def _next_victim(self) -> Hashable | None:
        small, main = self._small, self._main
        while small or main:
            if small and (len(small) >= self._small_target() or not main):
                k, f = small.popitem(last=False)
                if f > 0:
                    main[k] = 0
                    continue
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
        if self._found == _STALE:
            self._victim, self._found = self._plan()
        return self._victim

    def pop_victim(self) -> Hashable | None:
        self._found = _STALE
        self._victim = None
        return self._next_victim()

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
        if self._found != _STALE and self._plan() != (self._victim, self._found):
            raise IntegrityError("s3fifo: remembered victim is stale")
