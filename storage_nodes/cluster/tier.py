"""``ClusterTier``: the SSD tier as a cluster of storage nodes (DESIGN §5–§7).

Placement is rendezvous hashing over the *configured* membership; the top ``R``
healthy nodes in a key's ranking hold it. Writes go to those replicas and need ``W``
acknowledgements: a replica that is down or drops the block (full disk) is replaced
by the next healthy node in the ranking, and a write that still gets fewer than ``W``
(but at least one) is kept and counted (``degraded_writes``). Reads ask the first
candidate and fall through; a block that had to be found on a later replica is
written back to the earlier ones that lacked it (read repair). Every read verifies
fingerprint, key and checksum (``NodeClient``): a bad block is a miss. Touches —
explicit, and the ones a read owes the replicas it did not read from — reach every
replica in batches, so retention never silently turns R=2 into R=1.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from kvstore.buffers import rows_view
from kvstore.call_gate import CallGate
from kvstore.errors import IntegrityError, InvalidArgument, UnknownNamespace
from kvstore.keys import Key, Namespace, check_keys
from kvstore.tier import PutResult, Tier, TierStats
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.errors import NodeUnavailable
from storage_nodes.cluster.fanout import Fanout
from storage_nodes.cluster.health import HealthTracker, Prober
from storage_nodes.cluster.node_client import NodeClient, encode_blocks
from storage_nodes.cluster.placement import Rendezvous
from storage_nodes.cluster.reads import ChainRead, Probe
from storage_nodes.cluster.stats import aggregate
from storage_nodes.cluster.touches import TouchBatcher
from storage_nodes.cluster.writes import replicate

_COUNTERS = (
    "puts",
    "gets",
    "hits",
    "misses",
    "inserted",
    "present",
    "dropped",
    "degraded_writes",
    "extra_replica_writes",
    "read_repairs",
    "read_fallthroughs",
    "corrupt_blocks",
    "deletes_missed_nodes",
    "deletes_replayed",
    "write_backoffs",
)


class ClusterTier(Tier):
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.name = config.name
        self.placement = Rendezvous(config.nodes)
        self.health = HealthTracker(
            config.nodes, config.eject_after_failures, config.readmit_after_successes
        )
        self._nodes = [NodeClient(a, config) for a in config.nodes]
        self._fanout = Fanout(self.health, workers=max(8, 4 * len(self._nodes)))
        self._touches = TouchBatcher(
            len(self._nodes), self._send_touch, config.touch_flush_s, config.touch_batch_max_keys
        )
        self._namespaces: dict[bytes, Namespace] = {}
        self._counts: Counter[str] = Counter({k: 0 for k in _COUNTERS})
        self._counts_lock = threading.Lock()
        self._gate = CallGate("cluster tier is closed")
        # Deletes a node missed (it was down): replayed before it is re-admitted, so a
        # node that comes back never serves a namespace deleted meanwhile.
        self._pending_deletes: list[dict[bytes, Namespace]] = [{} for _ in self._nodes]
        self._pending_lock = threading.Lock()
        self._no_writes_until = [0.0] * len(self._nodes)
        self._prober = Prober(self.health, self._probe, config.probe_interval_s)

    # -- plumbing ---------------------------------------------------------------------
    def _add(self, **counts: int) -> None:
        with self._counts_lock:
            self._counts.update(counts)

    def _block_bytes(self, ns: Namespace) -> int:
        if self._namespaces.get(ns.fingerprint) != ns:
            raise UnknownNamespace(
                f"namespace {ns.model_id!r} is not registered with the cluster tier"
            )
        return ns.block_bytes

    @staticmethod
    def _check_keys(keys: Sequence[Key]) -> list[Key]:
        return check_keys(keys)

    def _candidates(
        self, key: Key, healthy: tuple[bool, ...], limit: int | None = None
    ) -> list[int]:
        r = self.config.replicas if limit is None else limit
        return [i for i in self.placement.ranking(key) if healthy[i]][:r]

    def _send_touch(self, node: int, ns: Namespace, keys: list[Key]) -> bool:
        if not self.health.healthy(node):
            return False
        res = self._fanout.one(node, lambda: self._nodes[node].touch(ns, keys))
        return not isinstance(res, NodeUnavailable)

    def _contains_probe(self, ns: Namespace, keys: Sequence[Key]) -> Probe:
        def probe(node: int, idx: list[int]) -> int:
            return self._nodes[node].contains(ns, [keys[i] for i in idx])

        return probe

    def _fetch_probe(
        self, ns: Namespace, keys: Sequence[Key], out: memoryview, sums: dict[int, int]
    ) -> Probe:
        """Fetch straight into the caller's rows: block ``j`` of the node's answer is
        chain index ``idx[j]``. Only the verified prefix counts; its stored checksums go
        into ``sums`` by chain index."""

        def probe(node: int, idx: list[int]) -> int:
            res = self._nodes[node].get(ns, [keys[i] for i in idx], out, dict(enumerate(idx)))
            if res.corrupt:
                self._add(corrupt_blocks=res.corrupt)
            for i, c in zip(idx, res.checksums, strict=False):
                sums[i] = c
            return res.copied

        return probe

    def namespaces(self) -> tuple[Namespace, ...]:
        """The namespaces registered through this client."""
        return tuple(self._namespaces.values())

    # -- Tier API ---------------------------------------------------------------------
    def register(self, ns: Namespace) -> None:
        with self._gate.call():
            # A node registers a namespace on first use; an empty Contains is that use,
            # so its size class shows in stats now and a namespace no node can hold is
            # refused here (misuse). A node down now registers it on first use later.
            healthy = self.health.snapshot()
            self._fanout.run(
                {
                    i: partial(self._nodes[i].contains, ns, [])
                    for i in range(len(self._nodes))
                    if healthy[i]
                }
            )
            self._namespaces[ns.fingerprint] = ns

    def contains(self, ns: Namespace, keys: Sequence[Key]) -> int:
        with self._gate.call():
            self._block_bytes(ns)
            keys = self._check_keys(keys)
            healthy = self.health.snapshot()
            read = ChainRead(keys, [self._candidates(k, healthy) for k in keys])
            return read.resolve(self._fanout, self._contains_probe(ns, keys))

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        checksums: list[int] | None = None,
    ) -> int:
        with self._gate.call():
            bb = self._block_bytes(ns)
            out = rows_view(dst, len(keys), bb, writable=True)
            keys = self._check_keys(keys)
            healthy = self.health.snapshot()
            read = ChainRead(keys, [self._candidates(k, healthy) for k in keys])
            sums: dict[int, int] = {}
            h = read.resolve(self._fanout, self._fetch_probe(ns, keys, out, sums))
            self._after_read(ns, keys, out, read, h, sums)
            if checksums is not None:
                checksums.extend(sums[i] for i in range(h))
            self._add(gets=1, hits=h, misses=len(keys) - h)
            return h

    def _after_read(
        self,
        ns: Namespace,
        keys: list[Key],
        out: memoryview,
        read: ChainRead,
        h: int,
        sums: dict[int, int],
    ) -> None:
        """Touch the replicas the read did not go to; repair the ones that lacked a block."""
        bb = ns.block_bytes
        touch: dict[int, list[Key]] = {}
        repair: dict[int, list[int]] = {}
        fell = 0
        for i in range(h):
            holder = read.holder(i)
            fell += read.replica[i] > 0
            for node in read.cands[i]:
                if node != holder and node not in read.missed[i]:
                    touch.setdefault(node, []).append(keys[i])
            if self.config.read_repair:
                now = time.monotonic()
                for node in read.missed[i]:
                    if now >= self._no_writes_until[node]:
                        repair.setdefault(node, []).append(i)
        for node, tkeys in touch.items():
            self._touches.add(node, ns, tkeys)
        for node, idx in repair.items():
            rkeys = [keys[i] for i in idx]
            # Encoded now: ``out`` is the caller's buffer, free to change once we return.
            blocks = encode_blocks(
                ns, rkeys, [out[i * bb : (i + 1) * bb] for i in idx], [sums[i] for i in idx]
            )

            def put(
                node: int = node, rkeys: list[Key] = rkeys, blocks: list[bytes] = blocks
            ) -> None:
                got = self._nodes[node].put(ns, rkeys, blocks)
                self._add(read_repairs=sum(o == 1 for o in got))

            self._fanout.submit(node, put)
        if fell:
            self._add(read_fallthroughs=fell)

    def put(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        src: Any,
        *,
        present_ok: bool = True,
        checksums: Sequence[int] | None = None,
    ) -> PutResult:
        with self._gate.call():
            bb = self._block_bytes(ns)
            data = rows_view(src, len(keys), bb)
            keys = self._check_keys(keys)
            if len(set(keys)) != len(keys):
                raise InvalidArgument("put: duplicate keys in one call")
            if checksums is not None and len(checksums) != len(keys):
                raise InvalidArgument(f"put: {len(checksums)} checksums for {len(keys)} keys")
            healthy = self.health.snapshot()
            if not present_ok and keys:
                for k in keys:
                    read = ChainRead([k], [self._candidates(k, healthy)])
                    if read.resolve(self._fanout, self._contains_probe(ns, [k])):
                        raise InvalidArgument("put: key already present and present_ok=False")
            # Queued touches go out first: this put may make the nodes evict, and their
            # choice must see every touch that happened before it.
            self._touches.flush_all()
            blocks = encode_blocks(
                ns, keys, [data[i * bb : (i + 1) * bb] for i in range(len(keys))], checksums
            )
            # Nodes that just refused every block (full disk, read-only engine) get no
            # writes for a while; they still serve reads.
            now = time.monotonic()
            writable = tuple(
                ok and now >= until
                for ok, until in zip(healthy, self._no_writes_until, strict=True)
            )
            ranked = [self._candidates(k, writable, limit=len(self._nodes)) for k in keys]
            rep = replicate(
                ns,
                keys,
                blocks,
                ranked,
                self.config.replicas,
                self.config.write_quorum,
                self._fanout,
                self._nodes,
            )
            for node in rep.refused_by:
                self._no_writes_until[node] = time.monotonic() + self.config.write_backoff_s
            res = rep.result
            self._add(
                puts=1,
                inserted=res.inserted,
                present=res.present,
                dropped=res.dropped,
                degraded_writes=rep.degraded_writes,
                extra_replica_writes=rep.extra_replica_writes,
                write_backoffs=len(rep.refused_by),
            )
            return res

    def touch(self, ns: Namespace, keys: Sequence[Key]) -> None:
        with self._gate.call():
            self._block_bytes(ns)
            keys = self._check_keys(keys)
            healthy = self.health.snapshot()
            per_node: dict[int, list[Key]] = {}
            for k in keys:
                for node in self._candidates(k, healthy):
                    per_node.setdefault(node, []).append(k)
            for node, nkeys in per_node.items():
                self._touches.add(node, ns, nkeys)

    def delete_namespace(self, ns: Namespace) -> int:
        with self._gate.call():
            self._block_bytes(ns)
            healthy = self.health.snapshot()
            calls: dict[int, Callable[[], int]] = {
                i: partial(self._nodes[i].delete, ns) for i in range(len(self._nodes)) if healthy[i]
            }
            results = self._fanout.run(calls)
            total = 0
            for i in range(len(self._nodes)):
                r = results.get(i)
                if r is None or isinstance(r, NodeUnavailable):
                    with self._pending_lock:
                        self._pending_deletes[i][ns.fingerprint] = ns
                    self._add(deletes_missed_nodes=1)
                else:
                    total += r
            # Each block lives on R nodes: report blocks, not copies.
            return math.ceil(total / self.config.replicas)

    def _probe(self, i: int) -> bool | None:
        """Healthy, and every delete it missed replayed (before it takes traffic again);
        None: no verdict (a node not reached yet, maybe starting: ``NodeClient.probe``)."""
        ok = self._nodes[i].probe()
        if not ok:
            return ok
        with self._pending_lock:
            pending = list(self._pending_deletes[i].values())
        for ns in pending:
            try:
                self._nodes[i].delete(ns)
            except NodeUnavailable:
                return False
            with self._pending_lock:
                self._pending_deletes[i].pop(ns.fingerprint, None)
            self._add(deletes_replayed=1)
        return True

    def stats(self) -> TierStats:
        with self._gate.call():
            return self._aggregate_stats()

    def _node_stats(self) -> dict[int, TierStats | NodeUnavailable]:
        healthy = self.health.snapshot()
        return self._fanout.run(
            {i: self._nodes[i].stats for i in range(len(self._nodes)) if healthy[i]}
        )

    def _aggregate_stats(self) -> TierStats:
        with self._counts_lock:
            mine = dict(self._counts)
        mine.update(self.health.counters)
        mine.update(self._touches.counters)
        return aggregate(
            self.config,
            self._node_stats(),
            self.health.snapshot(),
            {ns.block_bytes for ns in self._namespaces.values()},
            mine,
        )

    def check_integrity(self) -> None:
        with self._gate.call():
            self.placement.check_integrity()
            self.health.check_integrity()
            self._touches.check_integrity()
            with self._counts_lock:
                negative = [k for k, v in self._counts.items() if v < 0]
            if negative:
                raise IntegrityError(f"negative cluster counters: {negative}")
            for fp, ns in self._namespaces.items():
                if ns.fingerprint != fp:
                    raise IntegrityError(
                        f"namespace {ns.model_id!r} registered under another fingerprint"
                    )
            for i, st in self._node_stats().items():
                if isinstance(st, NodeUnavailable):
                    continue
                for c in st.size_classes:
                    if c.used_blocks > c.capacity_blocks:
                        raise IntegrityError(
                            f"node {self.config.nodes[i]}: class {c.block_bytes} holds "
                            f"{c.used_blocks} blocks over its capacity {c.capacity_blocks}"
                        )

    def close(self) -> None:
        if not self._gate.shut():
            return
        self._prober.stop()
        self._touches.close()
        self._fanout.close()
        for n in self._nodes:
            n.close()
