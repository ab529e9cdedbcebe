"""Where a shared-FS get or put spends its time: wall and CPU per call, by phase, on a
loopback distributed file system (a diagnosis, not a ratio; ``bench_sharedfs`` has those).

The same loops as ``bench.bench_sharedfs`` (``get_into``/``put`` of 32 × 256 KiB on a
full store) with wall-clock timers around the phases: ``reserve``, ``write_batch`` (the
slot writes, encoding included), ``sync`` (the data syncs), ``manifest_append`` (append
+ fsync of the frame), ``read_batch`` (reads, checks and copies). CPU: this process
(all threads) and the whole machine (/proc/stat) per call, against fio's on the same
mount for the same bytes.

Run alone: ``.venv/bin/python -m bench.profile_sharedfs``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bench_sharedfs import BLOCK, QD, Ours, fio
from bench.harness import PhaseTimes
from storage_nodes.sharedfs import alloc, io_backend, manifest_log, ops, uring_io
from tests.dfs.cluster import start

_ACC = PhaseTimes()
_timed = _ACC.wrap


def _instrument() -> None:
    ops.reserve = _timed(alloc.reserve, "reserve")  # type: ignore[attr-defined]
    for name in ("read_batch", "write_batch", "sync"):  # sync: timed inside the count
        setattr(io_backend.PosixBackend, name,
                _timed(getattr(io_backend.PosixBackend, name), name))
    for name in ("read_batch", "write_batch"):  # io_uring's own (it has no sync of its own)
        setattr(uring_io.UringBackend, name,
                _timed(getattr(uring_io.UringBackend, name), name))
    sync = io_backend.PosixBackend.sync

    def counted(self: Any, fds: Any) -> Any:
        _ACC["fds_synced(count)"] = _ACC.get("fds_synced(count)", 0) + len(fds) / 1e3
        return sync(self, fds)

    io_backend.PosixBackend.sync = counted  # type: ignore[method-assign]
    manifest_log.ManifestLog.append = _timed(  # type: ignore[method-assign]
        manifest_log.ManifestLog.append, "manifest_append")


def _machine_busy_s() -> float:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def _self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _self_split() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime, r.ru_nvcsw + r.ru_nivcsw


def _measure(label: str, fn: Callable[[], int]) -> None:
    _ACC.clear()
    w0, c0, m0 = time.perf_counter(), _self_cpu_s(), _machine_busy_s()
    u0, s0, x0 = _self_split()
    calls = fn()
    wall = time.perf_counter() - w0
    cpu, busy = _self_cpu_s() - c0, _machine_busy_s() - m0
    u1, s1, x1 = _self_split()
    per = 1e3 / calls
    print(f"{label}: {calls * QD * BLOCK / wall / 1e6:.0f} MB/s, {calls} calls, "
          f"{wall * per:.2f} ms/call; CPU ours {cpu * per:.2f} ms/call (user "
          f"{(u1 - u0) * per:.2f}, sys {(s1 - s0) * per:.2f}, {(x1 - x0) / calls:.0f} "
          f"context switches), machine {busy * per:.2f} ms/call "
          f"({busy / wall:.2f} of {os.cpu_count()} cores)")
    for k, v in sorted(_ACC.items(), key=lambda kv: -kv[1]):
        print(f"    {k:16s} {v * per:7.2f} ms/call")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="moosefs")
    ap.add_argument("--ws", type=int, default=256 << 20)
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    _instrument()
    base = Path(tempfile.mkdtemp(prefix=f"profile-{a.profile}-"))
    c = start(a.profile, base)
    try:
        ours = Ours(c.mounts[0] / "bench", a.ws, a.profile)

        def loop(one: Callable[[], Any]) -> Callable[[], int]:
            def run() -> int:
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < a.seconds:
                    one()
                    n += 1
                return n
            return run

        for _ in range(2):
            keys = ours.tier.iter_keys(ours.ns)
            _measure("get", loop(lambda ks=keys: ours.tier.get_into(  # type: ignore[misc]
                ours.ns, ours.rng.sample(ks, QD), ours.dst)))
            _measure("put", loop(ours._put_batch))
        ours.close()
        path = c.mounts[0] / "fio-file"
        fio(path, "randwrite", "libaio", a.ws, 0.5)
        for rw in ("randread", "randwrite"):
            for eng in ("libaio", "psync"):
                w0, m0 = time.perf_counter(), _machine_busy_s()
                r = fio(path, rw, eng, a.ws, a.seconds, cpu=True)
                wall, busy = time.perf_counter() - w0, _machine_busy_s() - m0
                calls = r["MBps"] * 1e6 * a.seconds / (QD * BLOCK)
                print(f"fio {rw} {eng}: {r['MBps']:.0f} MB/s; fio's own CPU "
                      f"{r['cpu_ms'] / calls:.2f} ms per 32 blocks; machine "
                      f"{busy / wall:.2f} cores, ~{busy * 1e3 / max(calls, 1):.2f} ms per "
                      f"32 blocks (incl. fio start)")
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
