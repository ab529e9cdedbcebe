"""Storage-node cluster: CPU-seconds per GB moved, R=1 vs R=2 and 1 vs 3 nodes.

On a 2-core machine the client and every node share the same two cores, so wall-clock
throughput mostly measures contention; what a deployment pays for is CPU. For each
configuration a fresh namespace of 256 KiB blocks is written (``put``, replicated R
times) and read back (``get_into``, verified), and we count the CPU time of the
client process and of every node process (``/proc/PID/stat``) per GB of payload the
caller moved (replica copies are cost, not volume).

Limit measured in the same run: the floor any verified copy pays — one xxh3-64 over
the payload plus one memcpy, in this process. Ratios are CPU-s/GB against that floor
and R=2 against R=1 on the same 3 nodes. Medians of 3 interleaved rounds.

Run: ``.venv/bin/python -m bench.bench_cluster`` (``--quick``: 16 MiB per phase).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

from bench.harness import byte_namespace, machine
from kvstore.keys import Namespace, chain_keys
from storage_nodes.cluster.config import ClusterConfig
from storage_nodes.cluster.tier import ClusterTier
from storage_nodes.testing.local_cluster import LocalCluster

BLOCK_BYTES = 256 << 10
BATCH_BLOCKS = 16
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def ns_for(run: int) -> Namespace:
    return byte_namespace(f"bench-cluster-{run}", BLOCK_BYTES)


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime + stime


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@dataclass(frozen=True)
class Phase:
    client_s: float
    nodes_s: float
    wall_s: float
    gb: float

    @property
    def total_per_gb(self) -> float:
        return (self.client_s + self.nodes_s) / self.gb


def measure(pids: list[int], fn: Callable[[], None], nbytes: int) -> Phase:
    c0, n0, t0 = self_cpu_s(), sum(proc_cpu_s(p) for p in pids), time.perf_counter()
    fn()
    t1, c1, n1 = time.perf_counter(), self_cpu_s(), sum(proc_cpu_s(p) for p in pids)
    return Phase(c1 - c0, n1 - n0, t1 - t0, nbytes / 1e9)


class Case:
    def __init__(self, cluster: LocalCluster, nodes: int, replicas: int) -> None:
        self.cluster = cluster
        self.pids = [p.pid for p in cluster.nodes[:nodes]]
        config = ClusterConfig(
            nodes=cluster.targets[:nodes], replicas=replicas, write_quorum=replicas
        )
        self.tier = ClusterTier(config)
        self.label = f"{nodes} node{'s' if nodes > 1 else ''}, R={replicas}"

    def run(self, run: int, blocks: int, batch: int) -> tuple[Phase, Phase]:
        ns = ns_for(run)
        self.tier.register(ns)
        rng = np.random.default_rng(run)
        keys = chain_keys(ns, rng.integers(0, 50_000, blocks * ns.block_tokens))
        src = rng.integers(0, 256, batch * BLOCK_BYTES, dtype=np.uint8)
        dst = bytearray(batch * BLOCK_BYTES)
        batches = [keys[i : i + batch] for i in range(0, blocks, batch)]
        nbytes = blocks * BLOCK_BYTES

        def put() -> None:
            for b in batches:
                res = self.tier.put(ns, b, src[: len(b) * BLOCK_BYTES])
                if res.dropped:
                    raise RuntimeError(f"{self.label}: {res.dropped} blocks dropped")

        def get() -> None:
            for b in batches:
                if self.tier.get_into(ns, b, memoryview(dst)[: len(b) * BLOCK_BYTES]) != len(b):
                    raise RuntimeError(f"{self.label}: read back a short prefix")

        out = measure(self.pids, put, nbytes), measure(self.pids, get, nbytes)
        self.tier.delete_namespace(ns)
        return out


def floor_per_gb() -> float:
    """CPU-s/GB of the minimum a verified copy costs: xxh3-64 + one memcpy (over 2 GB,
    so the figure is well above the CPU clock's resolution)."""
    src = np.random.default_rng(0).integers(0, 256, BATCH_BLOCKS * BLOCK_BYTES, dtype=np.uint8)
    dst = np.empty_like(src)
    rounds = (2 << 30) // src.nbytes
    c0 = self_cpu_s()
    for _ in range(rounds):
        xxhash.xxh3_64_intdigest(src.data)
        np.copyto(dst, src)
    return (self_cpu_s() - c0) / (rounds * src.nbytes / 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16 MiB per phase instead of 64 MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=BATCH_BLOCKS, help="blocks per put/get call")
    args = ap.parse_args()
    blocks = (16 << 20 if args.quick else 64 << 20) // BLOCK_BYTES
    # One node alone, and three nodes: separate processes so "1 node" has no idle peers.
    with (
        tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp,
        LocalCluster(Path(tmp) / "one", 1, "1GiB") as one,
        LocalCluster(Path(tmp) / "three", 3, "1GiB") as three,
    ):
        cases = [Case(one, 1, 1), Case(three, 3, 1), Case(three, 3, 2)]
        results: dict[str, list[tuple[Phase, Phase]]] = {c.label: [] for c in cases}
        floors = []
        run = 0
        for _ in range(max(3, args.rounds)):
            floors.append(floor_per_gb())
            for c in cases:
                run += 1
                results[c.label].append(c.run(run, blocks, args.batch))
        for c in cases:
            c.tier.close()
    floor = statistics.median(floors)
    print(
        f"# cluster CPU cost ({machine()}), {blocks} x 256 KiB blocks per phase, "
        f"{args.batch} per call, "
        f"median of {max(3, args.rounds)} interleaved rounds"
    )
    print(f"floor (xxh3-64 + memcpy, in process): {floor:.3f} CPU-s/GB\n")
    print(
        "| configuration | phase | client CPU-s/GB | nodes CPU-s/GB | total CPU-s/GB | x floor | "
        "wall GB/s |"
    )
    print("|---|---|---|---|---|---|---|")
    med: dict[tuple[str, str], float] = {}
    for label, runs in results.items():
        for j, phase in enumerate(("put", "get")):
            ph = [r[j] for r in runs]
            cl = statistics.median(p.client_s / p.gb for p in ph)
            nd = statistics.median(p.nodes_s / p.gb for p in ph)
            tot = statistics.median(p.total_per_gb for p in ph)
            gbs = statistics.median(p.gb / p.wall_s for p in ph)
            med[(label, phase)] = tot
            row = f"{cl:.2f} | {nd:.2f} | {tot:.2f} | {tot / floor:.1f} | {gbs:.3f}"
            print(f"| {label} | {phase} | {row} |")
    print()
    for phase in ("put", "get"):
        r1, r2 = med[("3 nodes, R=1", phase)], med[("3 nodes, R=2", phase)]
        n1, n3 = med[("1 node, R=1", phase)], med[("3 nodes, R=1", phase)]
        print(
            f"{phase}: R=2 / R=1 (3 nodes) = {r2 / r1:.2f}; 3 nodes / 1 node (R=1) = {n3 / n1:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
