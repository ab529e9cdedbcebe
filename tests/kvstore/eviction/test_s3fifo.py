"""S3-FIFO in O(1) (issue 14, item 8): the same decisions as before, without copying the
queues on every peek.

``_Reference`` is the implementation this replaced, kept as a model: it peeks by running
the eviction on copies of both queues (O(n) per peek). Random streams of every operation
must get identical answers from both, step by step.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.eviction import S3FIFOPolicy


class _Reference:
    """The previous S3FIFOPolicy (peek = simulate an eviction on copies)."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.small: OrderedDict[Hashable, int] = OrderedDict()
        self.main: OrderedDict[Hashable, int] = OrderedDict()
        self.ghost: OrderedDict[Hashable, None] = OrderedDict()

    def target(self) -> float:
        return math.inf if self.capacity == math.inf else max(1, int(self.capacity * 0.1))

    def __len__(self) -> int:
        return len(self.small) + len(self.main)

    def keys(self) -> list[Hashable]:
        return [*self.small, *self.main]

    def touch(self, key: Hashable) -> bool:
        for q in (self.small, self.main):
            f = q.get(key)
            if f is not None:
                q[key] = min(f + 1, 3)
                return True
        return False

    def access(self, key: Hashable) -> list[Hashable]:
        if self.touch(key):
            return []
        if key in self.ghost:
            del self.ghost[key]
            self.main[key] = 0
        else:
            self.small[key] = 0
        out = []
        while len(self) > self.capacity:
            out.append(self.victim(mutate=True))
        return out

    def remove(self, key: Hashable) -> bool:
        return self.small.pop(key, None) is not None or self.main.pop(key, None) is not None

    def resize(self, capacity: float) -> list[Hashable]:
        self.capacity = capacity
        out = []
        while len(self) > capacity:
            out.append(self.victim(mutate=True))
        return out

    def victim(self, *, mutate: bool) -> Hashable | None:
        small, main = self.small, self.main
        if not mutate:
            small, main = OrderedDict(small), OrderedDict(main)
        while small or main:
            if small and (len(small) >= self.target() or not main):
                k, f = small.popitem(last=False)
                if f > 0:
                    main[k] = 0
                    continue
                if mutate:
                    self.ghost[k] = None
                    limit = self.capacity if self.capacity != math.inf else len(self)
                    while len(self.ghost) > max(limit, 1):
                        self.ghost.popitem(last=False)
                return k
            k, f = main.popitem(last=False)
            if f > 0:
                main[k] = f - 1
                continue
            return k
        return None


keys = st.integers(0, 24)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("access"), keys),
        st.tuples(st.just("access"), keys),  # weighted: most traffic is accesses
        st.tuples(st.just("touch"), keys),
        st.tuples(st.just("remove"), keys),
        st.tuples(st.just("peek"), st.just(0)),
        st.tuples(st.just("peek"), st.just(0)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("resize"), st.integers(0, 16)),
    ),
    max_size=400,
)


@settings(max_examples=300)
@given(cap=st.integers(0, 16), stream=ops)
def test_same_decisions_as_the_reference_on_random_streams(cap: int, stream) -> None:
    p, ref = S3FIFOPolicy(cap), _Reference(cap)
    for op, arg in stream:
        if op == "access":
            assert p.access(arg) == ref.access(arg)
        elif op == "touch":
            assert p.touch(arg) == ref.touch(arg)
        elif op == "remove":
            assert p.remove(arg) == ref.remove(arg)
        elif op == "peek":
            assert p.peek_victim() == ref.victim(mutate=False)
        elif op == "pop":
            assert p.pop_victim() == ref.victim(mutate=True)
        else:
            assert p.resize(arg) == ref.resize(arg)
        assert list(p) == ref.keys()
        p.check_integrity()


@given(stream=st.lists(st.tuples(st.sampled_from(["access", "touch", "peek"]), keys), max_size=300))
def test_same_decisions_with_unbounded_capacity(stream) -> None:
    p, ref = S3FIFOPolicy(math.inf), _Reference(math.inf)
    for op, k in stream:
        if op == "access":
            assert p.access(k) == ref.access(k)
        elif op == "touch":
            assert p.touch(k) == ref.touch(k)
        else:
            assert p.peek_victim() == ref.victim(mutate=False)


def test_dram_style_peek_then_pop_reads_each_key_a_bounded_number_of_times() -> None:
    """The tier's allocation loop peeks, then pops: per insert, a peek must not read the
    whole queue (the old one copied both queues: n reads per insert)."""

    class Counting(OrderedDict):  # counts every key an iteration (or a copy) hands out
        reads = 0

        def items(self):  # type: ignore[override]
            for kv in super().items():
                Counting.reads += 1
                yield kv

        def __iter__(self):
            for k in super().__iter__():
                Counting.reads += 1
                yield k

        def keys(self):  # type: ignore[override]
            return list(iter(self))

    n = 10_000
    p = S3FIFOPolicy(n)
    p._small, p._main = Counting(), Counting()
    for k in range(n):
        p.access(k)
    for k in range(0, n, 3):  # a third re-used: promotions and rotations happen
        p.touch(k)
    Counting.reads = 0
    inserts = 5_000
    for k in range(n, n + inserts):
        assert p.peek_victim() == p.pop_victim()
        p.access(k)
    assert Counting.reads < 4 * inserts
