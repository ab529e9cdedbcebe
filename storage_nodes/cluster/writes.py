"""Replicated writes: R replicas, W acknowledgements, fall-back counted (DESIGN §6).

A block goes to the first ``R`` of its healthy ranking. Every replica that failed or
did not store it (full disk, degraded engine) is replaced by the next node in the
ranking until the block has ``W`` acknowledgements or the ranking is exhausted; a
block kept with fewer than ``W`` is counted as a degraded write, one kept nowhere is
dropped. Each node gets one ``Put`` per round with its blocks in chain order, which
it applies last→first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.keys import Key, Namespace
from kvstore.tier import PutResult
from storage_nodes.cluster.errors import NodeUnavailable
from storage_nodes.cluster.fanout import Fanout
from storage_nodes.cluster.node_client import NodeClient

INSERTED, PRESENT = 1, 2


@dataclass(frozen=True, slots=True)
class Replication:
    result: PutResult
    degraded_writes: int  # blocks kept on fewer than W nodes (but at least one)
    extra_replica_writes: int  # copies sent beyond the first R targets
    refused_by: frozenset[int]  # nodes that answered but stored none of their blocks


def replicate(
    ns: Namespace,
    keys: Sequence[Key],
    blocks: Sequence[bytes],
    ranked: Sequence[list[int]],
    replicas: int,
    write_quorum: int,
    fanout: Fanout,
    nodes: Sequence[NodeClient],
) -> Replication:
    n = len(keys)
    acks = [0] * n
    inserted = [False] * n
    present = [False] * n
    nxt = [min(replicas, len(r)) for r in ranked]
    targets = {i: ranked[i][: nxt[i]] for i in range(n)}
    extra = 0
    refused: set[int] = set()
    first_round = True
    while targets:
        groups: dict[int, list[int]] = {}
        for i in sorted(targets):
            for node in targets[i]:
                groups.setdefault(node, []).append(i)
        calls = {
            node: (
                lambda node=node, idx=idx: nodes[node].put(
                    ns, [keys[i] for i in idx], [blocks[i] for i in idx]
                )
            )
            for node, idx in groups.items()
        }
        for node, got in fanout.run(calls).items():
            if isinstance(got, NodeUnavailable):
                continue
            if not any(got):
                refused.add(node)
            for i, outcome in zip(groups[node], got, strict=True):
                if outcome in (INSERTED, PRESENT):
                    acks[i] += 1
                    inserted[i] |= outcome == INSERTED
                    present[i] |= outcome == PRESENT
        if not first_round:
            extra += sum(len(t) for t in targets.values())
        first_round = False
        targets = {}
        for i in range(n):
            need = write_quorum - acks[i]
            if need > 0 and nxt[i] < len(ranked[i]):
                targets[i] = ranked[i][nxt[i] : nxt[i] + need]
                nxt[i] += len(targets[i])
    res = PutResult(
        inserted=sum(ins and not pre for ins, pre in zip(inserted, present, strict=True)),
        present=sum(present),
        dropped=sum(a == 0 for a in acks),
    )
    degraded = sum(0 < a < write_quorum for a in acks)
    return Replication(res, degraded, extra, frozenset(refused))
