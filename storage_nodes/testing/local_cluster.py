"""A cluster of real node processes on loopback, for tests, benchmarks and the
conformance suite: ``LocalCluster(dir, n, capacity)`` starts ``n`` ``kvstore node``
processes in parallel and stops them all, whatever happens."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.tier import ClusterTier
from storage_nodes.testing.node_process import NodeProcess


class LocalCluster:
    def __init__(
        self, root: Path | str, n: int, capacity: str | int, args: tuple[str, ...] = ()
    ) -> None:
        self.root = Path(root)
        with ThreadPoolExecutor(n) as pool:
            futures = [
                pool.submit(NodeProcess, self.root / f"node{i}", capacity, args) for i in range(n)
            ]
        self.nodes: list[NodeProcess] = []
        errors = []
        for f in futures:
            try:
                self.nodes.append(f.result())
            except Exception as e:  # stop the ones that did start
                errors.append(e)
        if errors:
            self.stop()
            raise errors[0]

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(p.target for p in self.nodes)

    def tier(self, **overrides: Any) -> ClusterTier:
        return ClusterTier(ClusterConfig(nodes=self.targets, **overrides))

    def stop(self) -> None:
        # Signal every node first, then wait: they shut down in parallel, and this also
        # works from an atexit hook, where no new threads can be started.
        for p in self.nodes:
            p.terminate()
        for p in self.nodes:
            p.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
