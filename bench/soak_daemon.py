"""Soak of the cache daemon: many concurrent clients for a long time, watching the
daemon's memory, file descriptors and threads (not collected by pytest).

    .venv/bin/python -m bench.soak_daemon [--duration 10m] [--procs 8 --threads 8]

The DRAM pool is pre-faulted first (filled past capacity once), so later RSS growth is
memory outside the pool. Clients (``procs × threads``, each its own ``GrpcStore``; half
over shared memory, half over gRPC) replay prompts that share prefixes: lookup, read the
hit prefix, commit the rest. Pass: 0 errors, RSS growth outside the pool < 50 MB, open
fds and threads back to their warm level. Prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import threading
import time
from typing import Any

import numpy as np

from kvstore.testing.daemon_process import DaemonProcess
from kvstore.units import parse_duration, parse_size

BLOCK_TOKENS = 64


def namespace(block_bytes: int):  # type: ignore[no-untyped-def]
    from kvstore.keys import Namespace

    return Namespace(
        "soak",
        "r1",
        "uint8",
        "mha",
        (0,),
        1,
        block_bytes // (2 * BLOCK_TOKENS),
        block_tokens=BLOCK_TOKENS,
    )


def proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(v.split()[0]) * 1024
            elif k == "Threads":
                out[k] = int(v)
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def client_loop(
    target: str, shm: bool, block_bytes: int, seed: int, stop_at: float, out: dict[str, int]
) -> None:
    from clients.config import ClientConfig
    from clients.sync_client import GrpcStore
    from kvstore.keys import chain_keys

    ns = namespace(block_bytes)
    rng = np.random.default_rng(seed)
    # 32 conversations per client; each turn re-sends the conversation plus a few blocks.
    convs = [
        list(rng.integers(0, 50_000, BLOCK_TOKENS * int(rng.integers(2, 6)))) for _ in range(32)
    ]
    payload = rng.integers(0, 256, block_bytes, dtype=np.uint8)
    cfg = ClientConfig(
        target=target, shm="auto" if shm else "off", shm_bytes=8 << 20, default_timeout_s=30
    )
    with GrpcStore(cfg) as store:
        store.register(ns)
        dst = np.empty((24, block_bytes), np.uint8)
        while time.monotonic() < stop_at:
            c = int(rng.integers(0, len(convs)))
            convs[c] += list(rng.integers(0, 50_000, BLOCK_TOKENS * int(rng.integers(1, 3))))
            if len(convs[c]) > 20 * BLOCK_TOKENS:
                convs[c] = convs[c][: 2 * BLOCK_TOKENS]  # a new conversation on the same prefix
            keys = chain_keys(ns, convs[c])
            try:
                hit = store.lookup(ns, keys).hit_blocks
                got = store.get_into(ns, keys[:hit], dst[:hit]) if hit else 0
                store.commit(ns, keys, {i: payload for i in range(got, len(keys))})
                out["ops"] += 3
                out["hit_blocks"] += got
            except Exception as e:  # every failure counts; the soak passes only with none
                out["errors"] += 1
                out["last_error"] = hash(str(e)) & 0xFFFF
                print(f"soak client error: {type(e).__name__}: {e}", flush=True)


def worker(
    target: str, threads: int, first_seed: int, block_bytes: int, stop_at: float, q: Any
) -> None:
    counts = [{"ops": 0, "errors": 0, "hit_blocks": 0} for _ in range(threads)]
    ts = [
        threading.Thread(
            target=client_loop,
            args=(
                target,
                (first_seed + i) % 2 == 0,
                block_bytes,
                first_seed + i,
                stop_at,
                counts[i],
            ),
        )
        for i in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put({k: sum(c.get(k, 0) for c in counts) for k in ("ops", "errors", "hit_blocks")})


def prefault(target: str, dram_bytes: int, block_bytes: int) -> None:
    from clients.config import ClientConfig
    from clients.sync_client import GrpcStore

    ns = namespace(block_bytes)
    rng = np.random.default_rng(0)
    n = int(dram_bytes * 1.25) // block_bytes
    payload = rng.integers(0, 256, (16, block_bytes), dtype=np.uint8)
    with GrpcStore(ClientConfig(target=target, default_timeout_s=120)) as store:
        store.register(ns)
        for _s in range(0, n, 16):
            store.commit(ns, [rng.bytes(16) for _ in range(16)], {i: payload[i] for i in range(16)})
        store.flush(timeout_s=600)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", default="10m")
    ap.add_argument("--procs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--dram", default="512MiB")
    ap.add_argument("--block-bytes", default="64KiB")
    ap.add_argument("--warmup", default="60s")
    ap.add_argument(
        "--no-ssd", action="store_true", help="DRAM tier only (attributes growth to the SSD engine)"
    )
    a = ap.parse_args()
    duration, warmup = parse_duration(a.duration), parse_duration(a.warmup)
    dram, bb = parse_size(a.dram), parse_size(a.block_bytes)
    with (
        tempfile.TemporaryDirectory(prefix="kvstore-soak-") as tmp,
        DaemonProcess(
            ["--dram", str(dram), "--workers", "32"]
            + ([] if a.no_ssd else ["--ssd-dir", tmp, "--ssd-capacity", "1GiB"])
        ) as d,
    ):
        pid = d.proc.pid
        prefault(d.target, dram, bb)
        pool = proc_status(pid)
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        stop_at = time.monotonic() + duration
        ps = [
            ctx.Process(target=worker, args=(d.target, a.threads, 1000 * i, bb, stop_at, q))
            for i in range(a.procs)
        ]
        for p in ps:
            p.start()
        samples = []
        t0 = time.monotonic()
        while any(p.is_alive() for p in ps):
            time.sleep(10)
            s = proc_status(pid)
            s["t_s"] = round(time.monotonic() - t0)
            samples.append(s)
            print(json.dumps(s), flush=True)
        totals = [q.get(timeout=60) for _ in ps]
        for p in ps:
            p.join()
        idle = proc_status(pid)
    warm = next((s for s in samples if s["t_s"] >= warmup), samples[0])
    last = samples[-1]
    growth = last["VmRSS"] - warm["VmRSS"]
    summary = {
        "duration_s": duration,
        "ssd": not a.no_ssd,
        "clients": a.procs * a.threads,
        "dram_bytes": dram,
        "block_bytes": bb,
        "ops": sum(t["ops"] for t in totals),
        "errors": sum(t["errors"] for t in totals),
        "hit_blocks": sum(t["hit_blocks"] for t in totals),
        "rss_after_prefault": pool["VmRSS"],
        "rss_warm": warm["VmRSS"],
        "rss_end": last["VmRSS"],
        "rss_growth_after_warmup_bytes": growth,
        "anon_growth_bytes": last["RssAnon"] - warm["RssAnon"],
        "shmem_end": last["RssShmem"],
        "fds_warm": warm["fds"],
        "fds_end": last["fds"],
        "fds_idle": idle["fds"],
        "threads_warm": warm["Threads"],
        "threads_end": last["Threads"],
        "threads_idle": idle["Threads"],
        "max_fds": max(s["fds"] for s in samples),
        "max_threads": max(s["Threads"] for s in samples),
    }
    summary["pass"] = summary["errors"] == 0 and growth < 50e6 and last["fds"] <= warm["fds"] + 8
    print(json.dumps(summary), flush=True)
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
