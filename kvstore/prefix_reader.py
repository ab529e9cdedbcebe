"""How the tier manager reads a chain from its ordered tiers (DESIGN §5–§6): the hit
prefix as runs, each served by the fastest tier holding its first block, copied in
order, and what came from below promoted into the top tier.

A lower tier that raises is a miss here (the manager counts it); the top tier's errors
are the caller's. A promotion keeps the checksums the lower tier stored, never a
checksum of the copy. It stands apart from ``kvstore.manager`` so the read path can be
read on its own: the manager keeps the commit path, the write-back, the counters and
the lock, and this holds no state beyond the tiers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvstore.keys import Key, Namespace
from kvstore.tier import Tier


@dataclass(frozen=True, slots=True)
class Run:
    """Blocks ``start`` to ``start + length`` of a chain, served by ``tiers[tier]``."""

    tier: int
    start: int
    length: int


@dataclass(frozen=True, slots=True)
class Fetched:
    """What a read copied: blocks served per tier name, and how many of them were
    promoted into the top tier."""

    served: Counter[str]
    promoted: int


class PrefixReader:
    """Reads over ``tiers`` (``tiers[0]`` the top); ``on_tier_error(i)`` is called, inside
    the ``except`` block, when lower tier ``i`` raised and was treated as a miss."""

    def __init__(self, tiers: Sequence[Tier], on_tier_error: Callable[[int], None]) -> None:
        self.tiers = list(tiers)
        self._top = self.tiers[0]
        self._on_tier_error = on_tier_error

    def _contains(self, i: int, ns: Namespace, keys: Sequence[Key]) -> int:
        if i == 0:
            return self._top.contains(ns, keys)
        try:
            return self.tiers[i].contains(ns, keys)
        except Exception:
            self._on_tier_error(i)
            return 0

    def runs(self, ns: Namespace, keys: Sequence[Key]) -> list[Run]:
        """The longest prefix present in the union of tiers, as runs served by one tier.

        Each run goes to the fastest tier holding its first block; because every tier
        evicts a chain tail-first, a faster tier's holdings are a prefix and a run never
        skips a faster copy in practice.
        """
        runs: list[Run] = []
        pos, n = 0, len(keys)
        while pos < n:
            for i in range(len(self.tiers)):
                got = self._contains(i, ns, keys[pos:])
                if got:
                    runs.append(Run(i, pos, got))
                    pos += got
                    break
            else:
                break
        return runs

    def fetch(
        self, ns: Namespace, keys: Sequence[Key], out: memoryview, sums: list[int]
    ) -> Fetched:
        """Copy the hit prefix into ``out`` (its stored checksums into ``sums``); promote it
        into the top tier if any of it came from below, and touch it there last→first."""
        bb = ns.block_bytes
        served: Counter[str] = Counter()
        hit = 0
        for run in self.runs(ns, keys):
            a, b = run.start, run.start + run.length
            tier = self.tiers[run.tier]
            got_sums: list[int] = []
            try:
                got = tier.get_into(ns, keys[a:b], out[a * bb : b * bb], checksums=got_sums)
            except Exception:
                if run.tier == 0:
                    raise
                self._on_tier_error(run.tier)
                got = 0
            if len(got_sums) != got:  # a tier that cannot say: the prefix ends here
                got = 0
            served[tier.name] += got
            sums.extend(got_sums)
            hit += got
            if got < run.length:  # evicted (or corrupt) since lookup: the prefix ends here
                break
        promoted = 0
        if hit and served[self._top.name] < hit:
            # One put over the whole prefix, last→first: promoted blocks are inserted and
            # top-tier ones touched in chain order, so a prefix larger than the top tier
            # leaves its head there, exactly as the hit-rate model does (DESIGN §10). The
            # lower tier's stored checksums go with them: never a checksum of our copy.
            self._top.put(ns, keys[:hit], out[: hit * bb], checksums=sums[:hit])
            promoted = hit - served[self._top.name]
        elif hit:
            self._top.touch(ns, keys[:hit])
        return Fetched(served, promoted)
