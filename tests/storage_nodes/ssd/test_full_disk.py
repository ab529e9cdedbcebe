"""A full disk (issue 14 item 12): a slab preallocation cut short by ENOSPC is removed,
the tier reopens on a full disk (read-only, reads served) instead of dying in its O_DIRECT
probe, and it returns to ``ok`` by itself once space is freed.

Runs on a real, small ext4 file system in a loop-mounted image file (ext4 keeps the
blocks of a failed ``posix_fallocate``; tmpfs would undo them and hide the bug). Needs
root, ``mkfs.ext4`` and a loop device; skips with the reason where they are missing.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage_nodes.ssd import SSDTier
from storage_nodes.ssd.errors import SSDIOError
from storage_nodes.ssd.index import Index
from tests.storage_nodes.ssd.helpers import chain, make_config, rows, small_ns, verify_all

SLAB = 4 << 20


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


@pytest.fixture
def small_ext4(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mkfs.ext4") is None:
        pytest.skip("needs root and mkfs.ext4 to loop-mount a small ext4 file system")
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(40 << 20)
    made = _run("mkfs.ext4", "-q", "-F", "-m", "0", str(img))
    assert made.returncode == 0, made.stderr
    mounted = _run("mount", "-o", "loop", str(img), str(mnt))
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount here: {mounted.stderr.strip()}")
    try:
        yield mnt
    finally:
        _run("umount", "-l", str(mnt))


def _fill(path: Path) -> None:
    """Write until the file system refuses (ENOSPC): the disk is now full."""
    chunk = b"\xee" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError:
                break
        for size in (4096, 512, 1):  # the last partial blocks too
            while True:
                try:
                    f.write(b"\xee" * size)
                except OSError:
                    break


def test_full_disk_partial_slab_removed_and_restart_read_only(small_ext4: Path) -> None:
    ns = small_ns()
    d = small_ext4 / "ssd"
    cfg = dict(capacity_bytes=64 * SLAB, slab_bytes=SLAB)  # far more than the disk holds
    (small_ext4 / "ballast").write_bytes(b"\xbb" * (8 << 20))  # freed before the restart
    t = SSDTier(make_config(d, **cfg))
    t.register(ns)
    for salt in range(60):  # 60 x 1 MiB of blocks: the 40 MiB disk fills on the way
        k = chain(ns, 256, salt=salt)
        if t.put(ns, k, rows(ns, k)).dropped:
            break  # the index could not grow either: read-only
    c = t.stats().counters
    # slab creation failed first, and the tier went on inside the slabs it had
    assert c["evictions"] > 0 and c["slabs"] < 10
    # every slab file left is a whole one: the cut-short preallocation was removed
    sizes = {p.name: p.stat().st_size for p in (d / "slabs").glob("slab-*")}
    assert len(sizes) == c["slabs"] and set(sizes.values()) == {SLAB}, sizes
    stored = verify_all(t, ns)
    assert stored > 1000
    t.close()

    (small_ext4 / "ballast").unlink()
    _fill(small_ext4 / "filler")  # the disk is full again at the restart
    t = SSDTier(make_config(d, **cfg))  # used to die: BufferError from the O_DIRECT probe
    try:
        t.register(ns)
        assert t.mode == "read-only" and t.stats().counters["degraded"] == 1
        # no room to allocate the index file ahead: it is not written in place (a store
        # into a hole of the map would be a SIGBUS), it writes as the strict mode does
        assert t._index.room is None and not t._index.env.flags()["writemap"]
        assert verify_all(t, ns) == stored  # reads are served
        k = chain(ns, 4, salt=999)
        assert t.put(ns, k, rows(ns, k)).dropped == 4  # a counted refusal, no exception
        assert t.probe() == "read-only"  # still full
        (small_ext4 / "filler").unlink()  # 8 MiB free again
        assert t.probe() == "ok"  # space is back: the tier recovers without a restart
        assert t.put(ns, k, rows(ns, k)).inserted == 4
        assert t.contains(ns, k) == 4 and t.stats().counters["recoveries"] == 1
        verify_all(t, ns)
        t.check_integrity()
    finally:
        t.close()


def test_a_full_disk_refuses_the_index_room_before_anything_is_written(small_ext4: Path) -> None:
    """In the fast mode the index is written in place, its file allocated ahead of what
    LMDB uses (``index_room.py``). On a full disk a transaction that could outgrow that
    room is refused with ENOSPC before it writes — a store into an unbacked page of the
    map would be a SIGBUS — and smaller ones, inside the room, still commit."""
    ix = Index(small_ext4 / "ix", map_bytes=256 << 20, slab_bytes=SLAB)
    try:
        assert ix.room is not None
        _fill(small_ext4 / "filler")
        with pytest.raises(SSDIOError) as e, ix.write(16 << 20):
            raise AssertionError("a transaction without room began")
        assert e.value.errno in (errno.ENOSPC, errno.EDQUOT)
        with ix.write() as txn:  # inside the room allocated before the disk filled
            ix.create_slab(txn, 0, 4096, 64)
        (small_ext4 / "filler").unlink()
        with ix.write(16 << 20) as txn:
            ix.create_slab(txn, 1, 4096, 64)
        with ix.begin() as txn:
            assert set(ix.slab_table(txn)) == {0, 1}
    finally:
        ix.close()
