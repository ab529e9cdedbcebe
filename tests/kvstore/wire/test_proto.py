"""The generated stubs import and carry every RPC of DESIGN §7."""

from __future__ import annotations

import importlib


def test_stubs_import_and_list_every_rpc() -> None:
    pb = importlib.import_module("kvstore.wire.proto.kvstore_pb2")
    importlib.import_module("kvstore.wire.proto.kvstore_pb2_grpc")
    importlib.import_module("grpc_health.v1.health_pb2_grpc")
    kv = {m.name for m in pb.DESCRIPTOR.services_by_name["KVStore"].methods}
    assert {
        "RegisterNamespace",
        "DeleteNamespace",
        "Lookup",
        "Get",
        "Commit",
        "Prefetch",
        "Flush",
        "Stats",
    } <= kv
    node = {m.name for m in pb.DESCRIPTOR.services_by_name["StorageNode"].methods}
    assert {"Put", "Get", "Contains", "Touch", "Delete", "Stats"} <= node
    methods = pb.DESCRIPTOR.services_by_name["KVStore"].methods_by_name
    assert methods["Get"].server_streaming and methods["Commit"].client_streaming
    node_methods = pb.DESCRIPTOR.services_by_name["StorageNode"].methods_by_name
    assert node_methods["Get"].server_streaming and node_methods["Put"].client_streaming
    chunk = {f.name for f in pb.BlockChunk.DESCRIPTOR.fields}
    assert chunk == {"block_index", "offset", "data", "last"}
