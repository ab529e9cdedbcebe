"""The shared-FS tier on a local directory: restart and crash recovery, the flock
rule, retention, capacity moving between namespaces, configuration and backends."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from storage_nodes.sharedfs import SharedFSConfig, SharedFSConfigError, SharedFSLockedError
from storage_nodes.sharedfs.backends import make_backend
from storage_nodes.sharedfs.errors import BackendUnavailable
from storage_nodes.sharedfs.layout import segments_in
from storage_nodes.sharedfs.presence import Presence
from storage_nodes.testing.crash import abandon
from tests.conftest import REPO, small_ns
from tests.storage_nodes.sharedfs.conftest import (
    NS,
    FakeClock,
    chain,
    config,
    read,
    right_or_missed,
    rows,
)


def test_a_restarted_daemon_adopts_its_blocks_and_their_order(daemons) -> None:
    a = daemons("a")
    cap = next(c.capacity_blocks for c in a.stats().size_classes)
    old, new = chain(cap // 2, seed=1), chain(cap // 2, seed=2)
    a.put(NS, old, rows(old))
    a.put(NS, new, rows(new))
    a.touch(NS, old)  # old is now the more recent chain
    a.close()
    a2 = daemons("a")
    assert read(a2, old) == (len(old), rows(old)) and a2.contains(NS, new) == len(new)
    a2.check_integrity()
    more = chain(cap // 4, seed=3)
    a2.put(NS, more, rows(more))
    assert a2.contains(NS, old) == len(old)  # recency survived the restart
    assert a2.contains(NS, new) < len(new)


def test_the_flock_rule_names_the_holder(daemons, tmp_path) -> None:
    daemons("a")
    with pytest.raises(SharedFSLockedError, match=f"pid {os.getpid()}"):
        daemons("a")


def test_a_fresh_heartbeat_from_another_host_refuses_the_id(tmp_path) -> None:
    from storage_nodes.sharedfs.layout import Layout

    layout = Layout(tmp_path / "root")
    layout.ensure()
    p = Presence(layout, "a", 10.0, 60.0, 1000.0)
    p.host = "other-host"
    p.beat(1000.0)
    p.release()
    with pytest.raises(SharedFSLockedError, match="in use on host other-host"):
        Presence(layout, "a", 10.0, 60.0, 1010.0)
    Presence(layout, "a", 10.0, 60.0, 1000.0 + 30 + 60 + 1).release()  # stale: allowed
    assert socket.gethostname() != "other-host"


def test_orphan_segments_of_a_crash_are_removed(daemons, tmp_path) -> None:
    a = daemons("a")
    keys = chain(4)
    a.put(NS, keys, rows(keys))
    d = a._ctx.spaces[NS.fingerprint].dir
    orphan = d / f"seg-{(99 << 32) | 1:016x}"
    orphan.write_bytes(b"\0" * 8192)  # created, never published: a crash in between
    abandon(a)
    a2 = daemons("a")
    assert not orphan.exists()
    assert len(segments_in(d)) == 1 and read(a2, keys) == (4, rows(keys))


def test_sigkill_mid_write_leaves_nothing_readable_that_is_wrong(tmp_path, daemons) -> None:
    root = tmp_path / "root"
    proc = subprocess.Popen([sys.executable, "-m", "tests.storage_nodes.sharedfs.worker",
                             "put", str(root), "w", "1"], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        done = 0
        while done < 20:  # enough puts that segments fill and slots get reused
            line = proc.stdout.readline()
            assert line.startswith("put "), line
            done = int(line.split()[1])
        time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    reader = daemons("r")
    w = daemons("w")  # restarted: adopts what it published
    reader.poll()
    assert right_or_missed([w, reader], [chain(16, seed=100_000 + i) for i in range(done + 2)]) > 0
    w.check_integrity()
    reader.check_integrity()


def test_idle_blocks_expire_after_the_retention(daemons) -> None:
    clock = FakeClock()
    a = daemons("a", clock=clock, retention_s=600.0, bucket_s=1.0)
    b = daemons("b", clock=clock, retention_s=600.0, bucket_s=1.0)
    keys, kept = chain(4, seed=5), chain(4, seed=6)
    a.put(NS, keys, rows(keys))
    a.put(NS, kept, rows(kept))
    b.poll()
    clock.advance(400)
    assert read(b, kept)[0] == 4  # a peer's read keeps it alive
    b.flush_touches()
    a.poll()
    clock.advance(300)
    assert a.contains(NS, keys) == 0 and b.contains(NS, keys) == 0  # expired = a miss at once
    assert a.sweep() == 4
    assert a.contains(NS, kept) == 4 and a.stats().counters["expired_total"] == 4
    a.check_integrity()


def test_capacity_moves_between_namespaces_a_segment_at_a_time(daemons) -> None:
    a = daemons("a")
    other = small_ns(model_id="other")
    a.register(other)
    cap = next(c.capacity_blocks for c in a.stats().size_classes)
    first = chain(cap, seed=7)
    a.put(NS, first, rows(first))
    keys = chain(8, seed=8, ns=other)
    assert a.put(other, keys, rows(keys, ns=other)).inserted == 8
    assert read(a, keys, ns=other) == (8, rows(keys, ns=other))
    st = a.stats()
    assert st.counters["segments_handed_over"] == 1
    assert st.counters["retention_violations_total"] > 0
    assert a.contains(NS, first) == cap - cap // 4  # one segment's worth went, tail first
    a.check_integrity()


def test_tenants_get_their_own_directory_with_the_configured_mode(daemons, tmp_path) -> None:
    a = daemons("a", tenant_dir_mode=0o700)
    t = small_ns(tenant="acme/eu")
    a.register(t)
    d = tmp_path / "root" / "tenants" / "acme%2Feu"
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700
    assert (d / t.fingerprint.hex() / "a").is_dir()


@pytest.mark.parametrize(
    "bad",
    [
        dict(daemon_id="../x"),
        dict(daemon_id=""),
        dict(capacity_bytes=100),
        dict(segment_bytes=5000),
        dict(capacity_bytes=1 << 20, segment_bytes=2 << 20),
        dict(lease_s=100.0, clock_skew_s=60.0),
        dict(poll_interval_s=0),
        dict(retention_s=-1),
    ],
)
def test_bad_configuration_is_refused(tmp_path, bad) -> None:
    with pytest.raises(SharedFSConfigError):
        config(tmp_path, "a", **bad)


def test_a_daemons_files_keep_their_segment_size(daemons, tmp_path) -> None:
    a = daemons("a")
    keys = chain(3, seed=9)
    a.put(NS, keys, rows(keys))
    a.close()
    from storage_nodes.sharedfs import SharedFSTier

    with pytest.raises(SharedFSConfigError, match="segment_bytes=262144"):
        SharedFSTier(config(tmp_path / "root", "a", segment_bytes=128 << 10))
    auto = SharedFSTier(SharedFSConfig(root=tmp_path / "root", capacity_bytes=4 << 20,
                                       daemon_id="a", maintenance=False))
    try:
        assert auto.config.segment_bytes == 256 << 10
        auto.register(NS)
        assert read(auto, keys) == (3, rows(keys))
    finally:
        auto.close()


def test_usrbio_is_refused_off_3fs_and_auto_falls_back_to_io_uring_or_threads(
        tmp_path) -> None:
    from storage_nodes.ssd.backends import uring_available
    from tests.io_backends import uring_required

    with pytest.raises(BackendUnavailable, match="not on a 3FS mount"):
        make_backend("usrbio", tmp_path, 4, None)
    io = make_backend("auto", tmp_path, 4, None)
    try:
        assert io.name == ("uring" if uring_available() or uring_required() else "posix")
    finally:
        io.close()
    with pytest.raises(SharedFSConfigError, match="unknown shared-fs io backend"):
        make_backend("nope", tmp_path, 4, None)


def test_a_foreign_root_is_refused(tmp_path) -> None:
    (tmp_path / "FORMAT").write_text("something else\n")
    from storage_nodes.sharedfs import SharedFSTier

    with pytest.raises(SharedFSConfigError, match="another format"):
        SharedFSTier(config(tmp_path, "a"))


# direct_io None: O_DIRECT where the directory takes it, slots read through staging where
# it wants aligned memory (a local disk); False: the page cache, slots read scattered
# (header to staging, payload straight into the caller's row), as on FUSE mounts.
PATHS = pytest.mark.parametrize("direct_io", [None, False], ids=["probed", "scattered"])


@PATHS
def test_a_flipped_bit_on_the_mount_is_a_counted_miss_and_the_block_goes(daemons,
                                                                        direct_io) -> None:
    from storage_nodes.sharedfs.segments import slot_offset

    a, b = daemons("a", direct_io=direct_io), daemons("b", direct_io=direct_io)
    keys = chain(4, seed=20)
    a.put(NS, keys, rows(keys))
    b.poll()
    blk = a._ctx.spaces[NS.fingerprint].own.lru[keys[2]]
    path = a._ctx.segment_path(a._ctx.spaces[NS.fingerprint], "a", blk.seg)
    with open(path, "r+b") as f:
        f.seek(slot_offset(blk.slot, 4096) + 64 + 100)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    assert read(b, keys) == (2, rows(keys[:2]))  # a peer: a miss, the location forgotten
    assert b.stats().counters["stale_slots_total"] == 1
    sums: list[int] = []
    dst = bytearray(4 * NS.block_bytes)
    assert a.get_into(NS, keys, dst, checksums=sums) == 2 and len(sums) == 2
    assert a.stats().counters["corrupt_blocks_total"] == 1
    assert a.contains(NS, keys) == 2  # the owner dropped it (and says so in its manifest)
    b.poll()
    a.check_integrity()
    b.check_integrity()


@PATHS
def test_a_checksum_given_at_put_is_what_reads_are_checked_against(daemons, direct_io) -> None:
    a = daemons("a", direct_io=direct_io)
    keys = chain(3, seed=21)
    with pytest.raises(ValueError):
        a.put(NS, keys, rows(keys), checksums=[1, 2])
    a.put(NS, keys, rows(keys), checksums=[0, 0, 0])  # not the payloads' checksums
    assert read(a, keys)[0] == 0
    assert a.stats().counters["corrupt_blocks_total"] == 1


def test_a_file_system_refusing_caller_memory_falls_back_to_staging(daemons, tmp_path) -> None:
    """A transfer in caller memory that the file system refuses (EINVAL: GlusterFS's
    bricks under O_DIRECT, or here a local disk) is redone through staging, and the
    backend stays there: no put dropped, no read missed, no error counted."""
    from storage_nodes.sharedfs.io_backend import probe_direct_io, probe_user_memory

    if not probe_direct_io(tmp_path) or probe_user_memory(tmp_path):
        pytest.skip(f"{tmp_path} does not refuse O_DIRECT transfers in unaligned memory")
    a = daemons("a", direct_io=True)
    io = a._ctx.io
    assert io.direct and not io.user_memory
    keys, more = chain(6, seed=30), chain(6, seed=31)
    io.user_memory = True  # as a probe that missed how the file system splits transfers
    assert a.put(NS, keys, rows(keys)).inserted == 6
    assert not io.user_memory
    a.put(NS, more, rows(more))
    io.user_memory = True
    assert read(a, keys) == (6, rows(keys)) and read(a, more) == (6, rows(more))
    assert not io.user_memory
    c = a.stats().counters
    assert c["io_errors_total"] == 0 and c["corrupt_blocks_total"] == 0


def test_namespace_blocks_count_this_daemons_own(daemons) -> None:
    # Issue 36 (item 7): a tenant's Stats showed "ssd: 0 B" (the tier could not count).
    a = daemons("a")
    keys = chain(6, seed=7)
    a.put(NS, keys, rows(keys))
    other = small_ns(tenant="nobody").fingerprint
    assert a.namespace_blocks([NS.fingerprint, other]) == {NS.fingerprint: 6, other: 0}
    assert a.stats().used_bytes == 6 * a.block_footprint(NS.block_bytes)
