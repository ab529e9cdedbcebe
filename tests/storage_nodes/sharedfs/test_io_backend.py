"""The I/O backend contract's hooks (``prepare`` before a write, ``on_done`` after a read)
on the POSIX backends (threads, and io_uring where the kernel allows it), on a local
directory, with and without O_DIRECT where it runs."""

from __future__ import annotations

import contextlib
import errno
import os
import threading

import pytest

from storage_nodes.sharedfs.backends import make_backend
from storage_nodes.sharedfs.io_backend import IORequest, probe_direct_io, probe_user_memory
from storage_nodes.ssd.backends import uring_available
from tests.io_backends import skip_without_uring, uring_required

SLOT = 8 << 10
N = 24
BACKENDS = ["posix", "uring"] if uring_available() or uring_required() else ["posix"]


def _backend(name: str, root, qd: int, direct: bool | None):  # type: ignore[no-untyped-def]
    if name == "uring":
        skip_without_uring()
    return make_backend(name, root, qd, direct)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("direct", [False, True])
def test_prepare_fills_each_slot_before_it_is_written_and_on_done_sees_it_landed(
        tmp_path, direct, name) -> None:
    if direct and not probe_direct_io(tmp_path):
        pytest.skip(f"O_DIRECT is refused under {tmp_path}")
    io = _backend(name, tmp_path, 8, direct)
    path = tmp_path / "seg"
    fd = io.open(path, write=True, create=True)
    os.ftruncate(fd, N * SLOT)
    buf = io.alloc(N * SLOT)
    try:
        wreqs = [IORequest(fd, i * SLOT, buf[i * SLOT : (i + 1) * SLOT]) for i in range(N)]
        prepared: list[int] = []
        lock = threading.Lock()

        def prepare(i: int) -> None:
            buf[i * SLOT : (i + 1) * SLOT] = bytes([i + 1]) * SLOT
            with lock:
                prepared.append(i)

        assert io.write_batch(wreqs, prepare) == [SLOT] * N
        assert sorted(prepared) == list(range(N))
        assert io.sync([fd]) == [0]
        with open(path, "rb") as f:
            disk = f.read()
        assert all(disk[i * SLOT : (i + 1) * SLOT] == bytes([i + 1]) * SLOT for i in range(N))

        buf[:] = bytes(N * SLOT)
        rreqs = [IORequest(fd, i * SLOT, buf[i * SLOT : (i + 1) * SLOT]) for i in range(N)]
        rreqs.append(IORequest(fd, N * SLOT, buf[:SLOT]))  # past the end: EOF is -EIO
        seen: dict[int, tuple[int, bool]] = {}

        def on_done(i: int, res: int) -> None:
            landed = i < N and bytes(buf[i * SLOT : (i + 1) * SLOT]) == bytes([i + 1]) * SLOT
            with lock:
                assert i not in seen
                seen[i] = (res, landed)

        out = io.read_batch(rreqs, on_done)
        assert out == [SLOT] * N + [-errno.EIO]
        assert seen == {**{i: (SLOT, True) for i in range(N)}, N: (-errno.EIO, False)}
        if name == "uring":  # on the ring, not on the threads it falls back to
            assert io._ring.submissions >= 2
    finally:
        io.free(buf)
        io.close_fd(fd)
        io.close()


@pytest.mark.parametrize("name", BACKENDS)
def test_a_hook_that_raises_is_not_swallowed(tmp_path, name) -> None:
    io = _backend(name, tmp_path, 4, False)
    fd = io.open(tmp_path / "seg", write=True, create=True)
    buf = io.alloc(4 * SLOT)
    try:
        reqs = [IORequest(fd, i * SLOT, buf[i * SLOT : (i + 1) * SLOT]) for i in range(4)]

        def boom(i: int, *_: int) -> None:
            if i == 2:
                raise RuntimeError("hook failed")

        with pytest.raises(RuntimeError, match="hook failed"):
            io.write_batch(reqs, boom)
        with pytest.raises(RuntimeError, match="hook failed"):
            io.read_batch(reqs, boom)
    finally:
        io.free(buf)
        io.close_fd(fd)
        io.close()


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("pad", [False, True], ids=["two-segments", "three-segments"])
def test_where_user_memory_is_set_scattered_odd_addresses_move_whole(tmp_path, name,
                                                                     pad) -> None:
    io = _backend(name, tmp_path, 4, False)  # the page cache takes any memory
    assert io.user_memory
    if probe_direct_io(tmp_path):
        direct = _backend(name, tmp_path, 4, True)
        assert direct.user_memory == probe_user_memory(tmp_path)
        direct.close()
    fd = io.open(tmp_path / "seg", write=True, create=True)
    os.ftruncate(fd, N * SLOT)
    src = memoryview(bytearray(os.urandom(N * SLOT + 99)))
    back = memoryview(bytearray(N * SLOT + 99))
    try:
        def req(mem: memoryview, i: int) -> IORequest:  # a 64-byte head, a row at +13, the rest
            b = 13 + i * SLOT
            if not pad:  # io_uring takes two segments; three run on the posix threads
                return IORequest(fd, i * SLOT, mem[b + 64 : b + SLOT], head=mem[b : b + 64])
            return IORequest(fd, i * SLOT, mem[b + 64 : b + SLOT - 100], head=mem[b : b + 64],
                             more=(mem[b + SLOT - 100 : b + SLOT],))

        assert io.write_batch([req(src, i) for i in range(N)]) == [SLOT] * N
        assert io.read_batch([req(back, i) for i in range(N)]) == [SLOT] * N
        assert bytes(back[13 : 13 + N * SLOT]) == bytes(src[13 : 13 + N * SLOT])
        if name == "uring":
            assert (io._ring.submissions > 0) == (not pad)
    finally:
        io.close_fd(fd)
        io.close()


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("where", ["moosefs", "glusterfs"])
def test_the_probe_says_whether_a_slot_moves_scattered_on_a_fuse_mount(where, name) -> None:
    """A slot's scattered transfer (64-byte header, then a 256 KiB row at an odd
    address; its padding neither read nor written) with O_DIRECT works exactly where the
    probe says so: MooseFS takes it, GlusterFS's bricks refuse the unaligned pieces the
    FUSE client splits it into."""
    from tests.dfs.cluster import cluster_or_skip

    d = cluster_or_skip(where).scratch(f"probe-{name}-{os.getpid()}-{threading.get_ident()}")
    assert probe_direct_io(d)
    says = probe_user_memory(d)
    assert says == (where == "moosefs")
    io = _backend(name, d, 4, None)
    assert io.direct and io.user_memory == says
    row, head = 256 << 10, 64
    src = memoryview(bytearray(os.urandom(row + head + 13)))
    back = memoryview(bytearray(len(src)))
    fd = io.open(d / "seg", write=True, create=True)
    try:
        def req(m: memoryview) -> IORequest:
            return IORequest(fd, 4096, m[head + 13 : head + 13 + row], head=m[:head])

        def moved(m: memoryview) -> bytes:
            q = req(m)
            return b"".join(bytes(b) for b in q.segments())

        w = io.write_batch([req(src)])[0]
        r = io.read_batch([req(back)])[0] if w > 0 else w
        works = r == w == row + head and moved(back) == moved(src)
        assert works == says, (w, r)
    finally:
        with contextlib.suppress(OSError):
            io.close_fd(fd)
        io.close()
