"""``GrpcStore`` against real daemons: every RPC on both paths, zero-copy buffers,
concurrency, deadlines, the circuit breaker and reconnection."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from clients.breaker import BreakerConfig, CircuitBreaker
from clients.config import ClientConfig, config_from_url, parse_store_url
from clients.errors import CircuitOpen
from clients.messages import GetReader
from clients.sync_client import GrpcStore
from kvstore.errors import BufferSizeError, InvalidArgument, StoreUnavailable, UnknownNamespace
from kvstore.testing.daemon_process import DaemonProcess
from kvstore.wire import codec
from kvstore.wire.proto import kvstore_pb2 as pb
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads

NS = small_ns(model_id="sync-client")
BIG = small_ns(model_id="sync-big", kv_heads=1, head_dim=16384)  # 2 MiB blocks: 3 chunks each


@pytest.fixture(params=["off", "auto"])
def store(request: pytest.FixtureRequest, shared_daemon: DaemonProcess):  # type: ignore[no-untyped-def]
    with GrpcStore(ClientConfig(target=shared_daemon.target, shm=request.param)) as s:
        assert s.uses_shm == (request.param == "auto")
        s.register(NS)
        yield s


def test_every_rpc(store: GrpcStore) -> None:
    # A namespace of its own, so that deleting it counts only this test's blocks.
    ns = small_ns(model_id=f"sync-every-rpc-{store.uses_shm}")
    store.register(ns)
    before = store.stats()
    keys = make_chain(ns, 5, seed=hash(store.uses_shm) % 1000)
    res = store.commit(ns, keys, payloads(ns, keys, idx=[0, 1, 2, 4]))
    assert (res.inserted, res.present, res.dropped, res.durability) == (4, 0, 0, "dram")
    look = store.lookup(ns, keys, prompt_tokens=5 * ns.block_tokens)
    assert look.hit_blocks == 3 and look.tiers == ("dram",) * 3
    dst = np.zeros(5 * ns.block_bytes, np.uint8)
    assert store.get_into(ns, keys, dst) == 3
    assert dst[: 3 * ns.block_bytes].tobytes() == b"".join(
        payloads(ns, keys, idx=[0, 1, 2]).values()
    )
    tensor = torch.empty((2, *ns.payload_shape), dtype=torch.float16)
    assert store.get_into(ns, keys[:2], tensor) == 2
    assert tensor.view(torch.uint8).numpy().tobytes() == b"".join(
        payloads(ns, keys, idx=[0, 1]).values()
    )
    assert store.commit(ns, keys, payloads(ns, keys, idx=[3]), durability="ssd").inserted == 1
    assert store.prefetch(ns, keys).result(timeout=10) == 5
    store.flush()
    st = store.stats()
    # Deltas: the module's daemon is shared, and holds (and counts) what the other tests
    # and the other path's run stored too. Its 32 MiB of DRAM holds all that the module
    # stores (about 13 MiB), so none of these blocks can have been evicted.
    assert st.tiers[0].name == "dram"
    assert st.tiers[0].used_bytes - before.tiers[0].used_bytes == 5 * ns.block_bytes
    assert st.counters["commits_total"] - before.counters["commits_total"] == 2
    assert store.delete_namespace(ns) == 5
    assert store.lookup(ns, keys).hit_blocks == 0


def test_misuse_is_value_error_before_any_rpc(store: GrpcStore) -> None:
    keys = make_chain(NS, 2, seed=3)
    with pytest.raises(BufferSizeError):
        store.get_into(NS, keys, bytearray(NS.block_bytes))
    with pytest.raises(InvalidArgument):
        store.commit(NS, keys, {5: bytes(NS.block_bytes)})
    with pytest.raises(InvalidArgument):
        store.commit(NS, keys, {0: b"short"})
    with pytest.raises(InvalidArgument):
        store.commit(NS, keys, {0: bytes(NS.block_bytes)}, durability="tape")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        store.lookup(NS, [b"short"])
    with pytest.raises(UnknownNamespace):
        store.lookup(small_ns(model_id="never"), keys)
    with pytest.raises(ValueError):
        store.get_into(NS, keys, bytes(2 * NS.block_bytes))  # read-only destination


def test_multi_chunk_blocks(store: GrpcStore) -> None:
    store.register(BIG)
    # One chain per path (the daemon is shared), so both must insert all three blocks.
    keys = make_chain(BIG, 3, seed=40 + store.uses_shm)
    data = {
        i: np.random.default_rng(i).integers(0, 256, BIG.block_bytes, dtype=np.uint8)
        for i in range(3)
    }
    res = store.commit(BIG, keys, data)
    assert (res.inserted, res.present, res.dropped) == (3, 0, 0)
    dst = np.empty(3 * BIG.block_bytes, np.uint8)
    assert store.get_into(BIG, keys, dst) == 3
    assert all(
        np.array_equal(dst[i * BIG.block_bytes : (i + 1) * BIG.block_bytes], data[i])
        for i in range(3)
    )


def test_zero_copy_staging_buffers(shared_daemon: DaemonProcess) -> None:
    with GrpcStore(ClientConfig(target=shared_daemon.target)) as s:
        s.register(NS)
        keys = make_chain(NS, 4, seed=5)
        got = s.staging_buffer(4 * NS.block_bytes)
        assert got is not None
        off, buf = got
        buf[:] = np.frombuffer(b"".join(payloads(NS, keys).values()), np.uint8)
        rows = {i: buf[i * NS.block_bytes : (i + 1) * NS.block_bytes] for i in range(4)}
        assert s.commit(NS, keys, rows).inserted == 4  # straight from the segment
        buf[:] = 0
        assert s.get_into(NS, keys, buf) == 4  # the daemon writes into it directly
        assert buf.tobytes() == b"".join(payloads(NS, keys).values())
        del rows, buf
        s.release_buffer(off)


def test_one_client_many_threads(store: GrpcStore) -> None:
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for r in range(5):
                keys = make_chain(NS, 3, seed=1000 + 10 * t + r)
                store.commit(NS, keys, payloads(NS, keys))
                dst = bytearray(3 * NS.block_bytes)
                assert store.get_into(NS, keys, dst) == 3
                assert bytes(dst) == b"".join(payloads(NS, keys).values())
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:2]


class Clock:
    """The breaker's clock, moved by the test: the cool-down never ends on its own, so a
    slow machine cannot turn "open" into "half_open" between two lines."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_dead_daemon_trips_the_breaker_and_recovery(spawn_daemon: SpawnDaemon) -> None:
    d = spawn_daemon()
    port = d.port
    cfg = ClientConfig(
        target=d.target,
        default_timeout_s=1,
        breaker=BreakerConfig(failure_threshold=1, cooldown_s=5),
    )
    clock = Clock()
    with GrpcStore(cfg) as s:
        s.core.breaker = CircuitBreaker(cfg.breaker, clock)
        s.register(NS)
        d.kill()  # kill -9
        with pytest.raises(StoreUnavailable) as first:
            s.lookup(NS, make_chain(NS, 1, seed=6))
        # The call's own failure opened the breaker: it reports that failure, not the breaker.
        assert not isinstance(first.value, CircuitOpen)
        assert s.breaker.state == "open" and s.breaker.opened_total == 1
        with pytest.raises(CircuitOpen):
            s.lookup(NS, make_chain(NS, 1, seed=6))
        f = s.prefetch(NS, make_chain(NS, 1, seed=6))
        with pytest.raises(CircuitOpen):
            f.result(timeout=5)
        # A new daemon on the same port: the same client reconnects once the breaker lets
        # it, each cool-down letting one trial call through.
        spawn_daemon("--listen", f"127.0.0.1:{port}")
        for _ in range(100):
            clock.t += cfg.breaker.cooldown_s
            assert s.breaker.state == "half_open"
            try:
                s.register(NS, timeout_s=2)
                break
            except StoreUnavailable:
                threading.Event().wait(0.1)
        assert s.breaker.state == "closed"
        assert s.lookup(NS, make_chain(NS, 1, seed=6)).hit_blocks == 0


def test_deadline_is_respected(store: GrpcStore) -> None:
    with pytest.raises(StoreUnavailable):
        store.flush(timeout_s=1e-6)
    store.close()
    with pytest.raises(StoreUnavailable):
        store.lookup(NS, [])
    assert store.prefetch(NS, []).exception(timeout=1) is not None


def test_corrupt_stream_is_a_miss_from_the_bad_block() -> None:
    keys = make_chain(NS, 3, seed=7)
    rows = memoryview(bytearray(3 * NS.block_bytes))
    reader = GetReader(NS, keys, rows)
    data = payloads(NS, keys)
    chunks = [
        c
        for i in range(3)
        for c in codec.iter_chunks(i, NS.fingerprint, keys[i], memoryview(data[i]))
    ]
    chunks[1] = pb.BlockChunk(
        block_index=1, offset=0, data=chunks[1].data[:-1] + b"\xff", last=True
    )
    fed = [reader.feed(pb.GetResponse(chunk=c)) for c in chunks]
    assert fed == [True, False, False]
    reader.feed(pb.GetResponse(done=pb.GetDone(hit_blocks=3)))
    assert reader.hit == 1 and reader.corrupt_blocks == 1


def test_urls_and_tokens(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert parse_store_url("grpc://127.0.0.1:7420") == ("127.0.0.1:7420", False)
    assert parse_store_url("grpcs://h:1/") == ("h:1", True)
    for bad in ("http://h:1", "grpc://h", "grpc://:1", "grpc://h:0", "grpc://h:x"):
        with pytest.raises(InvalidArgument):
            parse_store_url(bad)
    f = tmp_path / "tok"
    f.write_text("# c\n\nsecret-token-123456 alice\n")
    assert config_from_url("grpc://h:1", token_file=str(f)).metadata() == (
        ("authorization", "Bearer secret-token-123456"),
    )
    monkeypatch.setenv("KVSTORE_AUTH_TOKEN", "from-env")
    assert config_from_url("grpc://h:1").auth_token == "from-env"
    f.write_text("# nothing\n")
    with pytest.raises(InvalidArgument):
        config_from_url("grpc://h:1", token_file=str(f))
