"""The StorageNode service over a real SSD engine: round trips, per-key put outcomes,
malformed and truncated streams, misuse, health and metrics."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.node_client import NodeClient
from storage_nodes.node import NodeServer
from tests.conftest import payload_for, small_ns
from tests.storage_nodes.node.conftest import (
    StartNode,
    blocks,
    contains,
    encoded,
    make_chain,
    put_messages,
)

NS = small_ns()
SPEC = codec.ns_to_proto(NS)


def client(node: NodeServer) -> NodeClient:
    return NodeClient(
        f"127.0.0.1:{node.port}",
        ClusterConfig(nodes=(f"127.0.0.1:{node.port}",), replicas=1, write_quorum=1),
    )


def test_round_trip_with_per_key_outcomes(node: NodeServer) -> None:
    c = client(node)
    keys = make_chain(NS, 5, seed=1)
    assert c.put(NS, keys[:2], blocks(NS, keys[:2])) == bytes([1, 1])
    assert c.put(NS, keys, blocks(NS, keys)) == bytes([2, 2, 1, 1, 1])  # present ones only touched
    assert c.contains(NS, keys) == 5
    out = memoryview(bytearray(5 * NS.block_bytes))
    res = c.get(NS, keys, out, {i: i for i in range(5)})
    assert (res.copied, res.corrupt) == (5, 0)
    assert bytes(out) == b"".join(payload_for(NS, k) for k in keys)
    c.touch(NS, keys)
    st = c.stats()
    assert st.name == "ssd"
    assert next(s for s in st.size_classes if s.block_bytes == NS.block_bytes).used_blocks == 5
    assert c.delete(NS) == 5
    assert c.contains(NS, keys) == 0
    c.close()


def test_get_returns_the_node_prefix_only(node: NodeServer) -> None:
    c = client(node)
    keys = make_chain(NS, 4, seed=2)
    c.put(NS, [keys[0], keys[2]], blocks(NS, [keys[0], keys[2]]))
    out = memoryview(bytearray(4 * NS.block_bytes))
    assert c.get(NS, keys, out, {i: i for i in range(4)}).copied == 1
    c.close()


def test_malformed_puts_store_nothing(stub: pb_grpc.StorageNodeStub) -> None:
    keys = make_chain(NS, 2, seed=3)
    good = put_messages(NS, keys)
    bad_checksum = bytearray(encoded(NS, keys[1]))
    bad_checksum[-1] ^= 0xFF
    wrong_key = encoded(NS, keys[0])  # block 0's bytes announced as block 1
    cases = [
        good[1:],  # no open message
        [
            good[0],
            good[1],
            pb.NodePutRequest(
                chunk=pb.BlockChunk(block_index=1, data=bytes(bad_checksum), last=True)
            ),
        ],
        [
            good[0],
            good[1],
            pb.NodePutRequest(chunk=pb.BlockChunk(block_index=1, data=wrong_key, last=True)),
        ],
        [good[0], pb.NodePutRequest(chunk=pb.BlockChunk(block_index=7, data=b"x", last=True))],
        [good[0], good[0]],
    ]
    for msgs in cases:
        with pytest.raises(grpc.RpcError) as e:
            stub.Put(iter(msgs), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert contains(stub, NS, keys) == 0


def test_stream_cut_mid_block_stores_only_complete_blocks(stub: pb_grpc.StorageNodeStub) -> None:
    keys = make_chain(NS, 3, seed=4)
    msgs = put_messages(NS, keys)
    partial = pb.NodePutRequest(
        chunk=pb.BlockChunk(block_index=2, offset=0, data=encoded(NS, keys[2])[:300])
    )
    resp = stub.Put(iter([*msgs[:3], partial]), timeout=10)
    assert (resp.inserted, resp.incomplete) == (2, 1)
    assert resp.outcomes == bytes([1, 1, 0])
    assert contains(stub, NS, keys) == 2


def put_messages_read(node: NodeServer) -> float:
    """Messages the node has read from Put streams (its metrics)."""
    got = node.metrics.registry.get_sample_value(
        "kvstore_stream_messages_total", {"method": "Put"}
    )
    return 0.0 if got is None else got  # the label appears with the first message read


def test_cancelled_stream_stores_only_complete_blocks(
    node: NodeServer, stub: pb_grpc.StorageNodeStub
) -> None:
    keys = make_chain(NS, 2, seed=5)
    msgs = put_messages(NS, keys)
    sent = threading.Event()
    release = threading.Event()

    def gen() -> Iterator[pb.NodePutRequest]:
        yield msgs[0]
        yield msgs[1]
        yield pb.NodePutRequest(
            chunk=pb.BlockChunk(block_index=1, offset=0, data=encoded(NS, keys[1])[:100])
        )
        sent.set()
        release.wait(30)  # the client dies here, mid-block

    fut = stub.Put.future(gen(), timeout=30)
    assert sent.wait(10)
    # Cut the stream only once the node has read all three messages: cut earlier, it would
    # rightly keep nothing (block 0 not yet in), and the count below would be 0.
    deadline = time.monotonic() + 30
    while put_messages_read(node) < 3:
        assert time.monotonic() < deadline, "the node never read the three messages"
        time.sleep(0.01)
    fut.cancel()
    release.set()
    deadline = time.monotonic() + 10
    while contains(stub, NS, keys) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert contains(stub, NS, keys) == 1


def test_present_ok_false_refuses_without_side_effects(stub: pb_grpc.StorageNodeStub) -> None:
    keys = make_chain(NS, 3, seed=6)
    stub.Put(iter(put_messages(NS, keys[:1])), timeout=10)
    with pytest.raises(grpc.RpcError) as e:
        stub.Put(iter(put_messages(NS, keys, present_ok=False)), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert contains(stub, NS, keys[1:]) == 0


def test_bad_namespace_and_keys_are_misuse(node: NodeServer, stub: pb_grpc.StorageNodeStub) -> None:
    bad_fp = pb.NamespaceSpec()
    bad_fp.CopyFrom(SPEC)
    bad_fp.fingerprint = b"\x00" * 16
    for req in (
        pb.NodeKeysRequest(ns=bad_fp, keys=[b"\x00" * 16]),
        pb.NodeKeysRequest(ns=SPEC, keys=[b"short"]),
    ):
        with pytest.raises(grpc.RpcError) as e:
            stub.Contains(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    c = client(node)
    with pytest.raises(ValueError):
        c.contains(NS, [b"short"])
    c.close()


def test_health_and_metrics(start_node: StartNode) -> None:
    node = start_node(metrics_listen="127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{node.port}") as ch:
        h = health_pb2_grpc.HealthStub(ch)
        for service in ("", "kvstore.v1.StorageNode"):
            st = h.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            assert st == health_pb2.HealthCheckResponse.SERVING
        stub = pb_grpc.StorageNodeStub(ch)
        keys = make_chain(NS, 2, seed=7)
        stub.Put(iter(put_messages(NS, keys)), timeout=10)
    bound = node.metrics._server.server_port
    body = urllib.request.urlopen(f"http://127.0.0.1:{bound}/metrics", timeout=5).read().decode()
    assert 'kvstore_tier_used_bytes{tier="ssd"}' in body
    assert 'kvstore_size_class_used_blocks{block_bytes="2048",tier="ssd"} 2.0' in body
    assert "kvstore_rpc_seconds_count" in body


def test_a_put_is_acknowledged_only_once_its_data_is_durable(start_node: StartNode) -> None:
    """The sender counts a node's answer towards its write quorum: an inserted block
    whose data sync failed (the SSD syncs behind its puts) is reported not stored."""
    import errno

    node = start_node(io_backend="faulty", capacity_bytes=4 << 20)
    c = client(node)
    keys = make_chain(NS, 4, seed=7)
    assert c.put(NS, keys[:1], blocks(NS, keys[:1])) == bytes([1])  # synced: inserted
    node.tier.io_backend.sync_errno = errno.EIO  # type: ignore[attr-defined]
    assert c.put(NS, keys, blocks(NS, keys)) == bytes([2, 0, 0, 0])
    assert node.tier.stats().counters["io_errors_total"] == 1
    c.close()
