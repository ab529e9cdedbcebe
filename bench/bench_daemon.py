"""Cache-daemon throughput: put/get MB/s and p99 per call, gRPC and shared-memory paths,
side by side with Redis, Mooncake Store and memcpy measured in the same run.

Work (as ../shared/peers/kvbench.py): N values of SIZE bytes, put all, then get all
in random order; 1 client, then C client processes on disjoint slices. Calls move
``--batch`` values each (1 = per-value calls like the peers' harness; 16 = one
1024-token prefix at 64 tokens per block, how an engine calls ``get_into``); Redis
batches with a pipeline / MGET, Mooncake with put_batch / get_batch. Rounds are
interleaved (every system once per round) and the median of the rounds is reported.

    .venv/bin/python -m bench.bench_daemon [--reps 3] [--sizes 65536,262144,2097152]
        [--batches 1,16] [--clients 1,8] [--mooncake-venv DIR]

Systems: kvstore-grpc (chunked blocks over gRPC), kvstore-shm (shared-memory staging,
copied into the caller's buffer), kvstore-shm-zc (the caller reads into a staging
buffer: no client copy), redis (redis-server, persistence off, TCP), mooncake (master +
per-process segments, TCP transport), memcpy (the same bytes copied within one process:
the limit). Systems that cannot start here are reported as such, not silently skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvstore.testing.daemon_process import DaemonProcess

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "bench" / "daemon_bench_worker.py"
N_FOR_SIZE = {65536: 2048, 262144: 1024, 2097152: 256}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Peers:
    """Redis and Mooncake servers for the duration of the run."""

    def __init__(self, mooncake_venv: str | None, workdir: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.unavailable: dict[str, str] = {}
        self.redis_port = free_port()
        if shutil.which("redis-server"):
            self.procs.append(
                subprocess.Popen(
                    [
                        "redis-server",
                        "--bind",
                        "127.0.0.1",
                        "--port",
                        str(self.redis_port),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(workdir),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        else:
            self.unavailable["redis"] = (
                "redis-server not installed (apt-get install -y redis-server)"
            )
        self.mooncake_port = free_port()
        self.mooncake_python = None
        master = Path(mooncake_venv or "") / "bin" / "mooncake_master"
        if mooncake_venv and master.exists():
            self.mooncake_python = str(Path(mooncake_venv) / "bin" / "python")
            self.procs.append(
                subprocess.Popen(
                    [
                        str(master),
                        "--rpc_address=127.0.0.1",
                        f"--rpc_port={self.mooncake_port}",
                        "--enable_metric_reporting=false",
                        f"--metrics_port={free_port()}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "GLOG_minloglevel": "1"},
                )
            )
        else:
            self.unavailable["mooncake"] = (
                f"no mooncake_master under {mooncake_venv!r} (see peers README)"
            )
        time.sleep(2)

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
            p.wait(timeout=30)


def run_case(
    system: str, size: int, clients: int, batch: int, base: dict[str, Any], python: str
) -> dict[str, Any]:
    n_total = N_FOR_SIZE.get(size, max(64, (256 << 20) // size))
    per = n_total // clients
    workers = []
    for i in range(clients):
        cfg = dict(base, system=system, size=size, n=per, batch=batch, seed=1000 * i + size % 997)
        workers.append(
            subprocess.Popen(
                [python, str(WORKER), json.dumps(cfg)],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": str(REPO), "GLOG_minloglevel": "2"},
            )
        )

    def collect(step: str) -> list[dict[str, Any]]:
        out = []
        for w in workers:
            assert w.stdout is not None
            line = w.stdout.readline()
            if not line:
                err = w.stderr.read() if w.stderr else ""
                raise RuntimeError(f"{system} worker died: {err.strip().splitlines()[-1:]}")
            out.append(json.loads(line)[step])
        return out

    def go() -> None:
        for w in workers:
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()

    try:
        collect("ready")
        go()
        puts = collect("put")
        go()
        gets = collect("get")
        go()
        for w in workers:
            w.wait(timeout=120)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    row: dict[str, Any] = {
        "system": system,
        "size": size,
        "clients": clients,
        "batch": batch,
        "n": per * clients,
    }
    for op, res in (("put", puts), ("get", gets)):
        wall = (max(r["end_ns"] for r in res) - min(r["start_ns"] for r in res)) / 1e9
        lat = sorted(x for r in res for x in r["lat_ns"])
        row[f"{op}_MBps"] = sum(r["bytes"] for r in res) / wall / 1e6
        row[f"{op}_p99_us"] = lat[min(len(lat) - 1, int(0.99 * (len(lat) - 1) + 0.5))] / 1e3
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sizes", default="65536,262144,2097152")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument(
        "--systems", default="kvstore-grpc,kvstore-shm,kvstore-shm-zc,redis,mooncake,memcpy"
    )
    ap.add_argument(
        "--mooncake-venv", default=os.environ.get("MOONCAKE_VENV", "/tmp/peers-work/venv-moonnc")
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "daemon.jsonl"))
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    batches = [int(b) for b in a.batches.split(",")]
    clients = [int(c) for c in a.clients.split(",")]
    systems = a.systems.split(",")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(a.out).parent / "peers"
    workdir.mkdir(exist_ok=True)
    daemon = DaemonProcess(["--dram", "2GiB", "--workers", "16"])
    peers = Peers(a.mooncake_venv, workdir)
    base = {
        "target": daemon.target,
        "redis_port": peers.redis_port,
        "mooncake_port": peers.mooncake_port,
        "mooncake_seg_mb": 1024,
        "mooncake_buf_mb": 256,
    }
    rows: list[dict[str, Any]] = []
    try:
        with open(a.out, "a") as out:
            for rep in range(a.reps):
                for size in sizes:
                    for c in clients:
                        for b in batches:
                            for system in systems:
                                if system in peers.unavailable:
                                    continue
                                python = (
                                    peers.mooncake_python
                                    if system == "mooncake"
                                    else sys.executable
                                )
                                seg = max(64, 2 * N_FOR_SIZE.get(size, 1024) * size // c >> 20)
                                cfg = dict(
                                    base,
                                    mooncake_seg_mb=seg,
                                    mooncake_buf_mb=max(64, 2 * b * size >> 20),
                                )
                                try:
                                    row = run_case(
                                        system, size, c, b, cfg, python or sys.executable
                                    )
                                except Exception as e:  # recorded, the run goes on
                                    row = {
                                        "system": system,
                                        "size": size,
                                        "clients": c,
                                        "batch": b,
                                        "error": str(e),
                                    }
                                row["rep"] = rep
                                rows.append(row)
                                out.write(json.dumps(row) + "\n")
                                out.flush()
                                print(json.dumps(row), flush=True)
                                _reset(daemon, peers, system, size)
    finally:
        peers.close()
        daemon.stop()
    summarize(rows, peers.unavailable)
    return 0


def _reset(daemon: DaemonProcess, peers: Peers, system: str, size: int) -> None:
    """Empty the system between cases so every case starts from the same state."""
    if system.startswith("kvstore"):
        from clients.config import ClientConfig
        from clients.sync_client import GrpcStore
        from kvstore.keys import Namespace

        ns = Namespace(f"bench-{size}", "r1", "uint8", "mha", (0,), 1, size // 128, block_tokens=64)
        with GrpcStore(ClientConfig(target=daemon.target, shm="off", default_timeout_s=120)) as s:
            s.register(ns)
            s.delete_namespace(ns)
    elif system == "redis":
        import redis

        redis.Redis(port=peers.redis_port).flushall()


def summarize(rows: list[dict[str, Any]], unavailable: dict[str, str]) -> None:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["size"], r["clients"], r["batch"], r["system"]), []).append(r)
    med: dict[tuple[Any, ...], dict[str, float]] = {
        k: {
            m: statistics.median(x[m] for x in v)
            for m in ("put_MBps", "get_MBps", "put_p99_us", "get_p99_us")
        }
        | {"runs": len(v)}
        for k, v in groups.items()
    }
    print(
        "\n| size | clients | batch | system | put MB/s | get MB/s | put p99 µs | get p99 µs "
        "| runs |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (size, c, b, system), m in sorted(med.items()):
        print(
            f"| {size >> 10} KiB | {c} | {b} | {system} | {m['put_MBps']:.0f} | "
            f"{m['get_MBps']:.0f} | "
            f"{m['put_p99_us']:.0f} | {m['get_p99_us']:.0f} | {m['runs']} |"
        )
    print("\nratios of get MB/s (medians):")
    for (size, c, b, system), m in sorted(med.items()):
        if not system.startswith("kvstore"):
            continue
        parts = []
        for peer in ("redis", "mooncake", "memcpy"):
            p = med.get((size, c, b, peer))
            if p:
                parts.append(f"{m['get_MBps'] / p['get_MBps']:.2f}x {peer}")
        print(f"  {size >> 10} KiB, {c} clients, batch {b}, {system}: " + ", ".join(parts))
    errors = [r for r in rows if "error" in r]
    for r in errors:
        print(f"error: {r['system']} {r['size']} c={r['clients']} b={r['batch']}: {r['error']}")
    for name, why in unavailable.items():
        print(f"unavailable: {name}: {why}")


if __name__ == "__main__":
    sys.exit(main())
