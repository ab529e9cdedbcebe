"""Finding (and fetching) a chain's longest present prefix across replicas.

Each key has its candidates: its top-R healthy nodes in rendezvous order. A round sends
every unresolved key to its current candidate, one call per node with that node's keys
in chain order — ``Contains`` to look, ``Get`` to fetch, which then costs no extra round
trip. A node answers with the prefix of them it holds (fetched and verified, for
``Get``), which settles those keys as present and the next one as absent *there*; an
absent or failed key moves to its next candidate. The first unresolved key is always the
head of its node's list, so every round settles it one way or the other: the loop ends in
at most ``len(keys) × R`` rounds and, when every replica is healthy and complete, in one.

Fetching without looking first has one cost: behind a hole (a block no replica holds),
blocks a node still has are fetched and touched although the caller gets only the prefix
before the hole. Holes are rare (uneven eviction across nodes) and a look-then-fetch
would cost every read a second round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvstore.keys import Key
from storage_nodes.cluster.errors import NodeUnavailable
from storage_nodes.cluster.fanout import Fanout

#: ``probe(node, chain_indices) -> n``: the node holds (and, for a fetch, delivered)
#: the first ``n`` of those keys and not the one after them.
Probe = Callable[[int, list[int]], int]


class ChainRead:
    """Presence state of one chain read; ``pos`` is the prefix settled so far."""

    def __init__(self, keys: Sequence[Key], cands: list[list[int]]) -> None:
        n = len(keys)
        self.keys = keys
        self.cands = cands
        self.replica = [0] * n  # index into cands[i] of the replica asked next / holding it
        self.present = [False] * n
        self.missed: list[list[int]] = [[] for _ in range(n)]  # nodes that answered "absent"
        self.pos = 0

    def holder(self, i: int) -> int:
        return self.cands[i][self.replica[i]]

    def resolve(self, fanout: Fanout, probe: Probe) -> int:
        n = len(self.keys)
        while self.pos < n and self.replica[self.pos] < len(self.cands[self.pos]):
            groups: dict[int, list[int]] = {}
            for i in range(self.pos, n):
                if self.present[i]:
                    continue
                if self.replica[i] >= len(self.cands[i]):
                    break  # no replica left for i: the prefix cannot pass it
                groups.setdefault(self.holder(i), []).append(i)
            calls = {
                node: (lambda node=node, idx=idx: probe(node, idx)) for node, idx in groups.items()
            }
            for node, res in fanout.run(calls).items():
                idx = groups[node]
                if isinstance(res, NodeUnavailable):
                    for i in idx:
                        self.replica[i] += 1
                    continue
                for i in idx[:res]:
                    self.present[i] = True
                if res < len(idx):
                    i = idx[res]
                    self.missed[i].append(node)
                    self.replica[i] += 1
            while self.pos < n and self.present[self.pos]:
                self.pos += 1
        return self.pos
