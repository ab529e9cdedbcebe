"""Shared-FS tier on a loopback distributed file system, against fio on the same mount
and against the node cluster on the same machine (issue "shared-FS tier", item 7).

* get: ``SharedFSTier.get_into`` of 32 random stored 256 KiB blocks per call (32 slot
  reads in flight, header check, copy out, xxh3 of the copy) vs fio ``randread`` of
  256 KiB at depth 32 on one large file on the same mount;
* put: ``SharedFSTier.put`` of 32 new blocks per call (the store is full, so it evicts:
  32 slot writes, an fsync per segment, one manifest append + fsync) vs fio
  ``randwrite`` of 256 KiB at depth 32 with one fdatasync per 32 writes.

fio runs each pattern with ``io_uring``, ``libaio`` and ``psync`` × 32 jobs (FUSE serves
requests in the submitting thread, so engines differ); the limit is the best of them,
measured in the same run. Then the same get/put through the node cluster (3 ``kvstore
node`` processes, R = 2, on local disk), and the cross-host hit: a block put through
daemon A is looked up and read through daemon B on another mount (time until visible
with the default poll, then lookup + get latency). Medians of interleaved rounds.

``--callers N``: N threads each issue calls of 32/N blocks, so at most 32 I/Os are in
flight, as fio's ``--iodepth=32`` means (fio's queue never drains; one caller of 32 drains
its queue every call, and the tier manager's write-back keeps two puts in flight).

Run: ``.venv/bin/python -m bench.bench_sharedfs`` (needs root and
/dev/fuse; installs MooseFS/GlusterFS and fio from Debian when absent). ``--quick``:
shorter runs, smaller working set.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.fio import rates, run_job, runtime_arg
from bench.harness import byte_namespace, machine, median_interleaved, on_callers
from kvstore.keys import Namespace
from storage_nodes.sharedfs import SharedFSConfig, SharedFSTier
from tests.dfs.cluster import DFSCluster, start

BLOCK = 256 << 10
QD = 32
ENGINES = ("io_uring", "libaio", "psync")
WRITE_ENGINES = ("io_uring", "libaio")  # the same sync pattern as ours: one per 32 writes


def ns_for(tag: str) -> Namespace:
    return byte_namespace(f"bench-sharedfs-{tag}", BLOCK)


def _summary(nbytes: int, elapsed: float, lat: list[float]) -> dict[str, float]:
    lat.sort()
    return {"MBps": nbytes / elapsed / 1e6, "p50_ms": lat[len(lat) // 2] * 1e3,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3}


class Ours:
    """One daemon's tier on the mount, filled to its capacity."""

    def __init__(self, root: Path, ws_bytes: int, tag: str) -> None:
        seg = 64 << 20
        cap = (ws_bytes * 9 // 8 // seg + 1) * seg
        self.tier = SharedFSTier(SharedFSConfig(root=root, capacity_bytes=cap,
                                                segment_bytes=seg, daemon_id=f"bench-{tag}",
                                                queue_depth=QD))
        self.ns = ns_for(tag)
        self.tier.register(self.ns)
        self.rng = random.Random(1)
        self.src = np.random.default_rng(1).integers(0, 256, QD * BLOCK, dtype=np.uint8)
        self.dst = bytearray(QD * BLOCK)
        for _ in range(ws_bytes // BLOCK // QD):
            self._put_batch()

    def _put_batch(self, rng: random.Random | None = None, n: int = QD,
                   src: np.ndarray | None = None) -> float:
        keys = [(rng or self.rng).randbytes(16) for _ in range(n)]
        t = time.perf_counter()
        r = self.tier.put(self.ns, keys, self.src[: n * BLOCK] if src is None else src)
        if r.inserted != n:
            raise RuntimeError(f"bench put stored {r.inserted} of {n}: {r}")
        return time.perf_counter() - t

    def get(self, seconds: float, callers: int = 1) -> dict[str, float]:
        """``callers`` threads, each reading ``QD // callers`` random blocks per call: at
        most ``QD`` reads in flight, as fio's ``--iodepth``."""
        keys = self.tier.iter_keys(self.ns)
        per = QD // callers
        seeds = [self.rng.randrange(1 << 62) for _ in range(callers)]

        def loop(k: int, lat: list[float]) -> int:
            rng, done = random.Random(seeds[k]), 0
            view = memoryview(self.dst)[k * per * BLOCK : (k + 1) * per * BLOCK]
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                batch = rng.sample(keys, per)
                s = time.perf_counter()
                if self.tier.get_into(self.ns, batch, view) != per:
                    raise RuntimeError("bench get returned a short prefix")
                lat.append(time.perf_counter() - s)
                done += per
            return done

        return _threads(loop, callers)

    def put(self, seconds: float, callers: int = 1) -> dict[str, float]:
        """``callers`` threads, each putting ``QD // callers`` new blocks per call (its own
        rows of the source): at most ``QD`` writes in flight."""
        per = QD // callers
        seeds = [self.rng.randrange(1 << 62) for _ in range(callers)]  # new keys every run

        def loop(k: int, lat: list[float]) -> int:
            rng, done = random.Random(seeds[k]), 0
            src = self.src[k * per * BLOCK : (k + 1) * per * BLOCK]
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                lat.append(self._put_batch(rng, per, src))
                done += per
            return done

        return _threads(loop, callers)

    def close(self) -> dict[str, str]:
        info = dict(self.tier.stats().info)
        self.tier.close()
        return info


def _threads(loop: Callable[[int, list[float]], int], callers: int) -> dict[str, float]:
    """``loop(k, lat)`` on ``callers`` threads at once; MB/s over the whole run."""
    done, elapsed, lat = on_callers(loop, callers)
    return _summary(done * BLOCK, elapsed, lat)


def fio(path: Path, rw: str, engine: str, size: int, seconds: float, *,
        cpu: bool = False) -> dict[str, float]:
    args = ["fio", "--name=b", f"--filename={path}", f"--size={size}", f"--rw={rw}",
            f"--bs={BLOCK}", "--direct=1", f"--runtime={runtime_arg(seconds)}", "--time_based",
            "--norandommap", "--randrepeat=0", "--output-format=json", "--group_reporting"]
    if engine == "psync":
        args += ["--ioengine=psync", f"--numjobs={QD}", "--thread"]
    else:
        args += [f"--ioengine={engine}", f"--iodepth={QD}"]
    if rw == "randwrite":
        args.append(f"--fdatasync={QD}")
    job = run_job(args)
    mbps, p50_ns, p99_ns = rates(job, rw)
    out = {"MBps": mbps, "p50_ms": p50_ns / 1e6, "p99_ms": p99_ns / 1e6}
    if cpu:  # fio's own CPU over the run (usr + sys, % of one core, all jobs)
        out["cpu_ms"] = (job["usr_cpu"] + job["sys_cpu"]) / 100 * seconds * 1e3
    return out


def compare_with_fio(c: DFSCluster, a: argparse.Namespace) -> list[dict]:
    root = c.mounts[0] / "bench"
    ours = Ours(root, a.ws, c.profile)
    fio_file = c.mounts[0] / "fio-file"
    fio(fio_file, "randwrite", "libaio", a.ws, 0.5)  # lay the file out first
    runs: dict[str, list[dict[str, float]]] = {}

    def case(name: str, fn: Callable[[], dict[str, float]]) -> Callable[[], float]:
        def run() -> float:
            r = fn()
            runs.setdefault(name, []).append(r)
            return r["MBps"]
        return run

    cases = {"get": case("get", lambda: ours.get(a.seconds, a.callers)),
             "put": case("put", lambda: ours.put(a.seconds, a.callers))}
    for eng in ENGINES:
        cases[f"fio_read_{eng}"] = case(f"fio_read_{eng}", lambda e=eng: fio(  # type: ignore[misc]
            fio_file, "randread", e, a.ws, a.seconds))
    for eng in WRITE_ENGINES:
        cases[f"fio_write_{eng}"] = case(f"fio_write_{eng}", lambda e=eng: fio(  # type: ignore[misc]
            fio_file, "randwrite", e, a.ws, a.seconds))
    med = median_interleaved(cases, runs=a.runs)
    info = ours.close()
    rows = []
    for op, kind, engines in (("get", "read", ENGINES), ("put", "write", WRITE_ENGINES)):
        best = max(engines, key=lambda e: med[f"fio_{kind}_{e}"])
        peer = f"fio_{kind}_{best}"
        pairs = [o["MBps"] / p["MBps"] for o, p in zip(runs[op], runs[peer], strict=True)]
        rows.append({
            "fs": c.profile, "op": op, "callers": a.callers, "MBps": round(med[op], 1),
            "p50_ms": round(statistics.median(r["p50_ms"] for r in runs[op]), 1),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in runs[op]), 1),
            "fio": {e: round(med[f"fio_{kind}_{e}"], 1) if e in engines else "—"
                    for e in ENGINES},
            "fio_best": best, "ratio": round(med[op] / med[peer], 2),
            "round_ratio": round(statistics.median(pairs), 2),
            "round_range": [round(min(pairs), 2), round(max(pairs), 2)],
            "direct_io": info["direct_io"], "io_backend": info["io_backend"],
        })
    shutil.rmtree(root, ignore_errors=True)
    fio_file.unlink(missing_ok=True)
    return rows


def cross_host(c: DFSCluster, a: argparse.Namespace) -> dict:
    """Commit on daemon A (mount 1), lookup + get on daemon B (mount 2)."""
    name = f"xhost-{os.getpid()}"
    mk = lambda m, ident: SharedFSTier(SharedFSConfig(  # noqa: E731
        root=c.mounts[m] / name, capacity_bytes=256 << 20, segment_bytes=64 << 20,
        daemon_id=ident, queue_depth=QD))
    ta, tb = mk(0, "a"), mk(1, "b")
    ns = ns_for("xhost")
    ta.register(ns)
    tb.register(ns)
    rng = random.Random(2)
    src = np.random.default_rng(2).integers(0, 256, QD * BLOCK, dtype=np.uint8)
    dst = bytearray(QD * BLOCK)
    visible, get1, get32, look, every = [], [], [], [], []
    try:
        for _ in range(a.xruns):
            keys = [rng.randbytes(16) for _ in range(QD)]
            every += keys
            ta.put(ns, keys, src)
            t0 = time.perf_counter()
            while tb.contains(ns, keys) < QD:
                time.sleep(0.002)
            visible.append(time.perf_counter() - t0)
            s = time.perf_counter()
            tb.contains(ns, keys)
            look.append(time.perf_counter() - s)
            s = time.perf_counter()
            assert tb.get_into(ns, keys[:1], memoryview(dst)[:BLOCK]) == 1
            get1.append(time.perf_counter() - s)
            s = time.perf_counter()
            assert tb.get_into(ns, keys, dst) == QD
            get32.append(time.perf_counter() - s)
        # a 32 K-token prompt (512 blocks of 64 tokens), all held by A: memory only on B
        prompt = every[:512]
        found = tb.contains(ns, prompt)
        long_look = []
        for _ in range(20):
            s = time.perf_counter()
            tb.contains(ns, prompt)
            long_look.append(time.perf_counter() - s)
        bound = ta.config.visibility_bound_s
    finally:
        ta.close()
        tb.close()
        shutil.rmtree(c.mounts[0] / name, ignore_errors=True)
    med = statistics.median
    return {"fs": c.profile, "visible_after_s": {"median": round(med(visible), 2),
                                                  "max": round(max(visible), 2)},
            "bound_s": bound, "lookup_32_us": round(med(look) * 1e6),
            "contains_keys": found, "contains_us": round(med(long_look) * 1e6),
            "get_1_ms": round(med(get1) * 1e3, 2), "get_32_ms": round(med(get32) * 1e3, 1)}


def node_cluster(a: argparse.Namespace) -> dict:
    """The same get/put pattern through 3 ``kvstore node`` processes, R = 2."""
    from storage_nodes.testing.local_cluster import LocalCluster

    tmp = Path(tempfile.mkdtemp(prefix="bench-sharedfs-nodes-"))
    cap = a.ws * 9 // 8 * 2 // 3 + (64 << 20)
    with LocalCluster(tmp, 3, cap, ("--slab", str(64 << 20))) as cluster:
        tier = cluster.tier(replicas=2, write_quorum=2)
        ns = ns_for("nodes")
        tier.register(ns)
        rng = random.Random(3)
        src = np.random.default_rng(3).integers(0, 256, QD * BLOCK, dtype=np.uint8)
        dst = bytearray(QD * BLOCK)
        keys: list[bytes] = []
        for _ in range(a.ws // BLOCK // QD):
            batch = [rng.randbytes(16) for _ in range(QD)]
            tier.put(ns, batch, src)
            keys += batch

        def get() -> dict[str, float]:
            lat, t0 = [], time.perf_counter()
            while time.perf_counter() - t0 < a.seconds:
                s = time.perf_counter()
                tier.get_into(ns, rng.sample(keys, QD), dst)
                lat.append(time.perf_counter() - s)
            return _summary(len(lat) * QD * BLOCK, time.perf_counter() - t0, lat)

        def put() -> dict[str, float]:
            lat, t0 = [], time.perf_counter()
            while time.perf_counter() - t0 < a.seconds:
                s = time.perf_counter()
                tier.put(ns, [rng.randbytes(16) for _ in range(QD)], src)
                lat.append(time.perf_counter() - s)
            return _summary(len(lat) * QD * BLOCK, time.perf_counter() - t0, lat)

        med = median_interleaved({"get": lambda: get()["MBps"], "put": lambda: put()["MBps"]},
                                 runs=a.runs)
        tier.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"cluster": "3 nodes, R=2, local disk", "get_MBps": round(med["get"], 1),
            "put_MBps": round(med["put"], 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="moosefs,glusterfs")
    ap.add_argument("--ws", type=int, default=512 << 20, help="bytes stored (ours and fio)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--xruns", type=int, default=16, help="cross-host commits measured "
                    "(of 32 blocks; 16 make the 512-block prompt that contains is timed on)")
    ap.add_argument("--no-cluster", action="store_true", help="skip the node cluster")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--callers", type=int, default=1, choices=(1, 2, 4, 8),
                    help="threads sharing the depth of 32: each call moves 32/N blocks, so "
                    "at most 32 I/Os are in flight, as fio's --iodepth=32 (default 1: one "
                    "call of 32 at a time, whose queue drains before the next)")
    a = ap.parse_args()
    if a.quick:
        a.ws, a.seconds, a.xruns = 128 << 20, 1.0, 3
    if shutil.which("fio") is None:
        subprocess.run(["apt-get", "install", "-y", "-qq", "fio"], check=True,
                       capture_output=True)
    print(f"# {machine()}; load average at start {os.getloadavg()[0]:.1f}; "
          f"working set {a.ws >> 20} MiB; {a.runs} interleaved rounds of {a.seconds} s")
    rows, xrows = [], []
    for profile in a.profiles.split(","):
        base = Path(tempfile.mkdtemp(prefix=f"bench-{profile}-"))
        c = start(profile, base)
        try:
            for r in compare_with_fio(c, a):
                rows.append(r)
                print(json.dumps(r), flush=True)
            x = cross_host(c, a)
            xrows.append(x)
            print(json.dumps(x), flush=True)
        finally:
            c.stop()
    nodes = None if a.no_cluster else node_cluster(a)
    if nodes:
        print(json.dumps(nodes), flush=True)
    print(f"\ncallers: {a.callers} (each call {QD // a.callers} blocks)")
    print("\n| fs | op | ours MB/s | p50/p99 ms (call) | fio MB/s io_uring / libaio / "
          "psync×32 | ratio to best fio | per-round ratio median [min–max] |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        f = r["fio"]
        print(f"| {r['fs']} | {r['op']} | {r['MBps']} | {r['p50_ms']}/{r['p99_ms']} | "
              f"{f['io_uring']} / {f['libaio']} / {f['psync']} | {r['ratio']} | "
              f"{r['round_ratio']} [{r['round_range'][0]}–{r['round_range'][1]}] |")
    if nodes:
        print(f"\nnode cluster ({nodes['cluster']}): get {nodes['get_MBps']} MB/s, "
              f"put {nodes['put_MBps']} MB/s (same pattern)")
    for x in xrows:
        print(f"cross-host on {x['fs']}: visible after {x['visible_after_s']['median']} s "
              f"(max {x['visible_after_s']['max']}, bound {x['bound_s']} s); then contains(32) "
              f"{x['lookup_32_us']} µs, get 1 block {x['get_1_ms']} ms, 32 blocks "
              f"{x['get_32_ms']} ms; contains of {x['contains_keys']} keys {x['contains_us']} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
