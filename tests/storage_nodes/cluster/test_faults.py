"""Fault tests with 3 real node processes on loopback (R=2, W=2).

``kill -9`` of a node in the middle of a verified put/get load must cost the caller
nothing: no exception, every read the right bytes or a miss, every acknowledged
block still readable; restarted, the node serves its surviving blocks again. A node
whose disk fills up degrades to read-only without taking the cluster down.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvstore.keys import Key
from storage_nodes.cluster import ClusterTier
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.node_client import NodeClient
from storage_nodes.testing.local_cluster import LocalCluster
from tests.conftest import small_ns
from tests.storage_nodes.cluster.conftest import make_chain, read_back, rows

NS = small_ns()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path, 3, "32MiB") as c:
        yield c


def wait_for(pred: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


class Load:
    """Writers put fresh chains; readers re-read acknowledged ones and check bytes."""

    def __init__(self, tier: ClusterTier, writers: int = 2, readers: int = 2) -> None:
        self.tier = tier
        self.written: list[tuple[float, list[Key]]] = []  # (acknowledged at, chain)
        self.errors: list[str] = []
        self.wrong: list[str] = []
        self.reads = self.misses = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write, args=(s,)) for s in range(writers)]
        self._threads += [threading.Thread(target=self._read, args=(s,)) for s in range(readers)]
        for t in self._threads:
            t.start()

    def _write(self, seed: int) -> None:
        i = 0
        while not self._stop.is_set():
            keys = make_chain(NS, 8, seed=seed * 1_000_000 + i)
            i += 1
            try:
                res = self.tier.put(NS, keys, rows(NS, keys))
            except Exception as e:  # the caller must never see one
                self.errors.append(repr(e))
                continue
            if res.dropped == 0:
                self.written.append((time.monotonic(), keys))
            time.sleep(0.005)

    def _read(self, seed: int) -> None:
        rnd = random.Random(seed)
        while not self._stop.is_set():
            if not self.written:
                time.sleep(0.01)
                continue
            _, keys = rnd.choice(self.written)
            try:
                n, ok = read_back(self.tier, NS, keys)
                hits = self.tier.contains(NS, keys)
            except Exception as e:
                self.errors.append(repr(e))
                continue
            self.reads += 1
            self.misses += n < len(keys)
            if not ok or not 0 <= hits <= len(keys):
                self.wrong.append(keys[0].hex())

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def test_kill_9_during_verified_load_then_restart(cluster: LocalCluster) -> None:
    tier = ClusterTier(
        ClusterConfig(nodes=cluster.targets, probe_interval_s=0.1, eject_after_failures=1)
    )
    tier.register(NS)
    victim = cluster.nodes[1]
    load = Load(tier)
    try:
        assert wait_for(lambda: len(load.written) >= 20)
        killed_at, reads_at_kill = time.monotonic(), load.reads
        victim.kill()  # SIGKILL: no shutdown path runs
        assert wait_for(lambda: not tier.health.healthy(1))
        count = len(load.written)
        assert wait_for(lambda: len(load.written) >= count + 20)
    finally:
        load.stop()
    assert load.errors == [], load.errors[:3]
    assert load.wrong == []
    assert load.reads > reads_at_kill  # reads went on through the failure
    # With R=2 every acknowledged block is still readable from its surviving replica.
    chains = [keys for _, keys in load.written]
    assert all(read_back(tier, NS, keys) == (len(keys), True) for keys in chains)

    victim.restart()  # same port, same directory
    assert wait_for(lambda: tier.health.healthy(1))
    # It serves the blocks it acknowledged before the kill (they were synced first).
    direct = NodeClient(
        victim.target, ClusterConfig(nodes=(victim.target,), replicas=1, write_quorum=1)
    )
    before = [
        k
        for t, keys in load.written
        if t < killed_at
        for k in keys
        if 1 in tier.placement.top(k, 2)
    ]
    assert before
    assert sum(direct.contains(NS, [k]) for k in before) == len(before)
    direct.close()
    assert all(read_back(tier, NS, keys) == (len(keys), True) for keys in chains)
    assert tier.stats().counters["cluster_degraded_writes"] == 0
    tier.check_integrity()
    tier.close()


def test_full_disk_degrades_one_node_not_the_cluster(cluster: LocalCluster) -> None:
    tier = ClusterTier(ClusterConfig(nodes=cluster.targets, probe_interval_s=0.1))
    tier.register(NS)
    early = make_chain(NS, 30, seed=1)
    assert tier.put(NS, early, rows(NS, early)).inserted == 30
    # The disk of node 0 is full from now on: every write past 4 KiB into any file
    # fails with EFBIG, as a full file system fails with ENOSPC.
    full = cluster.nodes[0]
    resource.prlimit(full.pid, resource.RLIMIT_FSIZE, (4096, 4096))
    chains = [make_chain(NS, 8, seed=100 + i) for i in range(20)]
    for keys in chains:
        res = tier.put(NS, keys, rows(NS, keys))
        assert (res.inserted, res.dropped) == (8, 0)
    st = tier.stats().counters
    assert st["node_degraded"] == 1  # node 0 went read-only...
    assert st["cluster_extra_replica_writes"] > 0  # ...its share went to the next node
    assert st["cluster_write_backoffs"] >= 1  # and it was left alone for writes after that:
    assert st["cluster_extra_replica_writes"] <= 2 * 8  # at most two puts went to it
    assert st["cluster_degraded_writes"] == 0  # still two copies of everything
    assert tier.health.healthy(0)  # and it still serves reads
    for keys in [early, *chains]:
        assert read_back(tier, NS, keys) == (len(keys), True)
    tier.close()


def test_a_hung_node_costs_a_timeout_not_an_error(cluster: LocalCluster) -> None:
    tier = ClusterTier(
        ClusterConfig(
            nodes=cluster.targets, rpc_timeout_s=1.0, probe_timeout_s=0.5, probe_interval_s=0.1
        )
    )
    tier.register(NS)
    chains = [make_chain(NS, 8, seed=200 + i) for i in range(6)]
    for keys in chains:
        tier.put(NS, keys, rows(NS, keys))
    hung = cluster.nodes[2]
    os.kill(hung.pid, signal.SIGSTOP)  # alive, connected, silent
    try:
        for keys in chains:
            assert read_back(tier, NS, keys) == (8, True)
        assert wait_for(lambda: not tier.health.healthy(2))
        more = make_chain(NS, 8, seed=300)
        assert tier.put(NS, more, rows(NS, more)).dropped == 0
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    assert wait_for(lambda: tier.health.healthy(2))
    assert all(read_back(tier, NS, keys) == (8, True) for keys in [*chains, more])
    tier.close()
