"""What bounds a verified SSD get on this machine: the tier's get against bare reads of
the same shape, with and without touching what they read (a diagnosis beside
``bench.bench_ssd``, whose peer is fio).

fio's reads never look at the bytes they move; a get must (DESIGN §4: the payload's
xxh3 is checked in the caller's row as each read lands). The cases, each ``qd`` random
slots of the store's own slab files per call, in page-aligned rows, on the tier's own
I/O backend:

* ``raw``: the reads alone, two segments per slot (header page, payload), as the tier
  issues them — no look-up, no header check, no hash;
* ``raw_hash``: the same, plus the payload's xxh3 as each read lands (the bytes a
  verified get must touch, and nothing of the store);
* ``raw_spin``: the same, plus a busy wait as long as that hash per read (CPU time
  without the memory traffic: tells the two costs apart);
* ``get``: ``SSDTier.get_into`` of ``qd`` random stored blocks (look-up, header check,
  hash, recency).

All are compared with ``fio --rw=randread --iodepth=qd`` on the same files, in the rounds
of ``bench.fio.bracketed_rounds`` (every run of ours between two fio runs). Run alone:
``.venv/bin/python -m bench.ssd_get_bounds``.

``--op put`` asks the same of the write path, against ``fio --rw=randwrite
--fdatasync=qd``: ``raw_write`` (``qd`` slot writes of two segments per call, the call's
files synced at its end), ``raw_write_spin`` (the same with a busy wait of ``--spin-us``
while the writes are in flight: a virtual disk served by the host's CPUs may slow down
while the guest computes), ``raw_write_behind`` (the writes alone, every file synced
once when the run ends, inside its time: the shape of a put whose data is synced
behind, with nothing of the store) and ``put`` (``SSDTier.put`` of ``qd`` new blocks,
its data synced behind; the bench's last sync inside its time too).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import xxhash

from bench.fio import bracketed_rounds, fio, fio_memory_like
from bench.harness import machine, on_callers
from bench.ssd_store import ROWS, Ours
from kvstore.buffers import io_buffer
from storage_nodes.ssd.config import slot_bytes_for
from storage_nodes.ssd.io_backend import IOBackend, IORequest

BLOCK = 256 << 10
HEAD = 4096


#: one call of a caller thread, on its own random stream
Call = Callable[[random.Random], None]
#: a caller thread's call, given its rows, its header pages and its slots per call
Caller = Callable[[memoryview, memoryview, int], Call]


class BareSlots:
    """Calls of ``qd // callers`` reads or writes of random slots of the store's slab
    files on ``io`` (two segments a slot, as the tier moves them), from ``callers``
    threads (each with rows of its own)."""

    def __init__(self, ours: Ours, io: IOBackend, qd: int) -> None:
        self._io, self._qd = io, qd
        self._sb = slot_bytes_for(BLOCK)
        self._per_slab = ours.slab_bytes // self._sb
        flags = os.O_RDONLY | (os.O_DIRECT if hasattr(os, "O_DIRECT") else 0)
        self._fds = [os.open(f, flags) for f in ours.slab_files]
        self._rows = memoryview(ours.rows_mapping(qd * BLOCK))  # the memory ours reads into
        self._heads = memoryview(io_buffer(qd * HEAD))
        self._seed = random.Random(7)
        sample = self._rows[:BLOCK]
        t0 = time.perf_counter()
        for _ in range(200):
            xxhash.xxh3_64_intdigest(sample)
        #: one payload's hash, timed on a row in cache: what ``raw_spin`` waits per read
        self.hash_s = (time.perf_counter() - t0) / 200

    def _slots(
        self, rng: random.Random, fds: list[int], rows: memoryview, heads: memoryview, n: int
    ) -> list[IORequest]:
        """``n`` requests for random slots of ``fds``: header page ``j`` of ``heads`` and
        row ``j`` of ``rows`` each, as the tier moves a slot."""
        return [
            IORequest(
                rng.choice(fds),
                rng.randrange(self._per_slab) * self._sb,
                rows[j * BLOCK : (j + 1) * BLOCK],
                head=heads[j * HEAD : (j + 1) * HEAD],
            )
            for j in range(n)
        ]

    def _timed(
        self, seconds: float, callers: int, caller: Caller, last: Callable[[], None] | None = None
    ) -> float:
        """MB/s of payload over ``seconds`` of back-to-back calls on ``callers`` threads;
        ``caller(rows, heads, per)`` gives a thread's call (of ``per`` slots, in its own
        rows and header pages); ``last``, run by each thread after its calls, is timed
        too."""
        per = self._qd // callers
        seeds = [self._seed.randrange(1 << 62) for _ in range(callers)]

        def loop(k: int, lat: list[float]) -> int:
            rng, n = random.Random(seeds[k]), 0
            rows = self._rows[k * per * BLOCK : (k + 1) * per * BLOCK]
            heads = self._heads[k * per * HEAD : (k + 1) * per * HEAD]
            call = caller(rows, heads, per)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                call(rng)
                n += per
            if last is not None:
                last()
            return n

        done, elapsed, _ = on_callers(loop, callers)
        return done * BLOCK / elapsed / 1e6

    def run(self, seconds: float, landed: str, callers: int = 1) -> float:
        """Reads; per landed read: nothing (``"none"``), its payload's xxh3 (``"hash"``)
        or a busy wait of ``hash_s`` (``"spin"``)."""

        def caller(rows: memoryview, heads: memoryview, per: int) -> Call:
            def hashed(i: int, res: int) -> None:
                xxhash.xxh3_64_intdigest(rows[i * BLOCK : (i + 1) * BLOCK])

            def spun(i: int, res: int) -> None:
                end = time.perf_counter() + self.hash_s
                while time.perf_counter() < end:
                    pass

            on_done = {"none": None, "hash": hashed, "spin": spun}[landed]

            def call(rng: random.Random) -> None:
                res = self._io.read_batch(self._slots(rng, self._fds, rows, heads, per), on_done)
                if any(r <= 0 for r in res):
                    raise RuntimeError(f"bare read failed: {min(res)}")

            return call

        return self._timed(seconds, callers, caller)

    def run_writes(
        self, seconds: float, spin_s: float, callers: int = 1, *, behind: bool = False
    ) -> float:
        """Writes, each call's files synced at its end as fio's ``--fdatasync=qd`` does
        (``behind``: no sync per call, every file synced once when a thread's calls end);
        ``spin_s``: a busy wait once the writes are in flight, as long as the CPU work a
        put does then (its later reservation, its publishing transaction)."""

        def spin() -> None:
            end = time.perf_counter() + spin_s
            while time.perf_counter() < end:
                pass

        def caller(rows: memoryview, heads: memoryview, per: int) -> Call:
            def call(rng: random.Random) -> None:
                reqs = self._slots(rng, self._wfds, rows, heads, per)
                fds = list(dict.fromkeys(r.fd for r in reqs))
                res, synced = self._io.write_and_sync(
                    reqs, [] if behind else fds, between=spin if spin_s else None
                )
                if any(r <= 0 for r in res) or any(r < 0 for r in synced):
                    raise RuntimeError("bare write or its sync failed")

            return call

        def sync_all() -> None:
            if any(r < 0 for r in self._io.sync(self._wfds)):
                raise RuntimeError("bare sync failed")

        return self._timed(seconds, callers, caller, sync_all if behind else None)

    def open_for_writes(self, ours: Ours) -> None:
        """Write descriptors of the slab files, for ``run_writes``."""
        flags = os.O_WRONLY | (os.O_DIRECT if hasattr(os, "O_DIRECT") else 0)
        self._wfds = [os.open(f, flags) for f in ours.slab_files]
        self._fds += self._wfds  # closed with the rest

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("bench/out/get-bounds"))
    ap.add_argument("--ws", type=int, default=1 << 30, help="bytes stored first")
    ap.add_argument("--qd", type=int, default=32, help="reads per call")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--runs", type=int, default=7, help="rounds (at least 3)")
    ap.add_argument("--settle-s", type=float, default=0.5)
    ap.add_argument(
        "--callers",
        type=int,
        default=1,
        help="threads, each calling with qd/N reads (at most qd in flight, as bench_ssd)",
    )
    ap.add_argument(
        "--rows",
        choices=ROWS,
        default="huge",
        help="memory read into, as bench_ssd --rows (fio's buffers match it)",
    )
    ap.add_argument(
        "--op",
        choices=("get", "put"),
        default="get",
        help="put: the tier's put against bare writes (raw_write), bare writes with a "
        "busy wait while they are in flight (raw_write_spin) and fio_write",
    )
    ap.add_argument(
        "--spin-us",
        type=float,
        default=500.0,
        help="raw_write_spin's busy wait per call (a one-caller put of 32 does ~500 µs "
        "of CPU work while its writes are in flight)",
    )
    a = ap.parse_args()
    if a.callers < 1 or a.qd % a.callers:
        ap.exit(2, "ssd_get_bounds: error: --callers must divide --qd\n")
    ours = Ours(a.dir, BLOCK, a.ws, "auto", "fast", rows=a.rows)
    bare = BareSlots(ours, ours.tier.io_backend, a.qd)
    size = len(ours.slab_files) * ours.slab_bytes
    if a.op == "get":
        own = {
            "raw": lambda: bare.run(a.seconds, "none", a.callers),
            "raw_hash": lambda: bare.run(a.seconds, "hash", a.callers),
            "raw_spin": lambda: bare.run(a.seconds, "spin", a.callers),
            "get": lambda: ours.get(a.qd, a.seconds, a.callers)["MBps"],
        }
        base, rw = "raw_hash", "randread"
    else:
        bare.open_for_writes(ours)
        own = {
            "raw_write": lambda: bare.run_writes(a.seconds, 0.0, a.callers),
            "raw_write_spin": lambda: bare.run_writes(a.seconds, a.spin_us / 1e6, a.callers),
            "raw_write_behind": lambda: bare.run_writes(a.seconds, 0.0, a.callers, behind=True),
            "put": lambda: ours.put(a.qd, a.seconds, a.callers)["MBps"],
        }
        base, rw = "raw_write", "randwrite"
    peer = "fio_read" if a.op == "get" else "fio_write"
    print(
        f"# {machine()}; qd {a.qd} over {a.callers} caller(s); "
        f"hash of one payload {bare.hash_s * 1e6:.1f} µs (in cache)"
    )
    with contextlib.ExitStack() as stack:
        huge = fio_memory_like(stack, a.rows, a.qd, BLOCK)

        def fio_peer() -> float:
            return fio(ours.slab_files, rw, BLOCK, a.qd, size, a.seconds, huge=huge)["MBps"]

        got = bracketed_rounds(own, {peer: fio_peer}, a.runs, a.settle_s)
    bare.close()
    info = ours.close()
    print(f"# io_backend={info['io_backend']} direct_io={info['direct_io']}")
    print(f"\n| case | MB/s | ratio to {peer}, per round: median [min–max] | ratio to {base} |")
    print("|---|---|---|---|")
    print(f"| {peer} | {got.median(peer):.0f} | 1 | |")
    for name in own:
        r = got.ratios(name, peer)
        to_hash = [x / h for x, h in zip(got.values[name], got.values[base], strict=True)]
        print(
            f"| {name} | {got.median(name):.0f} | {statistics.median(r):.2f} "
            f"[{min(r):.2f}–{max(r):.2f}] | {statistics.median(to_hash):.2f} |"
        )
    print(json.dumps({k: [round(x) for x in v] for k, v in got.values.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
