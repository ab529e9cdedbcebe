"""Scale of the SSD engine's LMDB index (issue "SSD engine", item 7).

Builds an index of N synthetic entries (default 10 million: every record the engine
keeps per block — key, recency and slot map — for 2 KiB blocks in 256 MiB slabs, bulk
loaded in key order), then in a fresh process opens an ``SSDTier`` on it and measures:
open time (limit 2 s), RSS growth of the open (limit 200 MB; anonymous and file-backed
pages reported apart, since LMDB pages touched by lookups are mapped file pages), and
the cost of ``contains`` lookups of random present keys, as a ratio to the same lookups
on a 100,000-entry index built the same way (median of 3 interleaved runs).

Run: ``.venv/bin/python -m bench.bench_ssd_index`` (``--entries`` to change N).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import machine
from kvstore.keys import Namespace

SLAB_BYTES = 256 << 20
_CHILD = r"""
import json, random, sys, time
def rss():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) * 1024
    return out
from storage_nodes.ssd import SSDConfig, SSDTier
from bench.bench_ssd_index import ns, key_of
d, n, cap, lookups = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
before = rss()
t0 = time.perf_counter()
tier = SSDTier(SSDConfig(dir=d, capacity_bytes=cap, slab_bytes=%d, sweep_interval_s=None))
tier.register(ns())
opened = time.perf_counter() - t0
after_open = rss()
rng = random.Random(5)
keys = [key_of(rng.randrange(n)) for _ in range(lookups)]
t0 = time.perf_counter()
for k in keys:
    if tier.contains(ns(), [k]) != 1:
        raise SystemExit("missing key")
single = (time.perf_counter() - t0) / lookups
t0 = time.perf_counter()
for i in range(0, lookups, 32):
    tier.contains(ns(), keys[i : i + 32])
batched = (time.perf_counter() - t0) / lookups
after = rss()
tier.close()
print(json.dumps(dict(open_s=opened, single_us=single * 1e6, batched_us=batched * 1e6,
                      before=before, after_open=after_open, after_lookups=after)))
""".replace("%d", str(SLAB_BYTES))


def ns() -> Namespace:  # imported by the child too
    return Namespace(
        model_id="index-scale",
        model_revision="r",
        kv_dtype="float16",
        kv_layout="mha",
        cached_layers=(0, 1),
        kv_heads=2,
        head_dim=8,
        block_tokens=16,
    )


def key_of(i: int) -> bytes:
    # Keys in build order are also in sort order, so LMDB can bulk-append; lookups
    # pick them at random, which is what makes the B-tree walk cost what it costs.
    return i.to_bytes(16, "big")


def build(d: Path, n: int) -> int:
    """Write an index of ``n`` entries as the engine would have; returns the capacity."""
    from storage_nodes.ssd.config import slot_bytes_for
    from storage_nodes.ssd.index import _FREE, _LOC, _LRU, _SLAB, _SLOT, _U32, Index

    shutil.rmtree(d, ignore_errors=True)
    space = ns()
    per = SLAB_BYTES // slot_bytes_for(space.block_bytes)
    slabs = -(-n // per)
    ix = Index(d / "index", map_bytes=64 << 30, slab_bytes=SLAB_BYTES)
    fp = space.fingerprint
    bucket = int(time.time() // 60)
    with ix.write() as txn:
        for s in range(slabs):
            used = min(per, n - s * per)
            txn.put(_U32.pack(s), _SLAB.pack(space.block_bytes, used), db=ix.slabs)
            # the last slab's unused slots are free, as the engine would have them
            for slot in range(used, per):
                txn.put(_FREE.pack(space.block_bytes, s, slot), b"", db=ix.free)
        ix.set_seq_high_water(txn, n)
    step = 1_000_000
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        with ix.write() as txn:
            txn.cursor(db=ix.keys).putmulti(
                (
                    (fp + key_of(i), _LOC.pack(i // per, i % per, bucket, i + 1, i + 1))
                    for i in range(lo, hi)
                ),
                append=True,
            )
            txn.cursor(db=ix.lru).putmulti(
                ((_LRU.pack(bucket, i + 1) + fp + key_of(i), b"") for i in range(lo, hi)),
                append=True,
            )
            txn.cursor(db=ix.slots).putmulti(
                ((_SLOT.pack(i // per, i % per), fp + key_of(i)) for i in range(lo, hi)),
                append=True,
            )
    ix.close()
    return slabs * SLAB_BYTES


def measure(d: Path, n: int, cap: int, lookups: int) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", _CHILD, str(d), str(n), str(cap), str(lookups)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--entries", type=int, default=10_000_000)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=20_000)
    ap.add_argument("--dir", type=Path, default=Path("bench/out/ssd-index"))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(f"# {machine()}")
    big, small = a.dir / "big", a.dir / "small"
    t0 = time.perf_counter()
    cap_big = build(big, a.entries)
    print(
        f"# built {a.entries:,} entries in {time.perf_counter() - t0:.1f} s; "
        # blocks on disk, not st_size: written in place the file spans the whole map
        f"index {sum(f.stat().st_blocks * 512 for f in (big / 'index').iterdir()) / 1e9:.2f} "
        "GB on disk"
    )
    cap_small = build(small, a.small)
    res: dict[str, list[dict]] = {"big": [], "small": []}
    for _ in range(max(3, a.runs)):
        res["big"].append(measure(big, a.entries, cap_big, a.lookups))
        res["small"].append(measure(small, a.small, cap_small, a.lookups))
    shutil.rmtree(a.dir, ignore_errors=True)

    def med(which: str, f) -> float:
        return statistics.median(f(r) for r in res[which])

    open_s = med("big", lambda r: r["open_s"])
    grow = med("big", lambda r: r["after_open"]["VmRSS"] - r["before"]["VmRSS"]) / 1e6
    grow_anon = med("big", lambda r: r["after_lookups"]["RssAnon"] - r["before"]["RssAnon"]) / 1e6
    grow_file = med("big", lambda r: r["after_lookups"]["RssFile"] - r["before"]["RssFile"]) / 1e6
    rows = [
        (
            f"open of the {a.entries:,}-entry index",
            f"{open_s:.3f} s",
            "2 s",
            f"{2 / open_s:.1f}x under",
        ),
        (
            "RSS growth of the open",
            f"{grow:.1f} MB",
            "200 MB",
            f"{200 / max(grow, 0.1):.0f}x under",
        ),
        (f"RSS growth after {a.lookups:,} lookups: anonymous", f"{grow_anon:.1f} MB", "200 MB", ""),
        (
            f"RSS growth after {a.lookups:,} lookups: mapped index pages",
            f"{grow_file:.1f} MB",
            "—",
            "page cache, reclaimable",
        ),
    ]
    for kind in ("single_us", "batched_us"):
        b = statistics.median(r[kind] for r in res["big"])
        s = statistics.median(r[kind] for r in res["small"])
        label = "contains of 1 key" if kind == "single_us" else "contains of 32 keys, per key"
        rows.append(
            (
                f"{label}, {a.entries:,} vs {a.small:,} entries",
                f"{b:.2f} µs vs {s:.2f} µs",
                "—",
                f"{b / s:.2f}",
            )
        )
    print(json.dumps(res["big"][0]))
    print("\n| figure | measured | limit | ratio |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
