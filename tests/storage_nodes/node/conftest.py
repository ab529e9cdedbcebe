"""In-process storage nodes (a real gRPC server over a real SSD engine) for servicer
tests; subprocess nodes for the command line are started by the tests themselves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from kvstore.keys import Key, Namespace, chain_keys
from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from storage_nodes.node import NodeConfig, NodeServer
from tests.conftest import payload_for

StartNode = Callable[..., NodeServer]


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[StartNode]:
    started: list[NodeServer] = []

    def start(**kw: Any) -> NodeServer:
        kw.setdefault("dir", tmp_path / f"node{len(started)}")
        kw.setdefault("capacity_bytes", 1 << 20)
        kw.setdefault("listen", "127.0.0.1:0")
        node = NodeServer(NodeConfig(**kw))
        node.start()
        started.append(node)
        return node

    yield start
    for n in started:
        n.stop()


@pytest.fixture
def node(start_node: StartNode) -> NodeServer:
    return start_node()


@pytest.fixture
def stub(node: NodeServer) -> Iterator[pb_grpc.StorageNodeStub]:
    with grpc.insecure_channel(f"127.0.0.1:{node.port}") as ch:
        yield pb_grpc.StorageNodeStub(ch)


def make_chain(ns: Namespace, n: int, seed: int = 0) -> list[Key]:
    rng = np.random.default_rng(seed)
    return chain_keys(ns, rng.integers(0, 50_000, n * ns.block_tokens))


def blocks(ns: Namespace, keys: list[Key]) -> list[bytes]:
    """The encoded blocks a cluster client sends for ``keys`` (deterministic payloads)."""
    from storage_nodes.cluster.node_client import encode_blocks

    return encode_blocks(ns, keys, [memoryview(payload_for(ns, k)) for k in keys])


def encoded(ns: Namespace, key: Key) -> bytes:
    from kvstore.block import encode_block

    return encode_block(ns.fingerprint, key, payload_for(ns, key))


def put_messages(
    ns: Namespace, keys: list[Key], *, present_ok: bool = True
) -> list[pb.NodePutRequest]:
    msgs = [
        pb.NodePutRequest(
            open=pb.NodePutOpen(ns=codec.ns_to_proto(ns), keys=keys, present_ok=present_ok)
        )
    ]
    for i, k in enumerate(keys):
        msgs.append(
            pb.NodePutRequest(
                chunk=pb.BlockChunk(block_index=i, offset=0, data=encoded(ns, k), last=True)
            )
        )
    return msgs


def contains(stub: pb_grpc.StorageNodeStub, ns: Namespace, keys: list[Key]) -> int:
    req = pb.NodeKeysRequest(ns=codec.ns_to_proto(ns), keys=keys)
    return int(stub.Contains(req, timeout=10).hit_blocks)
