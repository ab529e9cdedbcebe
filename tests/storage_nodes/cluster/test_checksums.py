"""End-to-end checksums across the cluster (issue 14, item 3): a node sends the checksum
stored with each block, so bytes damaged in the node's memory after its engine checked
them fail at the cluster client; the client hands the stored checksums on."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from kvstore.block import payload_checksum
from kvstore.keys import Key, Namespace
from kvstore.rpcserver.auth import OpenAuth
from kvstore.rpcserver.metrics import RpcMetrics
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from storage_nodes.node.servicer import StorageNodeServicer
from storage_nodes.ssd import SSDConfig, SSDTier
from tests.conftest import payload_for, small_ns
from tests.storage_nodes.cluster.conftest import (
    InprocNodes,
    counter,
    make_chain,
    read_back,
    rows,
)
from tests.storage_nodes.cluster.test_tier import OpenCluster

NS = small_ns()


class BadMemoryTier(SSDTier):
    """The real engine, in a process whose memory damages a read buffer right after the
    engine checked it (a stray write, a bad DIMM): one byte of the 4th block."""

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        checksums: list[int] | None = None,
    ) -> int:
        n = super().get_into(ns, keys, dst, checksums=checksums)
        if n > 3:
            memoryview(dst).cast("B")[3 * ns.block_bytes + 5] ^= 0x20
        return n


@pytest.fixture
def bad_memory_node(tmp_path: Path) -> Iterator[str]:
    tier = BadMemoryTier(
        SSDConfig(dir=tmp_path / "bad", capacity_bytes=4 << 20, slab_bytes=512 << 10)
    )
    server = grpc.server(ThreadPoolExecutor(4))
    pb_grpc.add_StorageNodeServicer_to_server(
        StorageNodeServicer(tier, OpenAuth(), RpcMetrics()), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0).wait()
    tier.close()


def test_bytes_damaged_in_a_nodes_memory_fail_at_the_client(
    bad_memory_node: str, open_cluster: OpenCluster
) -> None:
    tier = open_cluster((bad_memory_node,), replicas=1, write_quorum=1)
    tier.register(NS)
    keys = make_chain(NS, 8, seed=1)
    assert tier.put(NS, keys, rows(NS, keys)).inserted == 8
    assert read_back(tier, NS, keys) == (3, True)
    assert counter(tier, "corrupt_blocks_total") == 1


def test_the_commit_checksum_travels_to_the_nodes_and_back(
    inproc_nodes: InprocNodes, open_cluster: OpenCluster
) -> None:
    tier = open_cluster(inproc_nodes(3), replicas=2, write_quorum=2)
    tier.register(NS)
    keys = make_chain(NS, 6, seed=2)
    sums = [payload_checksum(payload_for(NS, k)) for k in keys]
    assert tier.put(NS, keys, rows(NS, keys), checksums=sums).inserted == 6
    got: list[int] = []
    assert tier.get_into(NS, keys, bytearray(6 * NS.block_bytes), checksums=got) == 6
    assert got == sums
    # A row that no longer matches the checksum made at commit is refused by the nodes
    # (they check what arrives), never stored under it.
    bad = bytearray(rows(NS, keys))
    bad[10] ^= 1
    other = make_chain(NS, 6, seed=3)
    with pytest.raises(ValueError):
        tier.put(NS, other, bad, checksums=[payload_checksum(payload_for(NS, k)) for k in keys])
    assert tier.contains(NS, other) == 0
