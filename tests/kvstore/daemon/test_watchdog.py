"""The stream idle deadline (``IdleWatchdog``) of an in-process daemon on a test clock:
a stream is idle only while the daemon waits on its client, so a commit that the store
is slow to take is never cut, and a held commit is cut just past the deadline, keeping
exactly its complete blocks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kvstore.daemon.config import DaemonConfig
from kvstore.daemon.server import Daemon
from kvstore.dram import DramConfig, DramTier
from kvstore.keys import Key
from kvstore.manager import ManagerConfig, TierManager
from kvstore.rpcserver.limits import ServerLimits
from kvstore.testing.file_clock import FileClock
from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import make_chain, payloads
from tests.kvstore.daemon.test_checksums import Meddling

NS = small_ns()
BB = NS.block_bytes
IDLE_S = 5.0


class GatedCommits(Meddling):
    """The real store; each commit signals ``entered`` and waits for ``gate``."""

    def __init__(self, inner: TierManager) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.before_commit = self._hold

    def _hold(self) -> None:
        self.entered.set()
        assert self.gate.wait(60)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Daemon, GatedCommits, FileClock]]:
    clock = FileClock.create(tmp_path / "clock")
    store = GatedCommits(
        TierManager([DramTier(DramConfig(64 * BB, chunk_bytes=16 * BB))], ManagerConfig())
    )
    limits = ServerLimits(stream_idle_timeout_s=IDLE_S)
    d = Daemon(
        DaemonConfig(listen="127.0.0.1:0", workers=4, shm=False, limits=limits),
        store=store,
        clock=clock,
    )
    d.start()
    try:
        yield d, store, clock
    finally:
        store.gate.set()
        d.stop()


def messages(keys: list[Key], whole: int, partial: bool) -> list[pb.CommitRequest]:
    """Open for all ``keys``, the first ``whole`` blocks, then (``partial``) the first
    half of the next one."""
    data = payloads(NS, keys)
    out = [
        pb.CommitRequest(
            open=pb.CommitOpen(
                ns=codec.ns_to_proto(NS), keys=keys, indices=list(range(len(keys)))
            )
        )
    ]
    for i in range(whole):
        out += [
            pb.CommitRequest(chunk=c)
            for c in codec.iter_chunks(i, NS.fingerprint, keys[i], memoryview(data[i]))
        ]
    if partial:
        (c,) = codec.iter_chunks(whole, NS.fingerprint, keys[whole], memoryview(data[whole]))
        out.append(pb.CommitRequest(chunk=pb.BlockChunk(
            block_index=c.block_index, offset=0, data=c.data[: len(c.data) // 2]
        )))
    return out


def commit_metric(d: Daemon, name: str) -> float:
    v = d.metrics.registry.get_sample_value(name, {"method": "Commit"})
    return 0.0 if v is None else v  # no sample until the label is first used


def wait_for(what: str, cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_commit_the_store_is_slow_to_take_is_not_cut_as_idle(
    daemon: tuple[Daemon, GatedCommits, FileClock],
) -> None:
    d, store, clock = daemon
    keys = make_chain(NS, 2, seed=1)
    with grpc.insecure_channel(f"127.0.0.1:{d.port}") as ch:
        stub = pb_grpc.KVStoreStub(ch)
        stub.RegisterNamespace(pb.RegisterNamespaceRequest(ns=codec.ns_to_proto(NS)))
        fut = stub.Commit.future(iter(messages(keys, whole=2, partial=False)), timeout=60)
        # The client has sent everything; the daemon is inside the store's commit, far
        # past the deadline on its clock: that is the daemon's time, not the client's.
        assert store.entered.wait(60)
        clock.advance(10 * IDLE_S)
        assert d.servicer.watchdog.sweep() == 0
        store.gate.set()
        resp = fut.result(timeout=60)
        assert (resp.inserted, resp.incomplete) == (2, 0)
        assert d.servicer.watchdog.cancelled_total == 0


def test_a_held_commit_is_cut_just_past_the_deadline_and_keeps_its_whole_blocks(
    daemon: tuple[Daemon, GatedCommits, FileClock],
) -> None:
    d, store, clock = daemon
    store.gate.set()
    keys = make_chain(NS, 3, seed=2)
    msgs = messages(keys, whole=1, partial=True)
    release = threading.Event()

    def held() -> Iterator[pb.CommitRequest]:
        yield from msgs
        release.wait(60)

    with grpc.insecure_channel(f"127.0.0.1:{d.port}") as ch:
        stub = pb_grpc.KVStoreStub(ch)
        stub.RegisterNamespace(pb.RegisterNamespaceRequest(ns=codec.ns_to_proto(NS)))
        read = commit_metric(d, "kvstore_stream_messages_total") + len(msgs)
        finished = commit_metric(d, "kvstore_rpc_seconds_count") + 1
        fut = stub.Commit.future(held(), timeout=60)
        try:
            wait_for(
                "the daemon never read what was sent",
                lambda: commit_metric(d, "kvstore_stream_messages_total") >= read,
            )
            assert commit_metric(d, "kvstore_stream_messages_total") == read
            clock.advance(IDLE_S)  # at the deadline, not past it
            assert d.servicer.watchdog.sweep() == 0
            clock.advance(0.5)
            assert d.servicer.watchdog.sweep() == 1
            with pytest.raises(grpc.RpcError) as e:
                fut.result(timeout=60)
            assert e.value.code() == grpc.StatusCode.CANCELLED
        finally:
            release.set()
        # The client hears CANCELLED before the daemon has stored what the stream kept.
        wait_for(
            "the daemon never finished the call",
            lambda: commit_metric(d, "kvstore_rpc_seconds_count") >= finished,
        )
        hit = stub.Lookup(pb.LookupRequest(ns=codec.ns_to_proto(NS), keys=keys)).hit_blocks
        assert hit == 1  # block 0 whole and verified; the half-sent block 1 never stored
