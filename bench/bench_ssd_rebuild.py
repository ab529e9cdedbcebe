"""Startup after a power cut: the SSD index rebuilt from the slot headers, per TiB.

For each block size, a store of ``--gib`` GiB is filled (the index written without
syncs, the default mode), abandoned as a crash would leave it, and reopened as after a
reboot (another boot id): the open rebuilds the index from the slot headers. Reported:
the open's time, the bytes it read, seconds per TiB of capacity (the scan is linear in
the slots), and the open of the same directory with a trusted index for comparison.
Medians of ``--runs`` reopenings (the page cache is dropped before each, where allowed).

Run: ``.venv/bin/python -m bench.bench_ssd_rebuild`` (about a minute for 2 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from bench.harness import machine
from bench.ssd_store import ns_for
from storage_nodes.ssd import SSDConfig, SSDTier
from storage_nodes.testing.crash import abandon

SIZES = (16 << 10, 256 << 10, 2 << 20)


def _drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def one_size(d: Path, bs: int, gib: int, runs: int) -> dict:
    shutil.rmtree(d, ignore_errors=True)
    cap = gib << 30
    cfg = dict(dir=d, capacity_bytes=cap, slab_bytes=256 << 20, sweep_interval_s=None)
    t = SSDTier(SSDConfig(boot_id=lambda: "fill", **cfg))  # type: ignore[arg-type]
    ns = ns_for(bs)
    t.register(ns)
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, 32 * bs, dtype=np.uint8)
    blocks = int(cap * 0.95) // (bs + 4096)
    for start in range(0, blocks, 32):
        keys = [rng.bytes(16) for _ in range(min(32, blocks - start))]
        t.put(ns, keys, src[: len(keys) * bs])
    stored = t.stats().counters["blocks"]
    abandon(t)  # a crash: no clean marker
    rebuild, trusted, read = [], [], 0
    for i in range(runs):
        dropped = _drop_caches()
        s = time.perf_counter()
        t = SSDTier(SSDConfig(boot_id=f"reboot-{i}".strip, **cfg))  # type: ignore[arg-type]
        rebuild.append(time.perf_counter() - s)
        rep = t.rebuild_report
        assert rep is not None and rep.blocks == stored, (rep, stored)
        read = rep.bytes_read
        abandon(t)  # unclean again, so the next open rebuilds too
    t = SSDTier(SSDConfig(boot_id=lambda: "same", **cfg))  # type: ignore[arg-type]
    t.close()
    for _ in range(runs):
        _drop_caches()
        s = time.perf_counter()
        t = SSDTier(SSDConfig(boot_id=lambda: "later", **cfg))  # type: ignore[arg-type]
        trusted.append(time.perf_counter() - s)
        t.close()
    shutil.rmtree(d, ignore_errors=True)
    med = statistics.median(rebuild)
    return {
        "block": f"{bs >> 10} KiB",
        "capacity_GiB": gib,
        "blocks": stored,
        "rebuild_s": round(med, 2),
        "rebuild_range_s": [round(min(rebuild), 2), round(max(rebuild), 2)],
        "read_MB": round(read / 1e6, 1),
        "rebuild_s_per_TiB": round(med * 1024 / gib),
        "trusted_open_s": round(statistics.median(trusted), 3),
        "page_cache_dropped": dropped,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("bench/out/ssd-rebuild"))
    ap.add_argument("--gib", type=int, default=2, help="capacity filled per block size")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default=None, help="block sizes in KiB, e.g. 16,256")
    a = ap.parse_args()
    sizes = tuple(int(x) << 10 for x in a.sizes.split(",")) if a.sizes else SIZES
    print(f"# {machine()}; dir {a.dir.resolve()}")
    rows = []
    for bs in sizes:
        row = one_size(a.dir / f"{bs >> 10}k", bs, a.gib, a.runs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(
        "\n| block | blocks | rebuild s (median [min–max]) | MB read | s per TiB | trusted open s |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        lo, hi = r["rebuild_range_s"]
        print(
            f"| {r['block']} | {r['blocks']} | {r['rebuild_s']} [{lo}–{hi}] | {r['read_MB']} "
            f"| {r['rebuild_s_per_TiB']} | {r['trusted_open_s']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
