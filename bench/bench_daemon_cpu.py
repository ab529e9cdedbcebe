"""CPU cost of one daemon call, server and client side (not collected by pytest).

Explains the multi-client figures of ``bench_daemon``: on a 2-core machine the call
rate is bounded by ``cores / (server CPU + client CPU per call)``. Measures, for one
client issuing calls back to back: wall time, client CPU (getrusage) and daemon CPU
(/proc/PID/stat) per call, for a Lookup (pure RPC), a shared-memory get and a gRPC get
of one 64 KiB block, and Redis GET of the same value for comparison.

    .venv/bin/python -m bench.bench_daemon_cpu [--calls 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import time
from collections.abc import Callable

import numpy as np

from clients.config import ClientConfig
from clients.sync_client import GrpcStore
from kvstore.keys import Namespace
from kvstore.testing.daemon_process import DaemonProcess

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(
    name: str, fn: Callable[[], object], calls: int, server_pid: int
) -> dict[str, float | str]:
    for _ in range(50):
        fn()
    c0, s0, t0 = self_cpu_s(), proc_cpu_s(server_pid), time.perf_counter()
    for _ in range(calls):
        fn()
    wall = time.perf_counter() - t0
    row: dict[str, float | str] = {
        "call": name,
        "wall_us": wall / calls * 1e6,
        "client_cpu_us": (self_cpu_s() - c0) / calls * 1e6,
        "server_cpu_us": (proc_cpu_s(server_pid) - s0) / calls * 1e6,
    }
    print(
        json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}),
        flush=True,
    )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=3000)
    a = ap.parse_args()
    size = 65536
    ns = Namespace("cpu", "r1", "uint8", "mha", (0,), 1, size // 128, block_tokens=64)
    rng = np.random.default_rng(0)
    key, value = rng.bytes(16), rng.integers(0, 256, size, dtype=np.uint8)
    dst = np.empty(size, np.uint8)
    with DaemonProcess(["--dram", "64MiB", "--workers", "8"]) as d:
        pid = d.proc.pid
        shm, grpc_ = (
            GrpcStore(ClientConfig(target=d.target)),
            GrpcStore(ClientConfig(target=d.target, shm="off")),
        )
        for s in (shm, grpc_):
            s.register(ns)
        shm.commit(ns, [key], {0: value})
        measure("Lookup (1 key)", lambda: shm.lookup(ns, [key]), a.calls, pid)
        measure("get_into shm (1 x 64 KiB)", lambda: shm.get_into(ns, [key], dst), a.calls, pid)
        measure(
            "get_into grpc (1 x 64 KiB)", lambda: grpc_.get_into(ns, [key], dst), a.calls // 3, pid
        )
        shm.close()
        grpc_.close()
    if shutil.which("redis-server"):
        import redis

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        rp = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(1)
            r = redis.Redis(port=port)
            r.set(key, value.tobytes())
            measure("redis GET (64 KiB)", lambda: r.get(key), a.calls, rp.pid)
            r.close()
        finally:
            rp.terminate()
            rp.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
