"""The cache daemon's metrics: every server's (``kvstore.rpcserver.metrics``) plus the
lookup and hit counters only the daemon has (per size class, hits by fastest tier)."""

from __future__ import annotations

from prometheus_client import Counter

from kvstore.rpcserver.metrics import RpcMetrics


class DaemonMetrics(RpcMetrics):
    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.lookups = Counter("kvstore_lookups", "Lookup RPCs", ["block_bytes"], registry=r)
        self.lookup_blocks = Counter(
            "kvstore_lookup_blocks", "blocks asked for by Lookup", ["block_bytes"], registry=r
        )
        self.hit_blocks = Counter(
            "kvstore_hit_blocks",
            "Lookup hit blocks by fastest tier",
            ["tier", "block_bytes"],
            registry=r,
        )
        self.hit_tokens = Counter(
            "kvstore_hit_tokens",
            "Lookup hit tokens by fastest tier",
            ["tier", "block_bytes"],
            registry=r,
        )

    def record_lookup(
        self, block_bytes: int, block_tokens: int, asked: int, tiers: tuple[str, ...]
    ) -> None:
        bb = str(block_bytes)
        self.lookups.labels(bb).inc()
        self.lookup_blocks.labels(bb).inc(asked)
        per_tier: dict[str, int] = {}
        for t in tiers:
            per_tier[t] = per_tier.get(t, 0) + 1
        for t, n in per_tier.items():
            self.hit_blocks.labels(t, bb).inc(n)
            self.hit_tokens.labels(t, bb).inc(n * block_tokens)
