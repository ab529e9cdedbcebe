"""The storage-node cluster client: rendezvous placement, replication, health.

``ClusterTier(ClusterConfig(nodes=("h:p", ...)))`` implements ``kvstore.tier.Tier``
(name ``"ssd"``), so the cache daemon uses a cluster wherever it would use the
embedded SSD engine (``kvstore serve --nodes``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from storage_nodes.cluster.config import ClusterConfig, parse_nodes, token_from_env
from storage_nodes.cluster.errors import ClusterConfigError, ClusterError, NodeUnavailable
from storage_nodes.cluster.tier import ClusterTier


def open_cluster_tier(nodes: str | Sequence[str], **overrides: Any) -> ClusterTier:
    """The daemon's entry point: ``nodes`` as ``"h:p,h:p"`` or a list; the node token
    comes from ``$KVSTORE_NODE_AUTH_TOKEN`` unless ``auth_token=`` is given."""
    overrides.setdefault("auth_token", token_from_env())
    return ClusterTier(ClusterConfig(nodes=parse_nodes(nodes), **overrides))


__all__ = [
    "ClusterConfig",
    "ClusterConfigError",
    "ClusterError",
    "ClusterTier",
    "NodeUnavailable",
    "open_cluster_tier",
    "parse_nodes",
]
