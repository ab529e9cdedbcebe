"""The loopback DFS fixture itself: real FUSE mounts of one file system, and a
teardown that leaves no mount and no server behind."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.dfs.cluster import PROFILES, DFSUnavailable, cluster_or_skip, required, start


def _fuse_mounts() -> set[str]:
    with open("/proc/mounts") as f:
        return {line.split()[1] for line in f if " fuse" in line}


@pytest.mark.parametrize("profile", PROFILES)
def test_mounts_are_separate_clients_of_one_file_system(profile: str) -> None:
    c = cluster_or_skip(profile)
    assert len(c.mounts) == 3
    assert {str(m) for m in c.mounts} <= _fuse_mounts()
    d = c.scratch(f"fixture-{os.getpid()}")
    payload = os.urandom(1 << 20)
    fd = os.open(d / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, payload)
    os.fsync(fd)
    os.close(fd)
    for m in c.mounts[1:]:
        assert (m / d.name / "f").read_bytes() == payload
    assert all(p > 0 for p in c.server_pids())


def test_teardown_leaves_no_mount_and_no_server(tmp_path) -> None:
    try:
        c = start("moosefs", tmp_path / "mfs", mounts=1)
    except DFSUnavailable as e:
        if required():
            pytest.fail(str(e))
        pytest.skip(str(e))
    pids = c.server_pids()
    c.kill_server(0)  # a dead server must not stop the teardown
    c.stop()
    assert str(c.mounts[0]) not in _fuse_mounts()
    left = subprocess.run(["ps", "-eo", "pid=,stat="], capture_output=True, text=True).stdout
    alive = {int(p) for p, s in (line.split() for line in left.splitlines()) if "Z" not in s}
    assert not alive & set(pids)
    assert not (tmp_path / "mfs").exists()
