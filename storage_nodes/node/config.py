"""Configuration of one storage node (``kvstore node``, DESIGN §9)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from kvstore.errors import InvalidArgument
from kvstore.rpcserver.limits import ServerLimits
from kvstore.rpcserver.startup import check_capacity, check_directory, check_hostport
from storage_nodes.ssd import SSDConfig


@dataclass(frozen=True, slots=True)
class NodeConfig:
    dir: Path
    capacity_bytes: int
    listen: str = "127.0.0.1:7431"
    retention_s: float = 72 * 3600.0
    slab_bytes: int | None = None  # None: the SSD engine's choice (an existing dir keeps its own)
    io_backend: str = "auto"
    metrics_listen: str | None = None
    auth_token_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    workers: int = 16
    shutdown_grace_s: float = 5.0
    limits: ServerLimits = field(default_factory=ServerLimits)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        check_hostport("--listen", self.listen)
        if self.metrics_listen is not None:
            check_hostport("--metrics-listen", self.metrics_listen)
        check_capacity("--capacity", self.capacity_bytes)
        check_directory("--dir", self.dir)
        if not (self.retention_s > 0 or self.retention_s == math.inf):
            raise InvalidArgument("--retention must be positive")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise InvalidArgument("--tls-cert and --tls-key go together")
        if self.workers < 1:
            raise InvalidArgument("--workers must be >= 1")
        self.ssd_config()  # the engine's own checks (sizes, slab), before anything is created

    def ssd_config(self) -> SSDConfig:
        return SSDConfig(
            dir=self.dir,
            capacity_bytes=self.capacity_bytes,
            retention_s=self.retention_s,  # inf: never expire (the engine handles it)
            slab_bytes=self.slab_bytes,  # type: ignore[arg-type]  # None: the engine chooses
            io_backend=self.io_backend,
        )

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")
