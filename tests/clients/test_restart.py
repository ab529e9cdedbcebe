"""A restarted daemon is transparent to both clients (issue 14, item 7).

The new daemon knows neither the client's staging segment nor its namespaces: the client
must map a fresh segment (falling back to gRPC for the call that found it lost) and
register the namespace again, never report misuse. Both façades run the same core, and
this test runs against both.
"""

from __future__ import annotations

import threading

import pytest

from clients.async_client import BlockingAdapter
from clients.breaker import BreakerConfig
from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.errors import StoreUnavailable
from kvstore.tier import KVStore
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads

NS = small_ns(model_id="restart")


def open_client(kind: str, config: ClientConfig) -> GrpcStore | BlockingAdapter:
    return GrpcStore(config) if kind == "sync" else BlockingAdapter(config)


def wait_until_answering(s: KVStore) -> None:
    for _ in range(100):
        try:
            s.stats(timeout_s=2)
            return
        except StoreUnavailable:
            threading.Event().wait(0.1)
    raise AssertionError("the restarted daemon never answered")


@pytest.mark.parametrize("shm", ["auto", "off"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_restarted_daemon_is_transparent(spawn_daemon: SpawnDaemon, kind: str, shm: str) -> None:
    d = spawn_daemon()
    port = d.port
    cfg = ClientConfig(
        target=d.target,
        default_timeout_s=2,
        shm=shm,
        breaker=BreakerConfig(failure_threshold=50, cooldown_s=0.1),
    )
    s = open_client(kind, cfg)
    try:
        s.register(NS)
        keys = make_chain(NS, 3, seed=40)
        s.commit(NS, keys, payloads(NS, keys))
        old_segment = s.staging
        assert (old_segment is not None) == (shm == "auto")
        d.kill()
        spawn_daemon("--listen", f"127.0.0.1:{port}")
        wait_until_answering(s)
        # Every namespace call works at once: the daemon never hears of misuse.
        assert s.lookup(NS, keys).hit_blocks == 0  # DRAM-only daemon: the data died with it
        dst = bytearray(3 * NS.block_bytes)
        assert s.get_into(NS, keys, dst) == 0
        assert s.commit(NS, keys, payloads(NS, keys)).inserted == 3
        assert s.get_into(NS, keys, dst) == 3
        assert bytes(dst) == b"".join(payloads(NS, keys).values())
        assert s.prefetch(NS, keys).result(timeout=10) == 3
        if shm == "auto":
            assert s.staging is not None and s.staging is not old_segment
        else:
            assert s.staging is None
        assert s.breaker.state == "closed"
    finally:
        s.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_lost_segment_on_get_falls_back_then_remaps(spawn_daemon: SpawnDaemon, kind: str) -> None:
    # The first call after the restart is a read through shared memory: it must fall back
    # to gRPC for that call (no error), and the next call maps a fresh segment.
    d = spawn_daemon()
    port = d.port
    cfg = ClientConfig(
        target=d.target,
        default_timeout_s=2,
        breaker=BreakerConfig(failure_threshold=50, cooldown_s=0.1),
    )
    s = open_client(kind, cfg)
    try:
        s.register(NS)
        assert s.uses_shm
        old_segment = s.staging
        d.kill()
        spawn_daemon("--listen", f"127.0.0.1:{port}")
        wait_until_answering(s)
        s.register(NS)
        keys = make_chain(NS, 2, seed=41)
        assert s.get_into(NS, keys, bytearray(2 * NS.block_bytes)) == 0
        assert s.commit(NS, keys, payloads(NS, keys)).inserted == 2
        assert s.staging is not None and s.staging is not old_segment
    finally:
        s.close()
