"""The cluster client against real nodes: fall-through, read repair, replica touches,
ejection and re-admission, degraded writes, bad blocks, membership growth."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from kvstore.rpcserver.auth import OpenAuth
from kvstore.rpcserver.metrics import RpcMetrics
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from storage_nodes.cluster import ClusterTier
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.node_client import NodeClient
from storage_nodes.node.servicer import StorageNodeServicer
from storage_nodes.ssd import SSDConfig, SSDTier
from tests.conftest import small_ns
from tests.storage_nodes.cluster.conftest import InprocNodes, counter, make_chain, read_back, rows

NS = small_ns()
OpenCluster = Callable[..., ClusterTier]


def wait_for(pred: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def node_client(target: str) -> NodeClient:
    return NodeClient(target, ClusterConfig(nodes=(target,), replicas=1, write_quorum=1))


def test_fall_through_and_read_repair(inproc_nodes: InprocNodes, open_cluster: OpenCluster) -> None:
    nodes = inproc_nodes(3)
    tier = open_cluster(nodes)
    tier.register(NS)
    keys = make_chain(NS, 40, seed=1)
    assert tier.put(NS, keys, rows(NS, keys)).inserted == 40
    lost = node_client(nodes[0].target)
    assert lost.delete(NS) > 0  # node 0 loses every block it held
    primaries = [k for k in keys if tier.placement.top(k, 2)[0] == 0]
    assert primaries, "some keys prefer node 0"
    assert read_back(tier, NS, keys) == (40, True)
    assert counter(tier, "cluster_read_fallthroughs") == len(primaries)
    # Read repair writes the blocks back to the replica that lacked them.
    assert wait_for(lambda: counter(tier, "cluster_read_repairs") == len(primaries))
    assert all(lost.contains(NS, [k]) == 1 for k in primaries)
    lost.close()
    tier.check_integrity()


def test_touches_reach_every_replica(inproc_nodes: InprocNodes, open_cluster: OpenCluster) -> None:
    tier = open_cluster(inproc_nodes(3), touch_flush_s=3600)
    tier.register(NS)
    keys = make_chain(NS, 10, seed=2)
    tier.put(NS, keys, rows(NS, keys))
    assert read_back(tier, NS, keys) == (10, True)
    tier.touch(NS, keys)
    tier.put(NS, keys[:1], rows(NS, keys[:1]))  # a data op flushes queued touches first
    st = tier.stats().counters
    # The read owed the non-holding replica one touch per block; the explicit touch
    # reached both replicas of every block.
    assert st["cluster_touch_keys"] == 10 + 2 * 10
    assert st["cluster_touch_failures"] == 0


def test_node_down_is_ejected_then_readmitted(
    inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    nodes = inproc_nodes(3)
    tier = open_cluster(nodes, eject_after_failures=1, readmit_after_successes=2)
    tier.register(NS)
    before = make_chain(NS, 30, seed=3)
    tier.put(NS, before, rows(NS, before))
    nodes[1].stop()
    assert read_back(tier, NS, before) == (30, True)  # every block has a second replica
    assert wait_for(lambda: not tier.health.healthy(1))
    during = make_chain(NS, 30, seed=4)
    res = tier.put(NS, during, rows(NS, during))
    assert (res.inserted, res.dropped) == (30, 0)
    assert counter(tier, "cluster_degraded_writes") == 0  # two healthy nodes: still R=2
    nodes[1].start()  # same port, same directory
    assert wait_for(lambda: tier.health.healthy(1))
    assert read_back(tier, NS, before) == (30, True)
    assert read_back(tier, NS, during) == (30, True)
    st = tier.stats().counters
    assert st["cluster_ejections"] >= 1 and st["cluster_readmissions"] >= 1
    # The restarted node serves what it kept: placement follows membership, not liveness.
    back = node_client(nodes[1].target)
    kept = [k for k in before if 1 in tier.placement.top(k, 2)]
    assert all(back.contains(NS, [k]) == 1 for k in kept)
    back.close()
    tier.check_integrity()


def test_writes_fall_back_to_fewer_replicas_and_count_it(
    inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    nodes = inproc_nodes(3)
    tier = open_cluster(nodes, eject_after_failures=1)
    tier.register(NS)
    nodes[0].stop()
    nodes[2].stop()
    keys = make_chain(NS, 12, seed=5)
    res = tier.put(NS, keys, rows(NS, keys))
    assert (res.inserted, res.dropped) == (12, 0)
    assert counter(tier, "cluster_degraded_writes") == 12
    assert read_back(tier, NS, keys) == (12, True)
    nodes[1].stop()  # nothing left: misses and drops, never errors
    assert tier.contains(NS, keys) == 0
    assert read_back(tier, NS, keys) == (0, True)
    assert tier.put(NS, keys, rows(NS, keys)).dropped == 12
    # Each node failed a call (or a probe) after it stopped, and one failure ejects: all
    # three are out, and stats asks no ejected node, so none is "unreachable".
    assert tier.health.snapshot() == (False, False, False)
    st = tier.stats()
    assert st.info["healthy_nodes"] == "0"
    assert st.info["ejected"] == st.info["nodes"]
    assert st.info["unreachable"] == ""
    tier.touch(NS, keys)
    assert tier.delete_namespace(NS) == 0


class LyingServicer(StorageNodeServicer):
    """A node that flips one payload byte of every block it serves."""

    def Get(
        self, req: pb.NodeKeysRequest, ctx: grpc.ServicerContext
    ) -> Iterator[pb.NodeGetResponse]:
        for msg in super().Get(req, ctx):
            if msg.WhichOneof("part") == "chunk" and msg.chunk.last:
                data = bytearray(msg.chunk.data)
                data[-1] ^= 0x01
                msg.chunk.data = bytes(data)
            yield msg


@pytest.fixture
def liar(tmp_path: Path) -> Iterator[str]:
    tier = SSDTier(SSDConfig(dir=tmp_path / "liar", capacity_bytes=4 << 20, slab_bytes=512 << 10))
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_StorageNodeServicer_to_server(
        LyingServicer(tier, OpenAuth(), RpcMetrics()), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0).wait()
    tier.close()


def test_a_bad_block_is_a_miss_never_data(
    liar: str, inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    keys = make_chain(NS, 20, seed=6)
    alone = open_cluster((liar,), replicas=1, write_quorum=1)
    alone.register(NS)
    assert alone.put(NS, keys, rows(NS, keys)).inserted == 20
    assert alone.contains(NS, keys) == 20  # the index says yes...
    assert read_back(alone, NS, keys) == (0, True)  # ...but no corrupt byte is handed out
    assert alone.stats().counters["corrupt_blocks_total"] >= 1
    # With replicas, a corrupt copy falls through to a good one.
    good = inproc_nodes(2)
    tier = open_cluster((liar, good[0].target, good[1].target), replicas=3, write_quorum=3)
    tier.register(NS)
    tier.put(NS, keys, rows(NS, keys))
    assert read_back(tier, NS, keys) == (20, True)
    assert counter(tier, "cluster_corrupt_blocks") >= 1


def test_adding_a_node_keeps_every_block_readable(
    inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    nodes = inproc_nodes(3)
    small = open_cluster(nodes)
    small.register(NS)
    keys = make_chain(NS, 120, seed=7)
    small.put(NS, keys, rows(NS, keys))
    nodes += inproc_nodes(1)
    grown = open_cluster(nodes)
    grown.register(NS)
    assert read_back(grown, NS, keys) == (120, True)
    # Only keys that now rank the new node first had to fall through (and get repaired).
    first = sum(grown.placement.top(k, 1)[0] == 3 for k in keys)
    assert counter(grown, "cluster_read_fallthroughs") == first
    assert 0.1 < first / len(keys) < 0.4  # ~1/4 of the keys, the new node's share
    assert wait_for(lambda: counter(grown, "cluster_read_repairs") == first)


def test_stats_count_blocks_not_copies(
    inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    tier = open_cluster(inproc_nodes(3))
    tier.register(NS)
    keys = make_chain(NS, 7, seed=8)
    tier.put(NS, keys, rows(NS, keys))
    st = tier.stats()
    cls = next(c for c in st.size_classes if c.block_bytes == NS.block_bytes)
    assert cls.used_blocks == 7
    assert st.counters["node_blocks"] == 14  # two copies of each
    assert 0 < cls.capacity_blocks <= int(st.info["raw_capacity_blocks"].split(":")[1])
    assert tier.delete_namespace(NS) == 7
    tier.close()
    tier.close()


def test_blocks_larger_than_one_chunk(inproc_nodes: InprocNodes, open_cluster: OpenCluster) -> None:
    big = small_ns(model_id="big", head_dim=8192 + 8)  # 2 MiB + 2 KiB: three 1 MiB chunks
    assert big.block_bytes > 2 * (1 << 20)
    tier = open_cluster(inproc_nodes(3, capacity_bytes=48 << 20))
    tier.register(big)
    keys = make_chain(big, 3, seed=9)
    assert tier.put(big, keys, rows(big, keys)).inserted == 3
    assert read_back(tier, big, keys) == (3, True)


def test_a_namespace_too_big_for_the_nodes_is_misuse(
    inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    huge = small_ns(model_id="huge", head_dim=8192)  # 2 MiB blocks, nodes have 512 KiB slabs
    tier = open_cluster(inproc_nodes(2))
    with pytest.raises(ValueError, match="slab"):
        tier.register(huge)


def test_a_delete_missed_by_a_down_node_is_replayed_before_it_returns(
    inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    nodes = inproc_nodes(3)
    tier = open_cluster(nodes, eject_after_failures=1)
    tier.register(NS)
    keys = make_chain(NS, 20, seed=10)
    tier.put(NS, keys, rows(NS, keys))
    nodes[2].stop()
    tier.delete_namespace(NS)
    assert tier.contains(NS, keys[:1]) == 0
    nodes[2].start()
    assert wait_for(lambda: tier.health.healthy(2))
    direct = node_client(nodes[2].target)
    assert all(direct.contains(NS, [k]) == 0 for k in keys)  # nothing deleted comes back
    direct.close()
    assert tier.contains(NS, keys) == 0
    st = tier.stats().counters
    assert st["cluster_deletes_missed_nodes"] == 1 and st["cluster_deletes_replayed"] == 1
