"""Parallel calls to several nodes, with health bookkeeping on every outcome."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from storage_nodes.cluster.errors import NodeUnavailable
from storage_nodes.cluster.health import HealthTracker

T = TypeVar("T")


class Fanout:
    """Runs one callable per node; a ``NodeUnavailable`` becomes that node's result
    (and a health failure), any other exception (misuse) propagates to the caller."""

    def __init__(self, health: HealthTracker, workers: int) -> None:
        self._health = health
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kvstore-cluster")
        # Background work (read repair) has its own small pool, so it can never queue
        # ahead of a caller's request.
        self._background = ThreadPoolExecutor(2, thread_name_prefix="kvstore-cluster-bg")

    def one(self, node: int, fn: Callable[[], T]) -> T | NodeUnavailable:
        try:
            out = fn()
        except NodeUnavailable as e:
            self._health.failure(node)
            return e
        self._health.success(node)
        return out

    def run(self, calls: Mapping[int, Callable[[], T]]) -> dict[int, T | NodeUnavailable]:
        if len(calls) <= 1:  # the common single-node case needs no thread hop
            return {node: self.one(node, fn) for node, fn in calls.items()}
        futures = {node: self._pool.submit(self.one, node, fn) for node, fn in calls.items()}
        return {node: f.result() for node, f in futures.items()}

    def submit(self, node: int, fn: Callable[[], T]) -> None:
        """Fire and forget (read repair): the outcome only feeds health."""
        self._background.submit(self.one, node, fn)

    def close(self) -> None:
        self._background.shutdown(wait=True)
        self._pool.shutdown(wait=True)
