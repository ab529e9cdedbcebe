"""Collecting the files of daemons that are gone.

A daemon is gone when its heartbeat is older than ``dead_after_s`` (its retention plus
the clock-skew bound) by the collector's clock and its ``LOCK`` is not held. Any live
daemon may then collect it, one at a time: it takes a ``collect`` fencing token
(lease.py), holds the dead daemon's flock for the duration (so the daemon cannot
restart into a half-collected directory where locks are global), and removes, checking
its lease before each step: first the manifests (peers forget the daemon's blocks at
their next rescan), then the segments, then the daemon's directory. Everything in those
segments was idle for longer than the retention anyway.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage_nodes.sharedfs.config import SharedFSConfig
from storage_nodes.sharedfs.errors import LeaseLost
from storage_nodes.sharedfs.layout import Layout, manifests_in, segments_in
from storage_nodes.sharedfs.lease import acquire
from storage_nodes.sharedfs.presence import read_beat, try_flock

log = logging.getLogger("storage_nodes.sharedfs")


@dataclass(frozen=True, slots=True)
class Collected:
    daemon: str
    token: int
    removed: tuple[str, ...] = ()
    complete: bool = True
    reason: str = ""


@dataclass
class _Run:
    removed: list[str] = field(default_factory=list)


def dead_daemons(layout: Layout, me: str, now_s: float, dead_after_s: float) -> list[str]:
    """Daemons whose heartbeat is older than ``dead_after_s`` (or missing for as long,
    judged by the directory's age)."""
    out = []
    for d in layout.daemons_known():
        if d == me:
            continue
        beat = read_beat(layout.daemon_dir(d) / "HEARTBEAT")
        if beat is not None:
            last = beat.wall_s
        else:
            try:
                last = os.stat(layout.daemon_dir(d)).st_mtime
            except OSError:
                continue
        if now_s - last > dead_after_s:
            out.append(d)
    return out


def collect(
    layout: Layout, daemon: str, config: SharedFSConfig, clock: Callable[[], float]
) -> Collected | None:
    """Collect one gone daemon; None if it is alive or another collector holds it."""
    ddir = layout.daemon_dir(daemon)
    lock_fd = None
    try:
        # Never created here: a collector that finds LOCK gone (another one is removing
        # the directory) must not leave a new one behind; the lease settles who goes on.
        lock_fd = try_flock(ddir / "LOCK", create=False)
    except FileNotFoundError:
        pass
    except BlockingIOError:
        return None  # its process holds the lock: alive, whatever its heartbeat says
    run = _Run()
    lease = None
    try:
        lease = acquire(layout, daemon, config.daemon_id, config.lease_s,
                        config.clock_skew_s, clock())
        if lease is None:
            return None
        beat = read_beat(ddir / "HEARTBEAT")
        if beat is not None and clock() - beat.wall_s <= config.dead_after_s:
            lease.finish()  # it came back between the listing and the lock
            return None
        for _tenant, _fp, d in list(layout.owner_dirs_of(daemon)):
            for g in manifests_in(d):
                _remove(d / f"manifest-{g:010d}.log", lease, clock, run)
            for s in segments_in(d):
                _remove(d / f"seg-{s:016x}", lease, clock, run)
            for leftover in _names(d):  # temporary files of a crashed compaction
                _remove(d / leftover, lease, clock, run)
            _rmdir(d)
            _rmdir(d.parent)  # the namespace directory, if no one else writes it
        lease.check(clock())
        for name in ("HEARTBEAT", "LOCK"):
            _remove(ddir / name, lease, clock, run)
        _rmdir(ddir)
        lease.finish()
        log.info("collected daemon %s (token %d): %d files", daemon, lease.token,
                 len(run.removed))
        return Collected(daemon, lease.token, tuple(run.removed))
    except LeaseLost as e:
        log.warning("stopped collecting daemon %s: %s", daemon, e)
        assert lease is not None
        return Collected(daemon, lease.token, tuple(run.removed), complete=False, reason=str(e))
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


def _remove(path: Path, lease, clock: Callable[[], float], run: _Run) -> None:  # type: ignore[no-untyped-def]
    lease.check(clock())
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
        return
    run.removed.append(str(path))


def _names(d: Path) -> list[str]:
    try:
        return os.listdir(d)
    except OSError:
        return []


def _rmdir(d: Path) -> None:
    with contextlib.suppress(OSError):  # not empty (another daemon's files) or gone
        os.rmdir(d)
