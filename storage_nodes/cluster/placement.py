"""Rendezvous (highest-random-weight) placement over the configured membership.

Every node gets a weight per key, ``xxh3_64(node ‖ key)``; a key's nodes are the
members in decreasing weight. Adding a node moves exactly the keys for which the new
node outranks one of their top ``R`` (about ``R/N`` of them) and removing one moves
only the keys it held; nothing depends on which nodes are alive, so a node that comes
back after a crash is the preferred holder of the same keys as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import xxhash

from kvstore.errors import IntegrityError
from storage_nodes.cluster.errors import ClusterConfigError


class Rendezvous:
    def __init__(self, members: Sequence[str]) -> None:
        if not members:
            raise ClusterConfigError("placement needs at least one member")
        if len(set(members)) != len(members):
            raise ClusterConfigError("placement members must be distinct")
        self.members = tuple(members)
        self._ids = [m.encode() + b"\x00" for m in self.members]

    def weights(self, key: bytes) -> list[int]:
        return [xxhash.xxh3_64_intdigest(node_id + key) for node_id in self._ids]

    def ranking(self, key: bytes) -> list[int]:
        """Member indices, preferred first."""
        w = self.weights(key)
        # Ties (astronomically rare) break by member order, so every client agrees.
        return sorted(range(len(w)), key=lambda i: (-w[i], i))

    def top(self, key: bytes, r: int) -> list[int]:
        return self.ranking(key)[:r]

    def check_integrity(self) -> None:
        probe = self.ranking(b"\x00" * 16)
        if sorted(probe) != list(range(len(self.members))):
            raise IntegrityError("placement ranking is not a permutation of the members")
        if probe != self.ranking(b"\x00" * 16):
            raise IntegrityError("placement ranking is not deterministic")


def balanced_capacity_blocks(node_capacity_blocks: list[int], replicas: int, z: float = 3.0) -> int:
    """Blocks the cluster holds before its fullest node must evict.

    Hashing spreads blocks binomially: with ``B`` blocks each of ``N`` nodes expects
    ``m = B·R/N`` of them, give or take ``sqrt(m·(1 − R/N))``. The reported capacity is
    the ``B`` at which the smallest node is full at ``z`` standard deviations above its
    mean — not the raw ``Σ capacity / R``, which no real placement reaches without
    evicting somewhere first.
    """
    n = len(node_capacity_blocks)
    if n == 0 or replicas < 1:
        return 0
    r = min(replicas, n)
    p = r / n
    c = min(node_capacity_blocks)
    if r == n:  # every node holds every block: no imbalance
        return c
    spread = z * math.sqrt(1.0 - p)
    m = ((-spread + math.sqrt(spread * spread + 4.0 * c)) / 2.0) ** 2  # m + spread·√m = c
    return max(0, min(int(m / p), sum(node_capacity_blocks) // r))
