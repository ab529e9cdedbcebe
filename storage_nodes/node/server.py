"""Assembles and runs a storage node: SSD engine, gRPC server, health, metrics.

Shutdown (SIGTERM, SIGINT or ``stop()``): health goes NOT_SERVING, running RPCs
finish within the grace period, then the SSD engine flushes its batched touches and
closes (releasing ``DIR/LOCK``); the process exits 0. A ``kill -9`` loses at most
the batched touches: every acknowledged put was synced before it was acknowledged.
"""

from __future__ import annotations

import logging
import threading

from grpc_health.v1 import health_pb2

from kvstore.errors import InvalidArgument
from kvstore.rpcserver.metrics import RpcMetrics
from kvstore.rpcserver.runner import Bound, grpc_server, run_until_signalled
from kvstore.rpcserver.startup import bind, probe_listen, serve_metrics, server_credentials
from kvstore.tier import StoreStats, Tier
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from storage_nodes.node.auth import make_node_auth
from storage_nodes.node.config import NodeConfig
from storage_nodes.node.servicer import StorageNodeServicer

log = logging.getLogger(__name__)
SERVICE_NAME = "kvstore.v1.StorageNode"


class NodeServer:
    def __init__(self, config: NodeConfig, tier: Tier | None = None) -> None:
        self.config = config
        self.auth = make_node_auth(config.auth_token_file)
        tls = server_credentials(config.tls_cert_file, config.tls_key_file)
        # Bind first: a busy port is reported before the SSD engine opens its directory.
        self.server, self.health = grpc_server(config.workers, "kvstore-node-rpc")
        self.port = bind(self.server, config.listen, tls)
        if config.metrics_listen:
            probe_listen("--metrics-listen", config.metrics_listen)
        if tier is None:
            from storage_nodes.ssd import SSDTier

            tier = SSDTier(config.ssd_config())
        self.tier = tier
        self.metrics = RpcMetrics()
        self.metrics.attach_store(lambda: StoreStats(tiers=(self.tier.stats(),)))
        self.servicer = StorageNodeServicer(tier, self.auth, self.metrics, config.limits)
        pb_grpc.add_StorageNodeServicer_to_server(self.servicer, self.server)
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()

    def start(self) -> Bound:
        metrics_port = None
        if self.config.metrics_listen:
            try:
                metrics_port = serve_metrics(self.metrics, self.config.metrics_listen)
            except InvalidArgument:
                self.tier.close()
                raise
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return Bound(self.port, metrics_port)

    def stop(self) -> None:
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self.health.enter_graceful_shutdown()
            self.server.stop(self.config.shutdown_grace_s).wait()
            self.tier.close()
            self.metrics.close()
            self._stopped.set()

    def wait(self) -> None:
        self._stopped.wait()


def run_node(config: NodeConfig) -> int:
    """Run until SIGTERM/SIGINT; print the bound addresses as the first lines."""
    return run_until_signalled(
        NodeServer(config),
        command="kvstore node",
        host=config.host,
        listen=config.listen,
        loopback=config.loopback,
        authenticated=config.auth_token_file is not None,
        metrics_listen=config.metrics_listen,
        exposure="read and write its blocks",
    )
