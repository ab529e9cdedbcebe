"""Errors of the cluster client (one hierarchy, rooted in ``kvstore.errors``)."""

from __future__ import annotations

from kvstore.errors import InvalidArgument, KVStoreError, StoreUnavailable


class ClusterError(KVStoreError):
    """Base of every error raised by ``storage_nodes.cluster``."""


class ClusterConfigError(ClusterError, InvalidArgument):
    """A cluster configuration that cannot work (no nodes, R > N, W > R...)."""


class NodeUnavailable(ClusterError, StoreUnavailable):
    """One node did not answer in time. The cluster fails over; callers never see it."""
