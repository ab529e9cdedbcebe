"""A real distributed file system on loopback, for the shared-FS tier's tests.

``start("moosefs", base)`` runs ``tests/dfs/moosefs.sh up`` (a master, three chunkservers,
goal 2; the Debian packages are installed when absent) and returns the cluster with its
FUSE mounts (each its own client process, as separate hosts would have);
``start("glusterfs", base)`` runs the stricter profile (replica 3 over three bricks).
``stop()`` unmounts lazily first, so a dead FUSE server cannot hang the caller, then
kills every server by PID.

Tests get a cluster through ``session_cluster(profile)``: started on first use, shared by
the session, stopped by ``stop_all()`` (a session fixture in tests/conftest.py, with
``atexit`` behind it). Where no cluster can run (not root, no /dev/fuse, packages not
installable) the tests skip with the reason, or fail when ``KVSTORE_REQUIRE_DFS=1``
(``.ci/run`` sets it: CI must run them).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILES = ("moosefs", "glusterfs")
REQUIRE_ENV = "KVSTORE_REQUIRE_DFS"
UP_TIMEOUT_S = 600.0  # includes a first apt-get install on a fresh CI machine


class DFSUnavailable(RuntimeError):
    """No distributed file system can run here; the message says why."""


def required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") == "1"


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (FUSE mounts and the DFS daemons)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    for tool in ("mount", "umount", "mountpoint", "bash"):
        if shutil.which(tool) is None:
            return f"no {tool} binary"
    return None


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class DFSCluster:
    profile: str
    base: Path
    mounts: tuple[Path, ...]
    killed: list[int] = field(default_factory=list)

    def server_pids(self) -> list[int]:
        """The data servers (chunkservers or bricks), in order."""
        if self.profile == "moosefs":
            files = [self.base / f"cs{i}" / ".mfschunkserver.lock" for i in (1, 2, 3)]
        else:
            run = self.base / "run" / "vols" / "kv"
            files = [next(iter(run.glob(f"*-b{i}-brick.pid")), run / "missing") for i in (1, 2, 3)]
        pids = []
        for f in files:
            try:
                pids.append(int(f.read_text().strip()))
            except (OSError, ValueError):
                pids.append(0)
        return pids

    def kill_server(self, i: int) -> int:
        """SIGKILL data server ``i`` (0-based); returns its PID."""
        pid = self.server_pids()[i]
        if pid <= 0:
            raise RuntimeError(f"{self.profile}: no PID for server {i}")
        os.kill(pid, signal.SIGKILL)
        self.killed.append(pid)
        return pid

    def restart_servers(self) -> None:
        """Bring killed data servers back (goal/replica count restored afterwards)."""
        if self.profile == "moosefs":
            for i, pid in enumerate(self.server_pids(), start=1):
                if pid <= 0 or not _alive(pid):
                    cfg = self.base / f"cs{i}" / "mfschunkserver.cfg"
                    subprocess.run(["mfschunkserver", "-c", str(cfg), "start"],
                                   capture_output=True, timeout=60, check=False)
        else:
            subprocess.run(["gluster", "--mode=script",
                            f"--glusterd-sock={self.base}/glusterd.sock",
                            "volume", "start", "kv", "force"],
                           capture_output=True, timeout=120, check=False)
        self.killed.clear()

    def scratch(self, name: str, mount: int = 0) -> Path:
        """A fresh directory on mount ``mount`` (the same directory on every mount)."""
        d = self.mounts[mount] / name
        d.mkdir(parents=True, exist_ok=False)
        return d

    def stop(self) -> None:
        subprocess.run(["bash", str(HERE / f"{self.profile}.sh"), "down"],
                       env={**os.environ, "BASE": str(self.base)},
                       capture_output=True, timeout=120, check=False)
        with contextlib.suppress(OSError):
            shutil.rmtree(self.base)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (no init reaping in containers) counts as dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False


def start(profile: str, base: Path, mounts: int = 3) -> DFSCluster:
    """Start ``profile`` under ``base`` with ``mounts`` FUSE mounts; DFSUnavailable if it
    cannot run here (the cluster is torn down again then)."""
    if profile not in PROFILES:
        raise ValueError(f"unknown DFS profile {profile!r}")
    reason = unavailable_reason()
    if reason:
        raise DFSUnavailable(f"{profile}: {reason}")
    env = {**os.environ, "BASE": str(base), "MOUNTS": str(mounts)}
    if profile == "moosefs":
        env["PORTS"] = " ".join(map(str, free_ports(6)))
    else:
        env["BRICK_PORT"] = str(free_ports(1)[0])
        # glusterd's port is fixed, so each cluster gets its own loopback address: test
        # runs side by side on one machine would otherwise share (and break) one glusterd.
        env["GLUSTER_HOST"] = f"127.{random.randrange(1, 255)}.{random.randrange(256)}.2"
    cluster = DFSCluster(profile, base, tuple(base / f"mnt{i}" for i in range(1, mounts + 1)))
    try:
        proc = subprocess.run(["bash", str(HERE / f"{profile}.sh"), "up"], env=env,
                              capture_output=True, text=True, timeout=UP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        cluster.stop()
        raise DFSUnavailable(f"{profile} did not start within {UP_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0 or not all(os.path.ismount(m) for m in cluster.mounts):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        cluster.stop()
        raise DFSUnavailable(f"{profile} did not start (rc {proc.returncode}): "
                             + " | ".join(tail))
    return cluster


_clusters: dict[str, DFSCluster | DFSUnavailable] = {}
_lock = threading.Lock()


def session_cluster(profile: str) -> DFSCluster:
    """The session's cluster of ``profile``, started on first use. Raises DFSUnavailable
    (remembered: a second test does not retry a start that failed)."""
    with _lock:
        got = _clusters.get(profile)
        if got is None:
            base = Path(tempfile.mkdtemp(prefix=f"kvstore-{profile}-"))
            t0 = time.monotonic()
            try:
                got = start(profile, base)
            except DFSUnavailable as e:
                got = e
            else:
                print(f"\n[{profile} on loopback up in {time.monotonic() - t0:.1f} s at {base}]")
            _clusters[profile] = got
        if isinstance(got, DFSUnavailable):
            raise got
        return got


def stop_all() -> None:
    with _lock:
        for profile, c in list(_clusters.items()):
            if isinstance(c, DFSCluster):
                c.stop()
            del _clusters[profile]


atexit.register(stop_all)


def cluster_or_skip(profile: str) -> DFSCluster:
    """For tests: the session cluster, or skip (fail under KVSTORE_REQUIRE_DFS=1)."""
    import pytest

    try:
        return session_cluster(profile)
    except DFSUnavailable as e:
        if required():
            pytest.fail(f"{REQUIRE_ENV}=1 but {e}")
        pytest.skip(str(e))
        raise  # unreachable: skip raises
