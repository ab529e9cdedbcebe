"""Eviction policies by name: the DRAM tier and ``kvstore hitrate --policy`` share them."""

from __future__ import annotations

from kvstore.errors import InvalidArgument
from kvstore.eviction.base import EvictionPolicy
from kvstore.eviction.lru import LRUPolicy
from kvstore.eviction.s3fifo import S3FIFOPolicy

POLICIES: dict[str, type[EvictionPolicy]] = {
    LRUPolicy.name: LRUPolicy,
    S3FIFOPolicy.name: S3FIFOPolicy,
}


def make_policy(name: str, capacity: float) -> EvictionPolicy:
    """Instantiate a registered policy; unknown names are a one-line ``InvalidArgument``."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise InvalidArgument(
            f"unknown eviction policy {name!r}; known: {sorted(POLICIES)}"
        ) from None
    return cls(capacity)


__all__ = ["POLICIES", "EvictionPolicy", "LRUPolicy", "S3FIFOPolicy", "make_policy"]
