"""A daemon's claim on its id: ``flock`` on ``daemons/<id>/LOCK`` and a heartbeat.

DESIGN §6's flock rule applies per daemon subdirectory: one process at a time opens a
daemon id, and a second opener fails with one line naming the holder. On file systems
whose locks are global (MooseFS, GlusterFS, CephFS, Lustre with ``flock``) that holds
across hosts; where they are local only, the heartbeat covers the gap: a heartbeat
written by another host within ``3 × heartbeat_s + clock_skew_s`` also refuses.

The heartbeat (``HEARTBEAT``, rewritten in place every ``heartbeat_s``) is what a
collector reads to decide that a daemon is gone; it carries the writer's wall clock,
so judging it assumes clocks agree within ``clock_skew_s``.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

import msgpack
import xxhash

from storage_nodes.sharedfs.errors import SharedFSLockedError
from storage_nodes.sharedfs.layout import Layout

_FRAME = struct.Struct("<IQ")


@dataclass(frozen=True, slots=True)
class Beat:
    daemon: str
    host: str
    pid: int
    epoch: int
    wall_s: float
    seq: int


def read_beat(path: Path) -> Beat | None:
    """The last complete heartbeat, or None (absent, torn or foreign)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < _FRAME.size:
        return None
    n, digest = _FRAME.unpack_from(raw)
    body = raw[_FRAME.size : _FRAME.size + n]
    if len(body) != n or xxhash.xxh3_64_intdigest(body) != digest:
        return None
    try:
        d = msgpack.unpackb(body, raw=False)
        return Beat(str(d["daemon"]), str(d["host"]), int(d["pid"]), int(d["epoch"]),
                    float(d["wall_s"]), int(d["seq"]))
    except (ValueError, KeyError, TypeError):
        return None


def lock_holder(path: Path) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return "another process"
    return text or "another process"


def try_flock(path: Path, *, create: bool = True) -> int | None:
    """An exclusive flock on ``path`` (created if absent and ``create``), or None if
    someone holds it (``BlockingIOError`` instead when not ``create``: the caller then
    also learns of a missing file by ``FileNotFoundError``)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        if not create:
            raise
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


class Presence:
    def __init__(self, layout: Layout, daemon: str, heartbeat_s: float, skew_s: float,
                 now_s: float) -> None:
        self.dir = layout.daemon_dir(daemon)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.daemon = daemon
        self.host = socket.gethostname()
        lock = self.dir / "LOCK"
        fd = try_flock(lock)
        if fd is None:
            raise SharedFSLockedError(
                f"shared-fs daemon id {daemon!r} is in use by {lock_holder(lock)} "
                f"(flock on {lock})"
            )
        beat = read_beat(self.dir / "HEARTBEAT")
        if (
            beat is not None
            and beat.host != self.host
            and now_s - beat.wall_s < 3 * heartbeat_s + skew_s
        ):
            os.close(fd)
            raise SharedFSLockedError(
                f"shared-fs daemon id {daemon!r} is in use on host {beat.host} (pid "
                f"{beat.pid}, heartbeat {now_s - beat.wall_s:.0f} s ago): give each host "
                "its own --shared-fs-id"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {self.host}\n".encode(), 0)
        self._lock_fd: int | None = fd
        self._beat_fd: int | None = None
        self._seq = 0
        self.epoch = 0

    def beat(self, now_s: float) -> bool:
        """Write the heartbeat; False if the mount refused (retried next time)."""
        self._seq += 1
        body = msgpack.packb(
            {"daemon": self.daemon, "host": self.host, "pid": os.getpid(), "epoch": self.epoch,
             "wall_s": now_s, "seq": self._seq},
            use_bin_type=True,
        )
        data = _FRAME.pack(len(body), xxhash.xxh3_64_intdigest(body)) + body
        try:
            if self._beat_fd is None:
                self._beat_fd = os.open(self.dir / "HEARTBEAT",
                                        os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            os.pwrite(self._beat_fd, data, 0)
            os.ftruncate(self._beat_fd, len(data))
            os.fsync(self._beat_fd)
            return True
        except OSError:
            return False

    def release(self) -> None:
        for name in ("_beat_fd", "_lock_fd"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                os.close(fd)  # closing the last descriptor drops the flock
