"""The storage node daemon (``kvstore node``): the ``StorageNode`` gRPC service over
one SSD engine directory, with grpc health, auth, TLS and Prometheus metrics."""

from storage_nodes.node.config import NodeConfig
from storage_nodes.node.server import NodeServer, run_node

__all__ = ["NodeConfig", "NodeServer", "run_node"]
