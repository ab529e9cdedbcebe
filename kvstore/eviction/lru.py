"""Least-recently-used: the policy DESIGN §6 and §10 are written against."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator

from kvstore.eviction.base import EvictionPolicy

_NONE: list[Hashable] = []


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self, capacity: float) -> None:
        super().__init__(capacity)
        # OrderedDict keeps the recency list in C; front = least recent.
        self._od: OrderedDict[Hashable, None] = OrderedDict()

    def access(self, key: Hashable) -> list[Hashable]:
        od = self._od
        if key in od:
            od.move_to_end(key)
            return _NONE
        od[key] = None
        if len(od) > self._capacity:
            return [od.popitem(last=False)[0]]
        return _NONE

    def access_many(self, keys: Iterable[Hashable]) -> list[Hashable]:
        # The simulator's hot loop: locals and no per-key method call.
        od = self._od
        cap = self._capacity
        move = od.move_to_end
        pop = od.popitem
        out: list[Hashable] = []
        for k in keys:
            if k in od:
                move(k)
            else:
                od[k] = None
                if len(od) > cap:
                    out.append(pop(last=False)[0])
        return out

    def touch(self, key: Hashable) -> bool:
        if key in self._od:
            self._od.move_to_end(key)
            return True
        return False

    def remove(self, key: Hashable) -> bool:
        return self._od.pop(key, 0) is None

    def peek_victim(self) -> Hashable | None:
        return next(iter(self._od), None)

    def pop_victim(self) -> Hashable | None:
        if not self._od:
            return None
        return self._od.popitem(last=False)[0]

    def __contains__(self, key: object) -> bool:
        return key in self._od

    def __len__(self) -> int:
        return len(self._od)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._od)
