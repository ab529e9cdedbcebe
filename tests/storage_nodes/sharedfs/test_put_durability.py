"""A put's two syncs (its slots', its manifest frame's) run together (multi-host rule 3):
the order is exercised here, on a local directory and on the loopback distributed file
systems (tests/dfs; skipped where none can run, failing under KVSTORE_REQUIRE_DFS=1).
What a crash between the two can leave (a frame durable before its slots) reads as a
counted miss, never as wrong bytes; a slot sync that fails takes the put back."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from storage_nodes.sharedfs import SharedFSTier
from storage_nodes.sharedfs.manifest_log import ManifestLog
from tests.conftest import REPO
from tests.dfs.cluster import cluster_or_skip
from tests.storage_nodes.sharedfs.conftest import (
    NS,
    chain,
    config,
    read,
    right_or_missed,
    rows,
)

PUTS_BEFORE = 40  # 16 blocks each into 256 slots: the lost put evicts, its slots held blocks


def test_a_put_syncs_its_frame_while_its_slots_sync(daemons) -> None:
    a = daemons("a")
    first = chain(8, seed=4)
    a.put(NS, first, rows(first))  # its segment made (and recorded) before the watch
    st = a._ctx.spaces[NS.fingerprint]
    frame_syncing = threading.Event()
    seen: list[bool] = []
    data_sync, frame_sync = a._ctx.io.sync, st.log.sync

    def slow_data_sync(fds):  # type: ignore[no-untyped-def]
        seen.append(frame_syncing.wait(timeout=10.0))  # serial syncs: never set here
        return data_sync(fds)

    def noting_frame_sync(ticket):  # type: ignore[no-untyped-def]
        frame_syncing.set()
        return frame_sync(ticket)

    a._ctx.io.sync = slow_data_sync  # type: ignore[method-assign]
    st.log.sync = noting_frame_sync  # type: ignore[method-assign]
    keys = chain(8, seed=1)
    assert a.put(NS, keys, rows(keys)).inserted == 8
    assert seen == [True]
    assert read(a, keys) == (8, rows(keys)) and read(a, first) == (8, rows(first))


def test_a_failed_slot_sync_takes_the_put_back(daemons) -> None:
    a, b = daemons("a"), daemons("b")
    kept, lost = chain(4, seed=2), chain(4, seed=3)
    a.put(NS, kept, rows(kept))
    a._ctx.io.sync = lambda fds: [-errno.EIO] * len(fds)  # type: ignore[method-assign]
    r = a.put(NS, lost, rows(lost))
    assert (r.inserted, r.dropped) == (0, 4)
    assert a.contains(NS, lost) == 0 and a.stats().counters["io_errors_total"] == 1
    a.check_integrity()
    b.poll()  # a peer applies the frame and the DROPs after it: nothing of it is visible
    assert b.contains(NS, lost) == 0 and read(b, kept) == (4, rows(kept))
    a.close()
    a2 = daemons("a")  # nor after a restart
    assert a2.contains(NS, lost) == 0 and read(a2, kept) == (4, rows(kept))
    a2.check_integrity()


def test_one_fdatasync_makes_every_frame_written_before_it_durable(tmp_path, monkeypatch
                                                                  ) -> None:
    from storage_nodes.sharedfs import manifest as mf

    synced: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        synced.append(fd)
        real(fd)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fdatasync", counted)
    log = ManifestLog(tmp_path, grace_s=0.0)
    assert log.roll(lambda g: mf.snapshot_end())
    first, second = log.write(mf.delete_ns(1)), log.write(mf.delete_ns(2))
    assert first is not None and second is not None and first.end < second.end
    synced.clear()
    assert log.sync(second) and log.sync(first)  # the second's sync covered the first
    assert len(synced) == 1
    third = log.write(mf.delete_ns(3))
    assert third is not None and log.roll(lambda g: mf.snapshot_end())
    synced.clear()
    assert log.sync(third) and synced == []  # durable through the new generation's snapshot
    monkeypatch.setattr(os, "fdatasync", failing)
    fourth = log.write(mf.delete_ns(4))
    assert fourth is not None and not log.sync(fourth) and log.broken
    assert log.write(mf.delete_ns(5)) is None  # never after a frame it may not have finished
    log.close()


def _lose_last_put(root: Path, ident: str) -> int:
    """A writer's durable puts, then one whose frame is durable and whose slots never
    landed, then SIGKILL; returns that put's chain index."""
    out = subprocess.run([sys.executable, "-m", "tests.storage_nodes.sharedfs.worker",
                          "lose-last", str(root), ident, "1", str(PUTS_BEFORE)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == -9, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert line == f"lost {PUTS_BEFORE}", out.stdout[-2000:]
    return PUTS_BEFORE


def _readers_count_a_miss(writer_root: Path, reader_root: Path, ident: str) -> None:
    lost = _lose_last_put(writer_root, ident)
    reader = SharedFSTier(config(reader_root, f"{ident}-r"))
    owner = SharedFSTier(config(writer_root, ident))  # restarted: adopts what it published
    try:
        for t in (reader, owner):
            t.register(NS)
        reader.poll()
        gone = chain(16, seed=100_000 + lost)
        assert reader.contains(NS, gone) == 16 and owner.contains(NS, gone) == 16  # named
        assert read(reader, gone) == (0, b"") and read(owner, gone) == (0, b"")
        assert reader.stats().counters["stale_slots_total"] == 1  # the miss, counted
        assert owner.stats().counters["corrupt_blocks_total"] == 1  # counted and dropped
        assert owner.contains(NS, gone) == 0
        others = [chain(16, seed=100_000 + i) for i in range(lost)]
        assert right_or_missed([reader, owner], others) > 0
        owner.check_integrity()
        reader.check_integrity()
    finally:
        reader.close()
        owner.close()


def test_a_frame_durable_before_its_slots_is_a_counted_miss(tmp_path) -> None:
    _readers_count_a_miss(tmp_path / "root", tmp_path / "root", "w")


@pytest.mark.parametrize("where", ["moosefs", "glusterfs"])
def test_on_a_dfs_a_frame_durable_before_its_slots_is_a_counted_miss(where) -> None:
    c = cluster_or_skip(where)
    name = f"lost-{uuid.uuid4().hex[:8]}"
    _readers_count_a_miss(c.mounts[0] / name, c.mounts[1] / name, "w")
