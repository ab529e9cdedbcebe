"""Configuration of the cache daemon (``kvstore serve``, DESIGN §9)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvstore.errors import InvalidArgument
from kvstore.rpcserver.limits import ServerLimits
from kvstore.rpcserver.startup import check_capacity, check_directory, check_hostport


@dataclass(frozen=True, slots=True)
class ClusterLink:
    """How the daemon reaches its storage nodes (``--nodes``): ``replicas`` (R, default
    min(2, nodes)) and ``write_quorum`` (W, default R); TLS to the nodes (``tls_ca_file``
    implies it) and the token it presents (``token_file``, else
    ``$KVSTORE_NODE_AUTH_TOKEN``)."""

    replicas: int | None = None
    write_quorum: int | None = None
    tls: bool = False
    tls_ca_file: str | None = None
    token_file: str | None = None

    def resolved(self, n_nodes: int) -> tuple[int, int]:
        """(R, W) for ``n_nodes`` configured nodes."""
        r = min(2, n_nodes) if self.replicas is None else self.replicas
        return r, r if self.write_quorum is None else self.write_quorum


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    listen: str = "127.0.0.1:7420"
    dram_bytes: int = 8 << 30
    ssd_dir: str | None = None
    ssd_capacity_bytes: int | None = None
    nodes: tuple[str, ...] = ()
    shared_fs_dir: str | None = None
    shared_fs_capacity_bytes: int | None = None
    shared_fs_id: str | None = None
    retention_s: float = 72 * 3600.0
    max_dirty_bytes: int | None = None
    metrics_listen: str | None = None
    access_log_dir: str | None = None
    access_log_rotate_s: float = 60.0
    auth_token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    workers: int = 32
    shutdown_grace_s: float = 10.0
    shm: bool = True
    limits: ServerLimits = field(default_factory=ServerLimits)
    cluster: ClusterLink = field(default_factory=ClusterLink)

    def __post_init__(self) -> None:
        check_hostport("--listen", self.listen)
        if not self.nodes and self.cluster != ClusterLink():
            raise InvalidArgument(
                "--replicas, --write-quorum and --node-* configure --nodes; give --nodes"
            )
        if self.metrics_listen is not None:
            check_hostport("--metrics-listen", self.metrics_listen)
        check_capacity("--dram", self.dram_bytes)
        if self.ssd_capacity_bytes is not None:
            check_capacity("--ssd-capacity", self.ssd_capacity_bytes)
        if self.shared_fs_capacity_bytes is not None:
            check_capacity("--shared-fs-capacity", self.shared_fs_capacity_bytes)
        check_directory("--ssd-dir", self.ssd_dir)
        check_directory("--shared-fs", self.shared_fs_dir)
        check_directory("--access-log", self.access_log_dir)
        if self.ssd_dir and self.nodes:
            raise InvalidArgument("--ssd-dir and --nodes are exclusive: one tier below DRAM")
        if self.ssd_dir and not self.ssd_capacity_bytes:
            raise InvalidArgument("--ssd-dir needs --ssd-capacity")
        if self.ssd_capacity_bytes is not None and not self.ssd_dir:
            raise InvalidArgument("--ssd-capacity needs --ssd-dir")
        if self.shared_fs_dir and (self.ssd_dir or self.nodes):
            raise InvalidArgument("--shared-fs excludes --ssd-dir and --nodes: one tier below DRAM")
        if bool(self.shared_fs_dir) != bool(self.shared_fs_capacity_bytes):
            raise InvalidArgument("--shared-fs and --shared-fs-capacity go together")
        if self.shared_fs_id is not None and not self.shared_fs_dir:
            raise InvalidArgument("--shared-fs-id needs --shared-fs")
        if not (self.retention_s > 0 or self.retention_s == math.inf):
            raise InvalidArgument("--retention must be positive")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise InvalidArgument("--tls-cert and --tls-key go together")
        if not 0 < self.access_log_rotate_s <= 60:
            raise InvalidArgument("access-log rotation must be within (0, 60] seconds")
        if self.workers < 1:
            raise InvalidArgument("--workers must be >= 1")

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")
