"""Clusters of real storage nodes for the cluster-client tests.

``inproc_nodes(n)`` runs ``n`` real nodes (gRPC server + SSD engine) inside the test
process: quick to start, stop and restart on the same port. The fault tests that need
``kill -9`` use real processes (``LocalCluster``) instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from kvstore.keys import Key, Namespace, chain_keys
from storage_nodes.cluster import ClusterConfig, ClusterTier
from storage_nodes.node import NodeConfig, NodeServer
from tests.conftest import payload_for


class InprocNode:
    def __init__(self, directory: Path, capacity_bytes: int = 4 << 20) -> None:
        # Eight slabs, so size classes can share the capacity (the engine's default for
        # a few MiB would be a single slab).
        self.config = NodeConfig(
            dir=directory,
            capacity_bytes=capacity_bytes,
            listen="127.0.0.1:0",
            slab_bytes=capacity_bytes // 8 // 4096 * 4096,
        )
        self.server: NodeServer | None = None
        self.port = 0
        self.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        listen = f"127.0.0.1:{self.port}"
        cfg = NodeConfig(
            dir=self.config.dir,
            capacity_bytes=self.config.capacity_bytes,
            listen=listen,
            slab_bytes=self.config.slab_bytes,
        )
        self.server = NodeServer(cfg)
        self.port = self.server.start().port

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


InprocNodes = Callable[..., list[InprocNode]]


@pytest.fixture
def inproc_nodes(tmp_path: Path) -> Iterator[InprocNodes]:
    made: list[InprocNode] = []

    def make(n: int, capacity_bytes: int = 4 << 20) -> list[InprocNode]:
        nodes = [InprocNode(tmp_path / f"node{len(made) + i}", capacity_bytes) for i in range(n)]
        made.extend(nodes)
        return nodes

    yield make
    for node in made:
        node.stop()


@pytest.fixture
def open_cluster() -> Iterator[Callable[..., ClusterTier]]:
    tiers: list[ClusterTier] = []

    def make(nodes: list[InprocNode] | tuple[str, ...], **kw: object) -> ClusterTier:
        targets = tuple(n if isinstance(n, str) else n.target for n in nodes)
        kw.setdefault("probe_interval_s", 0.1)
        kw.setdefault("rpc_timeout_s", 5.0)
        tier = ClusterTier(ClusterConfig(nodes=targets, **kw))  # type: ignore[arg-type]
        tiers.append(tier)
        return tier

    yield make
    for t in tiers:
        t.close()


def make_chain(ns: Namespace, n: int, seed: int = 0) -> list[Key]:
    rng = np.random.default_rng(seed)
    return chain_keys(ns, rng.integers(0, 50_000, n * ns.block_tokens))


def rows(ns: Namespace, keys: list[Key]) -> bytes:
    return b"".join(payload_for(ns, k) for k in keys)


def read_back(tier: ClusterTier, ns: Namespace, keys: list[Key]) -> tuple[int, bool]:
    """(blocks returned, whether they are exactly the bytes written)."""
    dst = bytearray(len(keys) * ns.block_bytes)
    n = tier.get_into(ns, keys, dst)
    return n, bytes(dst[: n * ns.block_bytes]) == rows(ns, keys[:n])


def counter(tier: ClusterTier, name: str) -> int:
    return int(tier.stats().counters[name])  # a misspelt name fails, it is not a 0
