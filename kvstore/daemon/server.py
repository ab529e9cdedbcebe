"""Assembles and runs the cache daemon: store, gRPC server, health, metrics, access log.

Shutdown (SIGTERM, SIGINT or ``stop()``): health goes NOT_SERVING, the server stops
accepting RPCs and lets running ones finish within the grace period, then the store
flushes its write-back to SSD and closes; the process exits 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from grpc_health.v1 import health_pb2

from kvstore.accesslog.writer import make_access_log
from kvstore.daemon.catalog import open_catalog
from kvstore.daemon.config import DaemonConfig
from kvstore.daemon.metrics import DaemonMetrics
from kvstore.daemon.servicer import KVStoreServicer
from kvstore.daemon.staging import StagingArea, StagingConfig
from kvstore.daemon.store_factory import open_store
from kvstore.errors import InvalidArgument
from kvstore.rpcserver.auth import Authenticator, OpenAuth, load_token_file
from kvstore.rpcserver.runner import Bound, grpc_server, run_until_signalled
from kvstore.rpcserver.startup import bind, probe_listen, serve_metrics, server_credentials
from kvstore.tier import KVStore
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
SERVICE_NAME = "kvstore.v1.KVStore"


class Daemon:
    def __init__(
        self,
        config: DaemonConfig,
        store: KVStore | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` (monotonic seconds) times the streams' idle deadline; tests inject
        one (``kvstore.testing.file_clock``)."""
        self.config = config
        self.auth: Authenticator = (
            load_token_file(config.auth_token_file) if config.auth_token_file else OpenAuth()
        )
        tls = server_credentials(config.tls_cert_file, config.tls_key_file)
        # Bind first: a busy port is reported before the store allocates its memory.
        self.server, self.health = grpc_server(config.workers, "kvstore-rpc")
        self.port = bind(self.server, config.listen, tls)
        if config.metrics_listen:
            probe_listen("--metrics-listen", config.metrics_listen)
        self.store = store if store is not None else open_store(config)
        self.metrics = DaemonMetrics()
        self.metrics.attach_store(self.store.stats)
        self.access_log = make_access_log(
            config.access_log_dir, rotate_s=config.access_log_rotate_s
        )
        lim = config.limits
        self.staging = (
            StagingArea(
                StagingConfig(
                    max_segment_bytes=lim.max_staging_segment_bytes,
                    max_total_bytes=lim.max_staging_total_bytes,
                )
            )
            if config.shm
            else None
        )
        self.servicer = KVStoreServicer(
            self.store,
            self.auth,
            self.access_log,
            self.metrics,
            self.staging,
            lim,
            open_catalog(config.ssd_dir),
            clock=clock,
        )
        pb_grpc.add_KVStoreServicer_to_server(self.servicer, self.server)
        self.metrics_port: int | None = None
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()

    def start(self) -> Bound:
        if self.config.metrics_listen:
            try:
                self.metrics_port = serve_metrics(self.metrics, self.config.metrics_listen)
            except InvalidArgument:
                self._release()
                raise
        self.server.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return Bound(self.port, self.metrics_port)

    def stop(self) -> None:
        """Stop accepting, finish running RPCs, flush write-back, release everything."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self.health.enter_graceful_shutdown()
            self.server.stop(self.config.shutdown_grace_s).wait()
            try:
                self.store.flush(timeout_s=None)
            except Exception:
                log.exception("flush at shutdown failed")
            self._release()
            self._stopped.set()

    def _release(self) -> None:
        self.store.close()
        self.servicer.close()
        self.access_log.close()
        if self.staging is not None:
            self.staging.close()
        self.metrics.close()

    def wait(self) -> None:
        self._stopped.wait()


def run_daemon(config: DaemonConfig, *, clock: Callable[[], float] = time.monotonic) -> int:
    """Run until SIGTERM/SIGINT; print the bound addresses as the first lines."""
    return run_until_signalled(
        Daemon(config, clock=clock),
        command="kvstore serve",
        host=config.host,
        listen=config.listen,
        loopback=config.loopback,
        authenticated=config.auth_token_file is not None,
        metrics_listen=config.metrics_listen,
        exposure="read and write the cache",
    )
