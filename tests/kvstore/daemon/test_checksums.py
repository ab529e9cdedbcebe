"""End-to-end checksums through the daemon (issue 14, item 3), and truthful flushes over
gRPC (item 1).

A real gRPC server on a loopback port runs the daemon's servicer over a real tier
manager. Where a fault must land at one precise point (the daemon's memory after its own
check, the staging segment while a commit is in flight), the store is wrapped by
``Meddling``, which delegates every call and damages bytes at that point — what a stray
write in the daemon process or a misbehaving client would do.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from clients.async_client import BlockingAdapter
from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.block import payload_checksum
from kvstore.daemon.config import DaemonConfig
from kvstore.daemon.server import Daemon
from kvstore.dram import DramConfig, DramTier
from kvstore.errors import NotDurable
from kvstore.keys import Key, Namespace
from kvstore.manager import ManagerConfig, TierManager
from kvstore.tier import CommitResult, Durability, KVStore
from storage_nodes.ssd import SSDTier
from tests.conftest import payload_for, small_ns
from tests.delegating import DelegatingStore
from tests.kvstore.daemon.conftest import make_chain, payloads
from tests.storage_nodes.ssd.helpers import make_config

NS = small_ns()
BB = NS.block_bytes


class Meddling(DelegatingStore):
    """The real store; ``after_get(dst)`` runs on each ``get_into`` destination once the
    store filled (and checked) it, ``before_commit()`` before each commit reaches it."""

    def __init__(self, inner: KVStore) -> None:
        super().__init__(inner)
        self.after_get: Callable[[memoryview], None] | None = None
        self.before_commit: Callable[[], None] | None = None

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        n = super().get_into(ns, keys, dst, timeout_s=timeout_s, checksums=checksums)
        if self.after_get is not None:
            self.after_get(memoryview(dst).cast("B"))
        return n

    def commit(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        payloads: Mapping[int, Any],
        *,
        durability: Durability = "dram",
        timeout_s: float | None = None,
    ) -> CommitResult:
        if self.before_commit is not None:
            self.before_commit()
        return super().commit(ns, keys, payloads, durability=durability, timeout_s=timeout_s)


Serve = Callable[..., tuple[Daemon, Meddling, TierManager]]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """``serve(ssd=False)``: an in-process daemon on a free port over DRAM (and, with
    ``ssd``, the real SSD engine on the fault-injecting backend)."""
    started: list[Daemon] = []

    def make(ssd: bool = False) -> tuple[Daemon, Meddling, TierManager]:
        tiers: list[Any] = [DramTier(DramConfig(64 * BB, chunk_bytes=16 * BB))]
        if ssd:
            tiers.append(SSDTier(make_config(tmp_path / "ssd", io_backend="faulty")))
        manager = TierManager(tiers, ManagerConfig(max_dirty_bytes=16 * BB))
        store = Meddling(manager)
        d = Daemon(DaemonConfig(listen="127.0.0.1:0", workers=4), store=store)
        d.start()
        started.append(d)
        return d, store, manager

    yield make
    for d in started:
        d.stop()


def client(d: Daemon, shm: str) -> GrpcStore:
    return GrpcStore(ClientConfig(target=f"127.0.0.1:{d.port}", shm=shm))


def read(c: GrpcStore, keys: list[Key]) -> tuple[int, bool]:
    """(blocks served, every served byte is the committed one)."""
    dst = bytearray(len(keys) * BB)
    n = c.get_into(NS, keys, dst)
    want = b"".join(payload_for(NS, k) for k in keys[:n])
    return n, bytes(dst[: n * BB]) == want


def flip_in_dram(manager: TierManager, key: Key) -> None:
    top = manager.tiers[0]
    assert isinstance(top, DramTier)
    cs = top._classes[BB]
    top._pool.tensor[top._pool.offset(cs.sc, cs.slot[key]) + 33] ^= 0x04


@pytest.mark.parametrize("shm", ["off", "auto"])
def test_a_byte_flipped_in_dram_never_reaches_the_client(serve: Serve, shm: str) -> None:
    d, _, manager = serve()
    c = client(d, shm)
    c.register(NS)
    keys = make_chain(NS, 6, seed=1)
    c.commit(NS, keys, payloads(NS, keys))
    flip_in_dram(manager, keys[2])
    assert read(c, keys) == (2, True)
    assert c.stats().counters["corrupt_blocks_total"] == 1
    c.close()


def test_a_byte_flipped_in_the_daemons_memory_fails_at_the_client(serve: Serve) -> None:
    # After the store checked its copy, the daemon's send buffer is damaged: the block
    # header must carry the stored checksum, so the client catches it.
    d, store, _ = serve()
    c = client(d, "off")
    c.register(NS)
    keys = make_chain(NS, 5, seed=2)
    c.commit(NS, keys, payloads(NS, keys))

    def damage(dst: memoryview) -> None:
        dst[3 * BB + 17] ^= 0x80

    store.after_get = damage
    assert read(c, keys) == (3, True)
    assert c.corrupt_blocks == 1
    c.close()


def test_a_staged_commit_stores_the_bytes_it_checked(serve: Serve) -> None:
    # The client-writable segment changes after the daemon checked the rows but before
    # they are stored: the daemon must have copied them out first.
    d, store, _ = serve()
    c = client(d, "auto")
    assert c.uses_shm
    c.register(NS)
    keys = make_chain(NS, 4, seed=3)

    def scribble() -> None:
        assert d.staging is not None
        for seg in d.staging._segments.values():
            seg.view[4096:] = bytes(len(seg.view) - 4096)

    store.before_commit = scribble
    assert c.commit(NS, keys, payloads(NS, keys)).inserted == 4
    store.before_commit = None
    assert read(c, keys) == (4, True)
    c.close()


def test_flush_over_grpc_reports_what_the_ssd_refused(serve: Serve) -> None:
    d, _, manager = serve(ssd=True)
    ssd = manager.tiers[1]
    assert isinstance(ssd, SSDTier)
    c = client(d, "off")
    c.register(NS)
    keys = make_chain(NS, 3, seed=4)
    c.commit(NS, keys, payloads(NS, keys), durability="ssd")
    c.flush()
    ssd.io_backend.write_errno = errno.ENOSPC  # type: ignore[attr-defined]
    more = make_chain(NS, 5, seed=5)
    assert c.commit(NS, more, payloads(NS, more), durability="ssd").durability == "dram"
    with pytest.raises(NotDurable) as e:
        c.flush()
    assert e.value.refused_blocks == 5
    c.flush()  # reported once; the breaker was not tripped by it
    assert c.breaker.state == "closed"
    c.close()


def _clients(d: Daemon) -> list[KVStore]:
    config = ClientConfig(target=f"127.0.0.1:{d.port}", shm="auto")
    return [GrpcStore(config), BlockingAdapter(config)]


@pytest.mark.parametrize("which", [0, 1], ids=["sync", "asyncio"])
def test_a_byte_flipped_in_the_segment_fails_at_the_client(serve: Serve, which: int) -> None:
    # The daemon copied and checked the rows into the shared segment; then a byte of the
    # segment changes before the client copies them out: the client must check its copy.
    d, store, _ = serve()
    c = _clients(d)[which]
    c.register(NS)
    keys = make_chain(NS, 5, seed=6)
    c.commit(NS, keys, payloads(NS, keys))

    def damage(dst: memoryview) -> None:
        dst[1 * BB + 300] ^= 0x01

    store.after_get = damage
    sums: list[int] = []
    dst = bytearray(5 * BB)
    assert c.get_into(NS, keys, dst, checksums=sums) == 1
    assert bytes(dst[:BB]) == payload_for(NS, keys[0])
    assert sums == [payload_checksum(payload_for(NS, keys[0]))]
    st = c.stats().counters
    assert st["client_corrupt_blocks_total"] == 1 and st["corrupt_blocks_total"] == 1
    c.close()


def test_a_zero_copy_read_is_checked_in_the_segment(serve: Serve) -> None:
    d, store, _ = serve()
    c = client(d, "auto")
    c.register(NS)
    keys = make_chain(NS, 4, seed=7)
    c.commit(NS, keys, payloads(NS, keys))
    got = c.staging_buffer(4 * BB)
    assert got is not None
    off, arr = got
    assert c.get_into(NS, keys, arr) == 4  # undamaged: every row passes in place

    def damage(dst: memoryview) -> None:
        dst[2 * BB] ^= 0x01

    store.after_get = damage
    assert c.get_into(NS, keys, arr) == 2
    assert c.corrupt_blocks == 1
    c.release_buffer(off)
    c.close()


@pytest.mark.parametrize("which", [0, 1], ids=["sync", "asyncio"])
def test_get_hands_on_the_stored_checksums_on_the_grpc_path(serve: Serve, which: int) -> None:
    d, _, _ = serve()
    config = ClientConfig(target=f"127.0.0.1:{d.port}", shm="off")
    c: KVStore = GrpcStore(config) if which == 0 else BlockingAdapter(config)
    c.register(NS)
    keys = make_chain(NS, 3, seed=8)
    c.commit(NS, keys, payloads(NS, keys))
    sums: list[int] = []
    assert c.get_into(NS, keys, bytearray(3 * BB), checksums=sums) == 3
    assert sums == [payload_checksum(payload_for(NS, k)) for k in keys]
    c.close()
