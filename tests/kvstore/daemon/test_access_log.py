"""The Parquet access log (DESIGN §8): schema, rotation, crash safety."""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.accesslog.schema import ACCESS_LOG_SCHEMA
from kvstore.accesslog.writer import (
    AccessLogConfig,
    LookupRecord,
    NullAccessLog,
    ParquetAccessLog,
    make_access_log,
)
from kvstore.errors import InvalidArgument
from tests.conftest import small_ns
from tests.kvstore.daemon.conftest import SpawnDaemon, make_chain, payloads

NS = small_ns(tenant="t1")


def record(i: int, keys: list[bytes]) -> LookupRecord:
    return LookupRecord(
        ts_us=1_000_000 + i,
        tenant="t1",
        namespace=NS.fingerprint,
        block_tokens=NS.block_tokens,
        prompt_tokens=i,
        keys=keys,
        hit_blocks=i % 3,
        hit_hbm=0,
        hit_dram=i % 3,
        hit_ssd=0,
    )


def wait_until(cond, what: str, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def test_rows_round_trip_through_rotated_files(tmp_path: Path) -> None:
    now = [1000.0]
    log = ParquetAccessLog(AccessLogConfig(dir=str(tmp_path), rotate_s=30, flush_s=0.02),
                           clock=lambda: now[0])
    keys = make_chain(NS, 4, seed=1)
    for i in range(10):
        log.record(record(i, keys[: 1 + i % 4]))
    wait_until(lambda: log.rows_written == 10, "the first ten rows written")
    assert log.files_closed == 0  # 30 s have not passed on the log's clock
    now[0] += 30  # the open file's age reaches rotate_s: the writer closes it
    wait_until(lambda: log.files_closed == 1, "the first file rotated")
    for i in range(10, 20):
        log.record(record(i, keys))
    log.check_integrity()
    log.close()
    files = sorted(glob.glob(str(tmp_path / "*.parquet")))
    assert len(files) == 2 and not glob.glob(str(tmp_path / "*.open"))
    per_file = []
    for f in files:
        t = pq.read_table(f)
        assert t.schema.equals(ACCESS_LOG_SCHEMA)
        per_file.append(t.to_pylist())
    assert [[r["prompt_tokens"] for r in rows] for rows in per_file] == [
        list(range(10)), list(range(10, 20))
    ]
    rows = per_file[0] + per_file[1]
    assert rows[5]["keys"] == keys[:2] and rows[15]["keys"] == keys
    assert rows[4]["namespace"] == NS.fingerprint and rows[4]["hit_dram"] == 1
    assert (log.rows_written, log.rows_dropped, log.files_closed) == (20, 0, 2)


def test_config_bounds_and_null_log(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument):
        AccessLogConfig(dir=str(tmp_path), rotate_s=61)
    null = make_access_log(None)
    assert isinstance(null, NullAccessLog)
    null.record(record(0, []))
    null.close()


def test_daemon_log_survives_kill_9(spawn_daemon: SpawnDaemon, tmp_path: Path) -> None:
    logdir = tmp_path / "log"
    d = spawn_daemon("--access-log", str(logdir), "--access-log-rotate", "1s")
    keys = make_chain(NS, 6, seed=2)
    with GrpcStore(ClientConfig(target=d.target, shm="off")) as c:
        c.register(NS)
        c.commit(NS, keys, payloads(NS, keys, idx=[0, 1, 2]))
        for i in range(30):
            c.lookup(NS, keys, prompt_tokens=6 * NS.block_tokens + i)

        def closed_rows() -> list[dict]:  # type: ignore[type-arg]
            done = sorted(glob.glob(str(logdir / "*.parquet")))
            return [r for f in done for r in pq.read_table(f).to_pylist()]

        wait_until(lambda: len(closed_rows()) == 30, "the 30 lookups in closed files")
        # This one is written at the writer's next tick into a new file, which is closed
        # a rotation (1 s) later: the kill comes first, so it is lost with that file.
        c.lookup(NS, keys, prompt_tokens=1)
    d.kill()  # kill -9: no chance to close anything
    done = sorted(glob.glob(str(logdir / "*.parquet")))
    rows = closed_rows()
    for r in rows:
        assert r["tenant"] == "t1" and r["namespace"] == NS.fingerprint
        assert r["keys"] == keys and r["hit_blocks"] == 3 and r["hit_dram"] == 3
        assert r["block_tokens"] == NS.block_tokens
    assert [r["prompt_tokens"] for r in rows] == [6 * NS.block_tokens + i for i in range(30)]
    # Whatever is left open is the only casualty, and readers can tell it apart by name.
    leftovers = set(os.listdir(logdir)) - {os.path.basename(f) for f in done}
    assert all(name.endswith(".parquet.open") for name in leftovers)


def test_a_row_that_cannot_be_encoded_never_stops_the_writer(tmp_path: Path) -> None:
    # Issue 14 (item 12): prompt_tokens = 2**63 killed the writer thread, so one tenant
    # could stop the access log for everyone.
    log = ParquetAccessLog(AccessLogConfig(dir=str(tmp_path), rotate_s=0.3, flush_s=0.05))
    keys = make_chain(NS, 2, seed=5)
    log.record(record(1 << 63, keys))
    # Until the writer has dropped that row, a second one could join its batch (and be
    # dropped with it): wait for the drop, not for a time a loaded machine may outlast.
    deadline = time.monotonic() + 30
    while log.rows_dropped == 0 and log._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.rows_dropped == 1 and log._thread.is_alive()
    log.record(record(7, keys))
    log.close()
    rows = [r for f in glob.glob(str(tmp_path / "*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert [r["prompt_tokens"] for r in rows] == [7]
    assert (log.rows_written, log.rows_dropped) == (1, 1)


def test_the_daemon_refuses_prompt_tokens_past_int64(
    spawn_daemon: SpawnDaemon, tmp_path: Path
) -> None:
    import grpc

    from kvstore.wire.codec import ns_to_proto
    from kvstore.wire.proto import kvstore_pb2 as pb
    from kvstore.wire.proto import kvstore_pb2_grpc as pb_grpc

    logdir = tmp_path / "log"
    d = spawn_daemon("--access-log", str(logdir), "--access-log-rotate", "1s")
    keys = make_chain(NS, 2, seed=6)
    with grpc.insecure_channel(d.target) as ch, GrpcStore(ClientConfig(target=d.target)) as c:
        c.register(NS)
        stub = pb_grpc.KVStoreStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.Lookup(pb.LookupRequest(ns=ns_to_proto(NS), keys=keys, prompt_tokens=1 << 63))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(InvalidArgument):  # the client refuses it before sending
            c.lookup(NS, keys, prompt_tokens=1 << 63)
        c.lookup(NS, keys, prompt_tokens=123)
    assert d.stop() == 0
    rows = [r for f in glob.glob(str(logdir / "*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert [r["prompt_tokens"] for r in rows] == [123]
