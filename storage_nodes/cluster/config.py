"""Configuration of the cluster client (``kvstore serve --nodes``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from kvstore.errors import InvalidArgument
from kvstore.wire.channel import token_from_file
from storage_nodes.cluster.errors import ClusterConfigError

#: Environment variable holding the token the cluster client presents to nodes.
NODE_TOKEN_ENV = "KVSTORE_NODE_AUTH_TOKEN"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """``nodes`` is the configured membership (``host:port``, order irrelevant):
    placement ranks it, never the set of nodes currently alive, so a node that comes
    back serves what it kept. ``replicas`` (R) nodes hold each block; a write wants
    ``write_quorum`` (W) acknowledgements and falls back to fewer, counted, when
    replicas are down. A node is ejected after ``eject_after_failures`` consecutive
    failed calls or probes and re-admitted after ``readmit_after_successes``
    consecutive good probes. A node that answers a put but stores none of it (full disk)
    gets no writes for ``write_backoff_s``; it keeps serving reads."""

    nodes: tuple[str, ...]
    replicas: int = 2
    write_quorum: int = 2
    rpc_timeout_s: float = 5.0
    probe_interval_s: float = 0.5
    probe_timeout_s: float = 1.0
    eject_after_failures: int = 2
    readmit_after_successes: int = 2
    touch_flush_s: float = 0.5
    touch_batch_max_keys: int = 16384
    read_repair: bool = True
    write_backoff_s: float = 5.0
    auth_token: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None
    name: str = "ssd"

    def __post_init__(self) -> None:
        nodes = parse_nodes(self.nodes)
        object.__setattr__(self, "nodes", nodes)
        if not nodes:
            raise ClusterConfigError("a cluster needs at least one node")
        if self.replicas < 1:
            raise ClusterConfigError(f"replicas must be >= 1, got {self.replicas}")
        if self.replicas > len(nodes):
            n = len(nodes)
            raise ClusterConfigError(
                f"{n} storage node{'s' if n > 1 else ''} cannot hold {self.replicas} replicas "
                f"of a block: list at least {self.replicas} nodes"
            )
        if not 1 <= self.write_quorum <= self.replicas:
            raise ClusterConfigError(
                f"write_quorum must be in [1, replicas={self.replicas}], got {self.write_quorum}"
            )
        for name in (
            "rpc_timeout_s",
            "probe_interval_s",
            "probe_timeout_s",
            "touch_flush_s",
            "write_backoff_s",
        ):
            if not getattr(self, name) > 0:
                raise ClusterConfigError(f"{name} must be > 0")
        for name in ("eject_after_failures", "readmit_after_successes", "touch_batch_max_keys"):
            if getattr(self, name) < 1:
                raise ClusterConfigError(f"{name} must be >= 1")


def parse_nodes(value: str | Sequence[str]) -> tuple[str, ...]:
    """``"h:p,h:p"`` or a list (a TOML array) -> a tuple of distinct ``host:port``."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
        if not isinstance(raw, str):
            raise ClusterConfigError(f"node addresses must be strings, got {raw!r}")
        node = raw.strip()
        if not node:
            continue
        host, sep, port = node.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ClusterConfigError(f"node address must be HOST:PORT, got {node!r}")
        if node in out:
            raise ClusterConfigError(f"node {node} is listed twice")
        out.append(node)
    return tuple(out)


def token_from_env() -> str | None:
    return os.environ.get(NODE_TOKEN_ENV) or None


def node_token(token_file: str | None) -> str | None:
    """The token a daemon presents to its nodes: the first field of the first
    non-comment line of ``token_file`` (a bare token, or a node's ``token *`` line), else
    ``$KVSTORE_NODE_AUTH_TOKEN``."""
    if token_file is None:
        return token_from_env()
    try:
        return token_from_file(token_file, "--node-token-file")
    except InvalidArgument as e:
        raise ClusterConfigError(str(e)) from None
