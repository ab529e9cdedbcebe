"""Bounded server memory (issue 14, items 6 and 12): a client that opens many large
commits and never finishes them can neither grow the daemon past its in-flight bound nor
hold its buffers for longer than the idle deadline, round after round.

The daemon's idle deadline runs on a ``FileClock`` the test moves once the daemon has
read everything the held streams sent, so what a cut stream keeps is exact (block 0,
never the half-sent block 1) however the machine schedules the two processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from clients.breaker import BreakerConfig
from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.testing.file_clock import FileClock
from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import (
    SpawnDaemon,
    finished_calls,
    make_chain,
    metric,
    payloads,
    stream_messages,
)

BIG = small_ns(model_id="bounds-big", kv_heads=1, head_dim=16384)  # 2 MiB blocks
MiB = 1 << 20
INFLIGHT = 64 * MiB
BLOCKS_PER_STREAM = 16  # 32 MiB announced per stream
STREAMS = 10
IDLE_S = 3  # the daemon's stream idle deadline, on its test clock


def rss(d: DaemonProcess, field: str = "VmRSS") -> int:
    with open(f"/proc/{d.proc.pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for the daemon")


def held_messages(keys: list[bytes]) -> list[pb.CommitRequest]:
    """Announce BLOCKS_PER_STREAM blocks, then block 0 whole and block 1's first chunk
    (made before the stream opens, so the client sends them without a pause)."""
    data = payloads(BIG, keys, idx=[0, 1])
    chunks = [*codec.iter_chunks(0, BIG.fingerprint, keys[0], memoryview(data[0]))]
    chunks += [*codec.iter_chunks(1, BIG.fingerprint, keys[1], memoryview(data[1]))][:1]
    opening = pb.CommitOpen(
        ns=codec.ns_to_proto(BIG), keys=keys, indices=list(range(BLOCKS_PER_STREAM))
    )
    return [pb.CommitRequest(open=opening), *(pb.CommitRequest(chunk=c) for c in chunks)]


def held_stream(
    msgs: list[pb.CommitRequest], release: threading.Event
) -> Iterator[pb.CommitRequest]:
    """``msgs``, then hang until released."""
    yield from msgs
    release.wait(120)


def wait_for(what: str, cond: Callable[[], bool]) -> None:
    """Until ``cond()`` (a count the daemon reports); fails after a generous minute."""
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def code_of(f: grpc.Future) -> grpc.StatusCode:
    try:
        f.result(timeout=60)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def budget_full(stub: pb_grpc.KVStoreStub, seed: int) -> bool:
    """Whether a whole 2-block commit is refused for want of in-flight bytes now (if it
    is not, it is simply stored)."""
    keys = make_chain(BIG, 2, seed=seed)
    data = payloads(BIG, keys)

    def stream() -> Iterator[pb.CommitRequest]:
        yield pb.CommitRequest(
            open=pb.CommitOpen(ns=codec.ns_to_proto(BIG), keys=keys, indices=[0, 1])
        )
        for i, k in enumerate(keys):
            for c in codec.iter_chunks(i, BIG.fingerprint, k, memoryview(data[i])):
                yield pb.CommitRequest(chunk=c)

    try:
        stub.Commit(stream(), timeout=10)
        return False
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return True


def one_round(
    d: DaemonProcess, clock: FileClock, stub: pb_grpc.KVStoreStub, seed: int
) -> tuple[list[grpc.StatusCode], list[list[bytes]]]:
    release = threading.Event()
    chains = [make_chain(BIG, BLOCKS_PER_STREAM, seed=seed + i) for i in range(STREAMS)]
    msgs = [held_messages(k) for k in chains]
    read_before = stream_messages(d, "Commit")
    finished_before = finished_calls(d, "Commit")
    done = threading.Semaphore(0)
    futures = [stub.Commit.future(held_stream(m, release), timeout=120) for m in msgs]
    try:
        for f in futures:
            f.add_done_callback(lambda _: done.release())
        # Two streams fit the bound; the other eight are refused at once, not queued
        # behind them: they end while the daemon's clock stands still, so the two
        # admitted ones cannot have been cut yet.
        for _ in range(STREAMS - 2):
            assert done.acquire(timeout=60), [f.done() for f in futures]
        assert sum(not f.done() for f in futures) == 2
        # The daemon read the refused streams' opens and every message of the two held
        # ones; only then is the deadline passed on its clock, so the cut finds block 0
        # complete and block 1 half sent in each.
        want = read_before + (STREAMS - 2) + 2 * len(msgs[0])
        wait_for(
            "the daemon never read the held streams",
            lambda: stream_messages(d, "Commit") >= want,
        )
        assert stream_messages(d, "Commit") == want
        clock.advance(IDLE_S + 1)
        codes = [code_of(f) for f in futures]
        # A cut stream's client hears CANCELLED before the daemon has stored what it
        # kept: look only once the daemon has finished all ten calls.
        wait_for(
            "the daemon never finished the cut streams",
            lambda: finished_calls(d, "Commit") >= finished_before + STREAMS,
        )
        return codes, chains
    finally:
        release.set()


def test_many_held_commits_stay_within_the_bound(
    spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    clock = FileClock.create(tmp_path / "clock")
    d = spawn_daemon(
        "--max-inflight", str(INFLIGHT), "--stream-idle-timeout", f"{IDLE_S}s", "--no-shm",
        "--metrics-listen", "127.0.0.1:0", clock_file=clock.path,
    )
    cfg = ClientConfig(target=d.target, shm="off", default_timeout_s=20)
    with GrpcStore(cfg) as c, grpc.insecure_channel(d.target) as ch:
        c.register(BIG)
        warm = make_chain(BIG, 2, seed=1)
        assert c.commit(BIG, warm, payloads(BIG, warm)).inserted == 2
        baseline = rss(d)
        stub = pb_grpc.KVStoreStub(ch)
        after_round = []
        for r in range(4):
            codes, chains = one_round(d, clock, stub, seed=1000 * (r + 1))
            assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == STREAMS - 2, codes
            # The two admitted ones sat idle past the deadline and were cancelled by the
            # daemon; each kept exactly its one complete, verified block, never the
            # half-sent one; a refused stream kept nothing.
            assert codes.count(grpc.StatusCode.CANCELLED) == 2, codes
            kept = [c.lookup(BIG, k).hit_blocks for k in chains]
            assert kept == [int(code == grpc.StatusCode.CANCELLED) for code in codes]
            after_round.append(rss(d))
        # Memory bounds (a measurement of the allocator, so a bound is the behaviour):
        grew = rss(d, "VmHWM") - baseline
        assert grew < INFLIGHT + 48 * MiB, f"peak RSS grew by {grew / MiB:.0f} MiB"
        # No growth from round to round beyond the blocks kept in DRAM: the first rounds
        # warm the allocator's per-thread arenas (a CI run saw [386, 412, 418, 429] MiB:
        # round 2 still warming), so round 2 is the base. A leak of what the cancelled
        # streams announced (2 x 32 MiB per round) passes 24 MiB at once.
        stored = 2 * 2 * BIG.block_bytes  # rounds 3-4 kept two blocks each (asserted above)
        late = after_round[-1] - after_round[1] - stored
        assert late < 24 * MiB, [a // MiB for a in after_round]
        # The budget is free again: an ordinary commit goes through.
        keys = make_chain(BIG, 4, seed=2)
        assert c.commit(BIG, keys, payloads(BIG, keys)).inserted == 4


def test_an_overloaded_daemon_is_retried_within_the_deadline(
    spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    clock = FileClock.create(tmp_path / "clock")
    d = spawn_daemon(
        "--max-inflight", str(32 * MiB), "--stream-idle-timeout", f"{IDLE_S}s", "--no-shm",
        "--metrics-listen", "127.0.0.1:0", clock_file=clock.path,
    )
    cfg = ClientConfig(
        target=d.target,
        shm="off",
        default_timeout_s=60,
        retry_max_backoff_s=0.2,
        breaker=BreakerConfig(failure_threshold=1_000_000),
    )
    release = threading.Event()
    refused = {"method": "Commit", "code": "RESOURCE_EXHAUSTED"}
    with GrpcStore(cfg) as c, grpc.insecure_channel(d.target) as ch:
        c.register(BIG)
        msgs = held_messages(make_chain(BIG, BLOCKS_PER_STREAM, seed=3))
        read_before = stream_messages(d, "Commit")
        hog = pb_grpc.KVStoreStub(ch).Commit.future(held_stream(msgs, release), timeout=120)
        try:
            # Once the daemon has read all the hog sent, the hog holds the whole budget
            # until the daemon's clock passes the deadline: a probe is refused.
            want = read_before + len(msgs)
            wait_for("the daemon never read the hog", lambda: stream_messages(d, "Commit") >= want)
            assert budget_full(pb_grpc.KVStoreStub(ch), seed=5)
            refused_before = metric(d, "kvstore_rpc_errors_total", refused)
            keys = make_chain(BIG, 2, seed=4)
            result: list[int] = []
            commit = threading.Thread(
                target=lambda: result.append(c.commit(BIG, keys, payloads(BIG, keys)).inserted)
            )
            commit.start()
            # Refused while the hog holds the budget (seen by the daemon), retried until
            # the idle deadline cancels the hog: it then goes through within its deadline.
            wait_for(
                "the commit was never refused",
                lambda: metric(d, "kvstore_rpc_errors_total", refused) > refused_before,
            )
            assert not hog.done()
            clock.advance(IDLE_S + 1)
            commit.join(timeout=120)
            assert result == [2]
            assert code_of(hog) == grpc.StatusCode.CANCELLED
        finally:
            release.set()
