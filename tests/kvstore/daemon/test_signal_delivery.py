"""SIGTERM stops the daemon whichever of its threads the kernel hands the signal to.

CPython runs a signal handler only in the main thread, and only once that thread wakes
up; a main thread parked in a wait without a timeout never wakes for a signal that was
delivered to another thread (a gRPC one), so the daemon kept running until SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

from kvstore.testing.daemon_process import DaemonProcess

SYS_TGKILL = 234  # x86-64


def _tgkill(pid: int, tid: int, sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


def _catches_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def test_sigterm_delivered_to_a_worker_thread_stops_the_daemon() -> None:
    daemon = DaemonProcess(["--dram", "8MiB"])
    try:
        pid = daemon.proc.pid
        deadline = time.monotonic() + 30
        while not _catches_sigterm(pid):  # its handler goes in just after "listening on"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
        assert others
        _tgkill(pid, others[-1], signal.SIGTERM)
        try:
            rc = daemon.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 0, "the daemon ignored a SIGTERM that landed on a non-main thread"
    finally:
        daemon.kill()
