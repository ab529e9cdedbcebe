"""A same-host call the daemon did not answer in time never lends its staging range to
another call (``ClientCore._staged_call``, DESIGN §7).

A real in-process daemon on a loopback port serves a real DRAM tier manager; ``Stalling`` holds
one ``get_into`` — the daemon writing a ``GetStaged`` hit into the client's range — until
the test lets it go, so the client's deadline fires first, deterministically. The daemon
then writes the old request's rows into that range after the client gave up on it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from clients.async_client import AsyncGrpcStore
from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.daemon.config import DaemonConfig
from kvstore.daemon.server import Daemon
from kvstore.dram import DramConfig, DramTier
from kvstore.errors import StoreUnavailable
from kvstore.keys import Key, Namespace
from kvstore.manager import ManagerConfig, TierManager
from tests.conftest import payload_for, small_ns
from tests.delegating import DelegatingStore
from tests.kvstore.daemon.conftest import make_chain, payloads

NS = small_ns(model_id="staged-timeout")
BB = NS.block_bytes
N = 4
WAIT_S = 60.0


class Stalling(DelegatingStore):
    """The real store; once ``stall()`` is called, the next ``get_into`` waits for
    ``release`` before it fills its destination, and sets ``stalled_done`` after."""

    def __init__(self, inner: TierManager) -> None:
        super().__init__(inner)
        self._armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.stalled_done = threading.Event()
        #: runs in the next get after the stalled one, once that one filled its rows
        self.after_next_get: Any = None

    def stall(self) -> None:
        self._armed = True

    def get_into(
        self,
        ns: Namespace,
        keys: Sequence[Key],
        dst: Any,
        *,
        timeout_s: float | None = None,
        checksums: list[int] | None = None,
    ) -> int:
        stalled, self._armed = self._armed, False
        if stalled:
            self.entered.set()
            assert self.release.wait(WAIT_S)
        n = super().get_into(ns, keys, dst, timeout_s=None, checksums=checksums)
        if stalled:
            self.stalled_done.set()
        elif self.after_next_get is not None:
            hook, self.after_next_get = self.after_next_get, None
            hook()
        return n


@pytest.fixture
def served() -> Iterator[tuple[Daemon, Stalling, GrpcStore]]:
    dram = DramTier(DramConfig(64 * BB, chunk_bytes=16 * BB))
    store = Stalling(TierManager([dram], ManagerConfig()))
    d = Daemon(DaemonConfig(listen="127.0.0.1:0", workers=4), store=store)
    d.start()
    c = GrpcStore(ClientConfig(target=f"127.0.0.1:{d.port}", shm="auto"))
    try:
        c.register(NS)
        assert c.uses_shm
        yield d, store, c
    finally:
        store.release.set()  # never leave a handler of the daemon waiting
        c.close()
        d.stop()


def time_out_a_staged_get(store: Stalling, c: GrpcStore, keys: list[Key]) -> None:
    """A GetStaged of ``keys`` the daemon is still serving after the client gave up."""
    store.stall()
    with pytest.raises(StoreUnavailable):
        c.get_into(NS, keys, bytearray(N * BB), timeout_s=0.5)
    assert store.entered.is_set() and not store.stalled_done.is_set()


def test_a_timed_out_get_never_writes_into_a_buffer_a_later_commit_sends(
    served: tuple[Daemon, Stalling, GrpcStore],
) -> None:
    """The silent case: the range goes back to the allocator, a zero-copy buffer gets it,
    the late get overwrites the caller's rows, and the commit's headers are made from what
    the buffer then holds — another request's bytes stored under these keys, checksums
    and all."""
    _, store, c = served
    old, new = make_chain(NS, N, seed=1), make_chain(NS, N, seed=2)
    c.commit(NS, old, payloads(NS, old))
    time_out_a_staged_get(store, c, old)

    got = c.staging_buffer(N * BB)
    assert got is not None
    off, buf = got
    for i, k in enumerate(new):
        buf[i * BB : (i + 1) * BB] = memoryview(payload_for(NS, k))
    store.release.set()
    assert store.stalled_done.wait(WAIT_S)
    rows = memoryview(buf)
    c.commit(NS, new, {i: rows[i * BB : (i + 1) * BB] for i in range(N)})
    c.release_buffer(off)

    dst = bytearray(N * BB)
    assert c.get_into(NS, new, dst) == N
    assert bytes(dst) == b"".join(payload_for(NS, k) for k in new)


def test_a_timed_out_get_never_overwrites_the_rows_of_a_later_get(
    served: tuple[Daemon, Stalling, GrpcStore],
) -> None:
    """The next get is served into the same range; the late one lands there before the
    client copies it out: its rows fail their checksums, and a stored chain reads as a
    (counted) miss."""
    _, store, c = served
    old, new = make_chain(NS, N, seed=3), make_chain(NS, N, seed=4)
    c.commit(NS, old, payloads(NS, old))
    c.commit(NS, new, payloads(NS, new))
    time_out_a_staged_get(store, c, old)

    def let_the_late_one_land() -> None:
        store.release.set()
        assert store.stalled_done.wait(WAIT_S)

    store.after_next_get = let_the_late_one_land
    dst = bytearray(N * BB)
    assert c.get_into(NS, new, dst) == N
    assert bytes(dst) == b"".join(payload_for(NS, k) for k in new)
    assert c.corrupt_blocks == 0


def test_the_retired_segment_goes_back_to_the_daemon(
    served: tuple[Daemon, Stalling, GrpcStore],
) -> None:
    d, store, c = served
    keys = make_chain(NS, N, seed=5)
    c.commit(NS, keys, payloads(NS, keys))
    first = c.staging
    assert first is not None and d.staging is not None
    time_out_a_staged_get(store, c, keys)
    assert first.retired and c.staging is None
    store.release.set()
    assert store.stalled_done.wait(WAIT_S)
    assert c.get_into(NS, keys, bytearray(N * BB)) == N  # through a fresh segment
    second = c.staging
    assert second is not None and second.staging_id != first.staging_id
    deadline = time.monotonic() + WAIT_S
    while first.staging_id in d.staging._segments and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(d.staging._segments) == {second.staging_id}
    assert c.stats().counters["client_staging_retired_total"] == 1
    first.allocator.check_integrity()
    second.allocator.check_integrity()


def test_a_staged_call_cancelled_by_its_caller_retires_the_segment(
    served: tuple[Daemon, Stalling, GrpcStore],
) -> None:
    """An asyncio caller that gives up (``wait_for``) cancels the call mid-flight: no
    status came back, so the daemon may still be writing the range."""
    d, store, c = served
    keys = make_chain(NS, N, seed=6)
    c.commit(NS, keys, payloads(NS, keys))

    async def main() -> None:
        s = AsyncGrpcStore(ClientConfig(target=f"127.0.0.1:{d.port}", shm="auto"))
        try:
            assert await s.uses_shm()
            first = s.staging
            assert first is not None
            store.stall()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(s.get_into(NS, keys, bytearray(N * BB)), 0.5)
            assert store.entered.is_set() and first.retired and s.staging is None
            store.release.set()
            assert await s.get_into(NS, keys, bytearray(N * BB)) == N
            assert s.staging is not None and s.staging is not first
        finally:
            await s.close()

    asyncio.run(main())
