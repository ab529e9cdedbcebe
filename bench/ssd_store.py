"""The SSD store the SSD benches and profiles drive (``bench.bench_ssd``,
``bench.profile_ssd_get``, ``bench.profile_ssd_put``): a fresh ``SSDTier`` filled with
whole slabs of random blocks, its caller rows in page-aligned memory, and timed loops
of gets and puts on one or more caller threads. It stands apart from the bench so the
profiles use the very loops the bench measures."""

from __future__ import annotations

import mmap
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xxhash

from bench.harness import byte_namespace, on_callers
from kvstore.buffers import io_buffer
from kvstore.keys import Namespace
from storage_nodes.ssd import SSDConfig, SSDTier
from storage_nodes.ssd.config import slot_bytes_for

#: the kinds of caller memory the benches can hand the tier (``Ours(rows=...)``)
ROWS = ("huge", "shared")


def ns_for(block_bytes: int) -> Namespace:
    return byte_namespace(f"bench-{block_bytes}", block_bytes)


class Ours:
    def __init__(
        self,
        d: Path,
        block_bytes: int,
        ws_bytes: int,
        backend: str,
        durability: str,
        unaligned: bool = False,
        rows: str = "huge",
    ) -> None:
        shutil.rmtree(d, ignore_errors=True)
        slab = 64 << 20
        cap = (ws_bytes * 9 // 8 // slab + 1) * slab
        self.tier = SSDTier(
            SSDConfig(
                dir=d,
                capacity_bytes=cap,
                slab_bytes=slab,
                io_backend=backend,
                staging_max_bytes=160 << 20,
                index_durability=durability,
            )
        )
        self.ns = ns_for(block_bytes)
        self.tier.register(self.ns)
        self.bb = block_bytes
        self.rng = random.Random(1)
        # Caller rows in page-aligned memory: the tier then moves payloads without a
        # staging copy. ``rows``: "huge" — ``io_buffer``, as the DRAM tier's pool (the
        # write-back's source) and the engine's load rows are; "shared" — a shared
        # anonymous mapping on 4 KiB pages, as the daemon's shared-memory segment is (a
        # block then reaches the disk in up to 64 segments). ``--unaligned`` offsets them
        # by 64 bytes, which forces the staging copy.
        if rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {rows!r}")
        self.rows = rows
        skew = 64 if unaligned else 0
        self._src_map, self._dst_map = (self.rows_mapping(32 * block_bytes + 4096) for _ in "sd")
        self.src = np.frombuffer(self._src_map, np.uint8, 32 * block_bytes, skew)
        self.src[:] = np.random.default_rng(1).integers(0, 256, self.src.size, dtype=np.uint8)
        self.dst = memoryview(self._dst_map)[skew : skew + 32 * block_bytes]
        #: the commit's checksums of ``src``'s rows: the write-back hands the SSD tier the
        #: checksum made at commit (DESIGN §4), so the tier does not hash again
        self.sums = [
            xxhash.xxh3_64_intdigest(self.src[i * block_bytes : (i + 1) * block_bytes].tobytes())
            for i in range(32)
        ]
        self.pass_checksums = True
        self.keys: list[bytes] = []
        # Whole slabs only: every slot of every slab file then holds a written block, so
        # fio's read peer can read the very files our gets read (``slab_files``).
        per_slab = slab // slot_bytes_for(block_bytes)
        n = max(1, ws_bytes // block_bytes // per_slab) * per_slab
        for start in range(0, n, 32):
            keys = [self.rng.randbytes(16) for _ in range(min(32, n - start))]
            self.tier.put(self.ns, keys, self.src[: len(keys) * block_bytes])
            self.keys += keys
        #: the slab files the fill wrote, every slot of them (the disk's blocks our gets read)
        self.slab_files = sorted((d / "slabs").glob("slab-*"))
        self.slab_bytes = slab
        held = self.tier.stats().counters["blocks"]
        if held != n or len(self.slab_files) * per_slab != n:
            raise RuntimeError(
                f"bench fill: {held} of {n} blocks in {len(self.slab_files)} slab files of"
                f" {per_slab} slots; fio would read slots never written"
            )
        # A cache's steady state: recency no longer follows the fill. Right after a fill
        # the least recent blocks lie in slot order, so a put's evictions free adjacent
        # slots of one or two slab files — a favourable shape that fio's random writes
        # over all the files do not have (RESULTS, "Item 9, stop 25": 0.82-0.89x fresh
        # against 0.64-0.69x once gets had reordered recency). Every block is touched
        # once, in random order, before anything is measured.
        order = self.keys[:]
        self.rng.shuffle(order)
        for start in range(0, len(order), 32):
            self.tier.touch(self.ns, order[start : start + 32])
        self.tier.flush_touches()

    def rows_mapping(self, nbytes: int) -> mmap.mmap:
        """Memory of the kind this store's caller rows are (``rows``)."""
        return io_buffer(nbytes) if self.rows == "huge" else mmap.mmap(-1, nbytes)

    def checksums(self, qd: int) -> list[int] | None:
        return self.sums[:qd] if self.pass_checksums else None

    def get(self, qd: int, seconds: float, callers: int = 1) -> dict[str, float]:
        """``callers`` threads, each calling ``get_into`` of ``qd // callers`` random blocks
        in a loop: at most ``qd`` reads in flight, as fio's ``--iodepth``."""
        per = qd // callers
        seeds = [self.rng.randrange(1 << 62) for _ in range(callers)]

        def loop(k: int, lat: list[float]) -> int:
            rng, done = random.Random(seeds[k]), 0
            view = self.dst[k * per * self.bb : (k + 1) * per * self.bb]
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                keys = rng.sample(self.keys, per)
                s = time.perf_counter()
                got = self.tier.get_into(self.ns, keys, view)
                lat.append(time.perf_counter() - s)
                if got != per:
                    raise RuntimeError(f"bench get returned {got} of {per} blocks")
                done += got
            return done

        return self._run(loop, callers)

    def put(self, qd: int, seconds: float, callers: int = 1) -> dict[str, float]:
        """``callers`` threads, each putting ``qd // callers`` new blocks per call (its own
        rows of the source): at most ``qd`` writes in flight."""
        per = qd // callers
        sums = self.checksums(qd)
        seeds = [self.rng.randrange(1 << 62) for _ in range(callers)]  # new keys every run

        def loop(k: int, lat: list[float]) -> int:
            rng, done = random.Random(seeds[k]), 0
            src = self.src[k * per * self.bb : (k + 1) * per * self.bb]
            mine = None if sums is None else sums[k * per : (k + 1) * per]
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                keys = [rng.randbytes(16) for _ in range(per)]
                s = time.perf_counter()
                r = self.tier.put(self.ns, keys, src, checksums=mine)
                lat.append(time.perf_counter() - s)
                if r.inserted != per:
                    raise RuntimeError(f"bench put stored {r.inserted} of {per} blocks: {r}")
                done += per
            # Inside the measured time: the data synced behind the puts is durable before
            # the run counts as done, as fio's last fdatasync is part of its run.
            if not self.tier.sync():
                raise RuntimeError("bench put: the SSD tier's data sync failed")
            return done

        rounds = self.tier.stats().counters["data_sync_rounds"]
        out = self._run(loop, callers)
        calls = out["MBps"] * out["seconds"] * 1e6 / (per * self.bb)
        out["sync_rounds_per_call"] = (
            self.tier.stats().counters["data_sync_rounds"] - rounds
        ) / max(calls, 1)
        self.keys = self.tier.iter_keys(self.ns)  # puts evicted the least recent blocks
        return out

    def _run(self, loop: Callable[[int, list[float]], int], callers: int) -> dict[str, float]:
        """``loop(k, lat)`` on ``callers`` threads at once; MB/s over the whole run."""
        done, elapsed, lat = on_callers(loop, callers)
        return _summary(done * self.bb, elapsed, lat)

    def close(self) -> dict[str, str]:
        info = dict(self.tier.stats().info)
        self.tier.close()
        return info


def _summary(nbytes: int, elapsed: float, lat: list[float]) -> dict[str, float]:
    lat.sort()
    return {
        "seconds": elapsed,
        "MBps": nbytes / elapsed / 1e6,
        "p50_us": lat[len(lat) // 2] * 1e6,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
    }
