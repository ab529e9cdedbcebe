"""The I/O backends against real files: batches deeper than the queue, O_DIRECT
alignment, per-request errors as return values, short transfers."""

from __future__ import annotations

import errno
import mmap
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from storage_nodes.ssd import SSDConfigError
from storage_nodes.ssd.backends import BACKENDS, make_backend, register_backend, uring_available
from storage_nodes.ssd.io_backend import IORequest
from tests.conftest import REPO
from tests.io_backends import skip_without_uring
from tests.storage_nodes.ssd.helpers import LazyBatch, direct_fd


def test_batch_roundtrip_deeper_than_queue(tmp_path: Path, any_backend) -> None:
    n, sz = 50, 8192
    fd = direct_fd(tmp_path / "f", n * sz)
    try:
        wbuf, rbuf = mmap.mmap(-1, n * sz), mmap.mmap(-1, n * sz)
        rng = random.Random(1)
        wbuf[:] = rng.randbytes(n * sz)
        order = list(range(n))
        rng.shuffle(order)
        w, r = memoryview(wbuf), memoryview(rbuf)
        res = any_backend.write_batch(
            [IORequest(fd, i * sz, w[i * sz : (i + 1) * sz]) for i in order]
        )
        assert res == [sz] * n
        assert any_backend.sync([fd]) == [0]
        res = any_backend.read_batch(
            [IORequest(fd, i * sz, r[i * sz : (i + 1) * sz]) for i in order]
        )
        assert res == [sz] * n
        assert rbuf[:] == wbuf[:]
    finally:
        os.close(fd)


def test_lazy_read_batch(tmp_path: Path, any_backend) -> None:
    n, sz = 40, 8192
    fd = direct_fd(tmp_path / "f", n * sz)
    try:
        wbuf, rbuf = mmap.mmap(-1, n * sz), mmap.mmap(-1, n * sz)
        wbuf[:] = random.Random(4).randbytes(n * sz)
        w, r = memoryview(wbuf), memoryview(rbuf)
        assert any_backend.write_batch(
            [IORequest(fd, i * sz, w[i * sz : (i + 1) * sz]) for i in range(n)]
        ) == [sz] * n
        lazy = LazyBatch([IORequest(fd, i * sz, r[i * sz : (i + 1) * sz]) for i in range(n)])
        seen: list[tuple[int, int]] = []
        assert any_backend.read_batch(lazy, lambda i, res: seen.append((i, res))) == [sz] * n
        assert sorted(seen) == [(i, sz) for i in range(n)]
        assert rbuf[:] == wbuf[:]
        assert min(lazy.asked) >= 1
    finally:
        os.close(fd)


def test_errors_are_values(tmp_path: Path, any_backend) -> None:
    buf = memoryview(mmap.mmap(-1, 4096))
    assert any_backend.read_batch([IORequest(987654, 0, buf)]) == [-errno.EBADF]
    assert any_backend.read_batch([]) == []


def test_eof_inside_request_is_eio(tmp_path: Path, any_backend) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"x" * 6000)  # buffered: a short read, then EOF
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = memoryview(mmap.mmap(-1, 8192))
        assert any_backend.read_batch([IORequest(fd, 0, buf)]) == [-errno.EIO]
    finally:
        os.close(fd)


def test_registry() -> None:
    # tests/conftest.py imported the harness, which registered its two wrappers
    assert {"auto", "uring", "pread", "crashsim", "faulty"} <= set(BACKENDS)
    with pytest.raises(SSDConfigError):
        make_backend("nope", 4)
    auto = make_backend("auto", 4)
    assert auto.name == ("uring" if uring_available() else "pread")
    auto.close()


def test_product_registry_holds_only_real_backends() -> None:
    """Without the test harness imported, the test-only names do not exist."""
    code = "from storage_nodes.ssd.backends import BACKENDS; print(' '.join(sorted(BACKENDS)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=REPO
    ).stdout.split()
    assert out == ["auto", "pread", "uring"]


def test_a_backend_name_is_registered_once() -> None:
    register_backend("faulty", BACKENDS["faulty"])  # the same factory again: a no-op
    with pytest.raises(SSDConfigError, match="already registered"):
        register_backend("faulty", BACKENDS["pread"])


def test_uring_reads_go_in_as_built_and_the_held_back_ones_before_any_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A get's reads reach the kernel in chunks as their requests are built (the device
    starts before the whole batch is prepared): the first keys' reads go in before the
    rest of the keys are looked up, and the rest's reads join the same batch; all but the
    held-back eighth are in flight before the first wait for a completion, the held-back
    ones are prepared before that wait too and handed over right after it, before the
    first landed read is checked (a device that completes a whole queue at once then
    reads them while the CPU checks)."""
    skip_without_uring()
    from storage_nodes.ssd import SSDTier, blockio, lookup, slot_reads, tier, uring
    from tests.storage_nodes.ssd.helpers import chain, make_config, rows, small_ns

    log: list[str] = []
    real_req, real_submit, real_wait = slot_reads.IORequest, uring._submit, uring._wait_cqes
    real_check, real_rest = blockio.check_header_fields, lookup.PrefixLookup.rest
    me = threading.get_ident()  # only this thread's events: the tier has its syncer

    def logged(event: str, real):  # type: ignore[no-untyped-def]
        def call(*a: object, **k: object) -> object:
            if threading.get_ident() == me:
                log.append(event)
            return real(*a, **k)

        return call

    ns = small_ns()
    n = 24
    t = SSDTier(make_config(tmp_path / "ssd", io_backend="uring", queue_depth=32))
    t.register(ns)
    keys = chain(ns, n)
    data = rows(ns, keys)
    t.put(ns, keys, data)
    assert t.sync()  # the data syncer's submissions are over
    monkeypatch.setattr(slot_reads, "IORequest", logged("built", real_req))
    monkeypatch.setattr(lookup.PrefixLookup, "rest", logged("rest", real_rest))
    monkeypatch.setattr(blockio, "check_header_fields", logged("check", real_check))
    monkeypatch.setattr(uring, "_submit", logged("submit", real_submit))
    monkeypatch.setattr(uring, "_wait_cqes", logged("wait", real_wait))
    out = bytearray(n * ns.block_bytes)
    assert t.get_into(ns, keys, out) == n
    assert out == bytes(data)
    t.close()
    held = uring.held_back_reads(n)
    assert held == 3
    assert log.count("built") == n  # each request built once
    assert log.count("check") == n
    first_submit, first_wait = log.index("submit"), log.index("wait")
    assert log[:first_submit].count("built") == uring._SUBMIT_EVERY == tier._FIRST_LOOKUPS
    assert log.index("rest") == first_submit + 1 and log.count("rest") == 1
    assert first_submit < log.index("built", first_submit)  # before the last build
    before_wait = log[:first_wait]
    assert before_wait.count("built") == n  # the held-back ones prepared too ...
    last_submit_before_wait = len(before_wait) - 1 - before_wait[::-1].index("submit")
    assert log[last_submit_before_wait:first_wait].count("built") == held  # ... not handed over
    assert log[first_wait + 1] == "submit"  # ... until the first completions arrived
    assert log.index("check") > first_wait + 1
    assert log.count("submit") == log[: first_wait + 2].count("submit")  # no later submits


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 17, 40])
def test_uring_checked_reads_with_held_back_tail(tmp_path: Path, n: int) -> None:
    """Every read of a checked batch lands once and is handed to ``on_done`` once, with
    its data, whether its tail is held back or not, and with the queue shallower than the
    batch (queue depth 8: the held-back reads then wait for room like any other)."""
    skip_without_uring()
    from storage_nodes.ssd import uring

    sz = 8192
    backend = make_backend("uring", queue_depth=8)
    fd = direct_fd(tmp_path / "f", n * sz)
    try:
        wbuf, rbuf = mmap.mmap(-1, n * sz), mmap.mmap(-1, n * sz)
        wbuf[:] = random.Random(n).randbytes(n * sz)
        w, r = memoryview(wbuf), memoryview(rbuf)
        assert backend.write_batch(
            [IORequest(fd, i * sz, w[i * sz : (i + 1) * sz]) for i in range(n)]
        ) == [sz] * n
        reqs = [IORequest(fd, i * sz, r[i * sz : (i + 1) * sz]) for i in range(n)]
        bad = n - 1  # the last read, held back whenever any is, fails
        reqs[bad] = IORequest(987654, 0, r[bad * sz : (bad + 1) * sz])
        seen: dict[int, tuple[int, bytes]] = {}

        def landed(i: int, res: int) -> None:
            assert i not in seen
            seen[i] = (res, bytes(r[i * sz : (i + 1) * sz]) if res > 0 else b"")

        res = backend.read_batch(reqs, landed)
        assert res == [sz] * (n - 1) + [-errno.EBADF]
        assert sorted(seen) == list(range(n))
        for i in range(n - 1):
            assert seen[i] == (sz, wbuf[i * sz : (i + 1) * sz])
        assert seen[bad] == (-errno.EBADF, b"")
        assert uring.held_back_reads(n) == n // 8
    finally:
        os.close(fd)
        backend.close()


def test_uring_syncs_each_file_once_its_own_writes_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put touching k slab files syncs each one as soon as every write to that file
    has completed — not behind a drain of the whole batch, which made it k device
    flushes in a row after the last write — and never before its own writes completed."""
    skip_without_uring()
    import liburing as lu

    from storage_nodes.ssd import uring

    log: list[tuple[str, int]] = []
    real_iter, real_prep_fsync = uring.lu.CqeIter, uring.lu.io_uring_prep_fsync

    def cqe_iter(ring: object, cqe: lu.Cqe):  # type: ignore[no-untyped-def]
        for x in real_iter(ring, cqe):
            log.append(("done", cqe[0].user_data))
            yield x

    def prep_fsync(sqe: object, fd: int, flags: int) -> None:
        log.append(("sync", fd))
        real_prep_fsync(sqe, fd, flags)

    drained: list[int] = []
    real_flags = uring.lu.io_uring_sqe_set_flags

    def set_flags(sqe: object, f: int) -> None:
        drained.append(f)
        real_flags(sqe, f)

    monkeypatch.setattr(uring.lu, "CqeIter", cqe_iter)
    monkeypatch.setattr(uring.lu, "io_uring_prep_fsync", prep_fsync)
    monkeypatch.setattr(uring.lu, "io_uring_sqe_set_flags", set_flags)
    b = make_backend("uring", 8)
    sz = 8192
    fds = [direct_fd(tmp_path / f"f{i}", 8 * sz) for i in range(3)]
    idle = direct_fd(tmp_path / "idle", sz)  # synced, written by no request
    try:
        buf = mmap.mmap(-1, 20 * sz)
        buf[:] = random.Random(2).randbytes(20 * sz)
        w = memoryview(buf)
        # file 0 gets 2 writes, file 1 gets 6, file 2 gets 12, shuffled
        which = [0] * 2 + [1] * 6 + [2] * 12
        random.Random(3).shuffle(which)
        at = [0, 0, 0]
        reqs = []
        for i, f in enumerate(which):
            reqs.append(IORequest(fds[f], at[f] * sz, w[i * sz : (i + 1) * sz]))
            at[f] += 1
        res, synced = b.write_and_sync(reqs, [*fds, idle])
        assert res == [sz] * 20 and synced == [0, 0, 0, 0]
        assert drained == []  # no drain: before, every sync was a drained SQE
        syncs = [fd for kind, fd in log if kind == "sync"]
        assert sorted(syncs) == sorted([*fds, idle])
        for fd in fds:
            own = {i for i, r in enumerate(reqs) if r.fd == fd}
            before = {u for kind, u in log[: log.index(("sync", fd))] if kind == "done"}
            assert own <= before, f"fd {fd} synced before its writes completed"
        r = mmap.mmap(-1, sz)
        for i, q in enumerate(reqs):
            assert b.read_batch([IORequest(q.fd, q.offset, memoryview(r))]) == [sz]
            assert r[:] == buf[i * sz : (i + 1) * sz]
    finally:
        for fd in [*fds, idle]:
            os.close(fd)
        b.close()


def test_refused_direct_io_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This kernel's tmpfs accepts O_DIRECT, so the refusal is simulated at the probe;
    what is checked is the fallback and how stats() reports it."""
    import storage_nodes.ssd.slabs as slabs
    from storage_nodes.ssd import SSDTier
    from tests.storage_nodes.ssd.helpers import chain, make_config, rows, small_ns, verify_all

    monkeypatch.setattr(slabs, "probe_io", lambda d: slabs.IOProbe(direct=False, room=True))
    ns = small_ns()
    t = SSDTier(make_config(tmp_path / "ssd"))
    t.register(ns)
    k = chain(ns, 5)
    t.put(ns, k, rows(ns, k))
    info = t.stats().info
    assert info["direct_io"] == "off" and "refused" in info["durability"]
    assert verify_all(t, ns) == 5
    t.close()
    with pytest.raises(SSDConfigError, match="O_DIRECT"):
        SSDTier(make_config(tmp_path / "ssd", direct_io=True))


def test_uring_pins_a_bounded_set_of_buffers(tmp_path: Path) -> None:
    skip_without_uring()
    # liburing's Iovec never releases the buffers it is given; the backend must reuse one
    # per region, so steady-state I/O over reused staging memory pins nothing new.
    from storage_nodes.ssd import uring_iovecs

    backend = make_backend("uring", queue_depth=8)
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, 1 << 20)
    staging = mmap.mmap(-1, 1 << 20)
    mv = memoryview(staging)

    def one_round() -> None:
        reqs = [IORequest(fd, j * 4096, mv[j * 4096 : (j + 1) * 4096]) for j in range(16)]
        assert backend.write_batch(reqs) == [4096] * 16
        assert backend.read_batch(reqs) == [4096] * 16

    one_round()
    pinned = len(uring_iovecs.IOVECS)
    for _ in range(50):
        one_round()
    assert len(uring_iovecs.IOVECS) == pinned
    os.close(fd)
    backend.close()


def test_broken_liburing_is_an_error_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing or broken binding is a broken install: it must fail loudly, not turn
    every io_uring test into a skip and the engine into pread without a word."""
    import sys

    from storage_nodes.ssd import backends

    monkeypatch.setitem(sys.modules, "liburing", None)  # import liburing -> ImportError
    monkeypatch.delitem(sys.modules, "storage_nodes.ssd.uring", raising=False)
    with pytest.raises(ImportError):
        backends.uring_available()
    with pytest.raises(ImportError):
        make_backend("auto", 4)


def test_required_uring_turns_the_skip_into_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests import io_backends

    monkeypatch.setattr(io_backends, "uring_available", lambda: False)
    monkeypatch.delenv(io_backends.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception):
        io_backends.skip_without_uring()
    assert io_backends.backends_here() == ["pread"]
    assert "pread only" in io_backends.report_header()
    monkeypatch.setenv(io_backends.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="KVSTORE_REQUIRE_URING=1"):
        io_backends.skip_without_uring()
    assert io_backends.backends_here() == ["uring", "pread"]  # uring cases run and fail
    assert "skips are failures" in io_backends.report_header()


def test_writes_added_by_between_join_the_batch(tmp_path: Path, any_backend) -> None:
    """``between`` may hand back further writes (a put's slots reserved while its first
    writes are in flight): every backend prepares and performs them as requests after the
    batch's own, reports them after the others, and runs ``between`` again once they are
    submitted (a put then fills its publishing transaction), until it adds nothing."""
    first, more, sz = 5, 11, 8192
    n = first + more
    fd = direct_fd(tmp_path / "f", n * sz)
    try:
        wbuf, rbuf = mmap.mmap(-1, n * sz), mmap.mmap(-1, n * sz)
        w, r = memoryview(wbuf), memoryview(rbuf)
        src = random.Random(3).randbytes(n * sz)
        prepared: list[int] = []
        calls: list[int] = []

        def prepare(i: int) -> None:  # fills request i's buffer just before it goes in
            prepared.append(i)
            w[i * sz : (i + 1) * sz] = src[i * sz : (i + 1) * sz]

        def req(i: int) -> IORequest:
            return IORequest(fd, i * sz, w[i * sz : (i + 1) * sz])

        def between() -> list[IORequest]:
            calls.append(len(prepared))
            return [req(i) for i in range(first, n)] if len(calls) == 1 else []

        res, synced = any_backend.write_and_sync(
            [req(i) for i in range(first)], [], prepare=prepare, between=between
        )
        assert (res, synced) == ([sz] * n, [])
        assert calls == [first, n]  # after the batch's own writes, then after the added
        assert sorted(prepared) == list(range(n))
        assert any_backend.read_batch([IORequest(fd, 0, r)]) == [n * sz]
        assert rbuf[:] == src
    finally:
        os.close(fd)


def test_writes_added_to_a_synced_batch_are_refused(tmp_path: Path, any_backend) -> None:
    """Their files would not be synced with the batch: refused, after the batch's own
    writes completed (nothing left in flight)."""
    sz = 4096
    fd = direct_fd(tmp_path / "f", 4 * sz)
    buf = memoryview(mmap.mmap(-1, 4 * sz))
    try:
        reqs = [IORequest(fd, i * sz, buf[i * sz : (i + 1) * sz]) for i in range(2)]
        with pytest.raises(ValueError, match="not be synced"):
            any_backend.write_and_sync(reqs, [fd], between=lambda: [reqs[0]])
        assert any_backend.write_batch(reqs) == [sz, sz]  # the backend still works
    finally:
        os.close(fd)
