"""Prometheus metrics of a server, the daemon's or a node's (``--metrics-listen``).

Two sources: counters the RPC layer keeps itself (bytes in and out per path, rejected
blocks, RPC errors and latency; the daemon adds its lookup and hit counters,
``kvstore.daemon.metrics``), and, at scrape time, the store's own
``stats()`` (per-tier capacity, usage per size class, and every tier/store counter:
evictions, back-pressure waits, drops, retention violations, corrupt blocks…), so the
two can never disagree about what the store did.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvstore.tier import StoreStats

_LATENCY_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    10,
)
T = TypeVar("T")
_NAME_RE = re.compile(r"[^a-zA-Z0-9_]")


# The headline counters of the issue, always exported per tier (0 when a tier does not
# count that event), under one name whatever each tier calls them internally.
_CANONICAL_TIER: dict[str, tuple[str, ...]] = {
    "kvstore_evictions": ("evictions", "evictions_total"),
    "kvstore_dropped_blocks": ("put_dropped", "dropped", "dropped_total"),
    "kvstore_retention_violations": ("retention_violations_total", "retention_violations"),
    "kvstore_corrupt_blocks": ("corrupt_blocks_total", "corrupt_blocks"),
}
_CANONICAL_STORE: dict[str, tuple[str, ...]] = {
    "kvstore_backpressure_waits": ("backpressure_waits_total",),
    "kvstore_commit_dropped_blocks": ("dropped_blocks_total",),
    "kvstore_writeback_dropped_blocks": ("writeback_dropped_total",),
}


def _metric_name(counter: str) -> str:
    base = _NAME_RE.sub("_", counter).strip("_").lower()
    return f"kvstore_{base.removesuffix('_total')}"


class StoreCollector(Collector):
    """Exports ``store.stats()`` at scrape time."""

    def __init__(self, stats: Callable[[], StoreStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Any]:
        try:
            st = self._stats()
        except Exception:  # a scrape must never take the daemon down
            return
        cap = GaugeMetricFamily("kvstore_tier_capacity_bytes", "tier capacity", labels=["tier"])
        used = GaugeMetricFamily("kvstore_tier_used_bytes", "tier bytes in use", labels=["tier"])
        cls_cap = GaugeMetricFamily(
            "kvstore_size_class_capacity_blocks",
            "capacity in blocks",
            labels=["tier", "block_bytes"],
        )
        cls_used = GaugeMetricFamily(
            "kvstore_size_class_used_blocks", "blocks stored", labels=["tier", "block_bytes"]
        )
        counters: dict[str, CounterMetricFamily] = {}

        def counter(name: str, labels: list[str]) -> CounterMetricFamily:
            fam = counters.get(name)
            if fam is None:
                fam = counters[name] = CounterMetricFamily(
                    name, f"store counter {name}", labels=labels
                )
            return fam

        canon = {
            name: CounterMetricFamily(name, f"{name} per tier", labels=["tier"])
            for name in _CANONICAL_TIER
        }
        canon_store = {
            name: CounterMetricFamily(name, name, labels=[]) for name in _CANONICAL_STORE
        }
        for name, aliases in _CANONICAL_STORE.items():
            canon_store[name].add_metric([], sum(int(st.counters.get(a, 0)) for a in aliases))
        for t in st.tiers:
            for name, aliases in _CANONICAL_TIER.items():
                canon[name].add_metric([t.name], sum(int(t.counters.get(a, 0)) for a in aliases))
            cap.add_metric([t.name], t.capacity_bytes)
            used.add_metric([t.name], t.used_bytes)
            for c in t.size_classes:
                cls_cap.add_metric([t.name, str(c.block_bytes)], c.capacity_blocks)
                cls_used.add_metric([t.name, str(c.block_bytes)], c.used_blocks)
            for k, v in t.counters.items():
                counter(_metric_name(k) + "_tier", ["tier"]).add_metric([t.name], v)
        for k, v in st.counters.items():
            counter(_metric_name(k) + "_store", []).add_metric([], v)
        yield from (
            cap,
            used,
            cls_cap,
            cls_used,
            *canon.values(),
            *canon_store.values(),
            *counters.values(),
        )


class RpcMetrics:
    """The RPC-side counters every server keeps; one registry per server so tests can run
    several in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.bytes_in = Counter(
            "kvstore_bytes_in", "payload bytes committed", ["path", "block_bytes"], registry=r
        )
        self.bytes_out = Counter(
            "kvstore_bytes_out", "payload bytes served", ["path", "block_bytes"], registry=r
        )
        self.rejected_blocks = Counter(
            "kvstore_rejected_blocks",
            "received blocks failing verification",
            ["reason"],
            registry=r,
        )
        self.rpc_errors = Counter(
            "kvstore_rpc_errors", "failed RPCs", ["method", "code"], registry=r
        )
        # Every message a client stream delivers, counted as the servicer reads it: how far
        # a stream got (tests wait on it before they cut one; operators see stuck streams).
        self.stream_messages = Counter(
            "kvstore_stream_messages", "messages read from client streams", ["method"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "kvstore_rpc_seconds", "RPC latency", ["method"], buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self._server: Any = None

    def attach_store(self, stats: Callable[[], StoreStats]) -> None:
        self.registry.register(StoreCollector(stats))

    @contextmanager
    def timed(self, method: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.rpc_seconds.labels(method).observe(time.perf_counter() - t0)

    def counted(self, method: str, it: Iterator[T]) -> Iterator[T]:
        """``it``, counting each message in ``stream_messages`` as it is read."""
        c = self.stream_messages.labels(method)
        for msg in it:
            c.inc()
            yield msg

    def serve(self, listen: str) -> int:
        """Start the HTTP exporter on ``host:port``; returns the bound port."""
        host, _, port = listen.rpartition(":")
        server, _thread = start_http_server(
            int(port), addr=host or "127.0.0.1", registry=self.registry
        )
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
