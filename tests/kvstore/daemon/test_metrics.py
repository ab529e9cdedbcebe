"""Prometheus metrics of a real daemon, scraped over HTTP."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads

NS = small_ns()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counters_follow_the_traffic(spawn_daemon: SpawnDaemon) -> None:
    d = spawn_daemon("--metrics-listen", "127.0.0.1:0", "--dram", "256KiB")
    assert d.metrics_port
    bb = str(NS.block_bytes)
    keys = make_chain(NS, 4, seed=1)
    for shm in ("off", "auto"):
        with GrpcStore(ClientConfig(target=d.target, shm=shm)) as c:
            c.register(NS)
            c.commit(NS, keys, payloads(NS, keys, idx=[0, 1, 2]))
            c.lookup(NS, keys)
            c.get_into(NS, keys, bytearray(4 * NS.block_bytes))
            c.delete_namespace(NS)
    m = scrape(d.metrics_port)
    assert m[("kvstore_lookups_total", (("block_bytes", bb),))] == 2
    assert m[("kvstore_lookup_blocks_total", (("block_bytes", bb),))] == 8
    assert m[("kvstore_hit_blocks_total", (("block_bytes", bb), ("tier", "dram")))] == 6
    assert (
        m[("kvstore_hit_tokens_total", (("block_bytes", bb), ("tier", "dram")))]
        == 6 * NS.block_tokens
    )
    for path in ("grpc", "shm"):
        assert (
            m[("kvstore_bytes_in_total", (("block_bytes", bb), ("path", path)))]
            == 3 * NS.block_bytes
        )
        assert (
            m[("kvstore_bytes_out_total", (("block_bytes", bb), ("path", path)))]
            == 3 * NS.block_bytes
        )
    assert m[("kvstore_rpc_seconds_count", (("method", "Lookup"),))] == 2
    # The one streamed commit (shm off): its CommitOpen and one chunk per block.
    assert m[("kvstore_stream_messages_total", (("method", "Commit"),))] == 1 + 3
    # The store's own counters and capacity, per tier, at scrape time.
    assert m[("kvstore_tier_capacity_bytes", (("tier", "dram"),))] == 256 << 10
    for name in ("evictions", "dropped_blocks", "retention_violations", "corrupt_blocks"):
        assert m[(f"kvstore_{name}_total", (("tier", "dram"),))] == 0
    assert m[("kvstore_backpressure_waits_total", ())] == 0
    assert m[("kvstore_commits_store_total", ())] == 2
    cap = m[("kvstore_size_class_capacity_blocks", (("block_bytes", bb), ("tier", "dram")))]
    assert 0 < cap < 200
    # Overfill DRAM: evictions show up under the canonical name, exactly one per block that
    # did not fit (none held: the namespace was deleted above; 200 new, nothing pinned).
    with GrpcStore(ClientConfig(target=d.target)) as c:
        c.register(NS)
        for seed in (2, 3):
            big = make_chain(NS, 100, seed=seed)
            c.commit(NS, big, payloads(NS, big))
    assert scrape(d.metrics_port)[("kvstore_evictions_total", (("tier", "dram"),))] == 200 - cap
