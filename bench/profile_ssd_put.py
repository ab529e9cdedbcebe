"""Where a put's time goes: wall and CPU per call, split by phase (a diagnosis, not a ratio).

A put-only loop of ``qd`` new 256 KiB blocks per call on a full store (every put evicts),
as in ``bench.bench_ssd``, with wall-clock timers around the phases of the write path:
``present_set`` (index look-up), ``reserve`` (free slots, evicting), ``write_slots``
(encode, submit, wait for the writes and the data sync; the publishing transaction is
filled inside it while the device works), ``groupcommit`` (all of it plus the commit),
the io_uring calls (``submit``, ``wait_cqe``: time blocked on the device) and
``lmdb_write_begin`` (waiting for LMDB's writer lock). ``--callers N``: N threads put
``qd/N`` blocks per call each (two group commits in flight); phases are then summed over
the threads, per call of the whole (``qd`` blocks), so they can add up to more than the
wall time per call.
Run alone: ``/work/bin/cpu-exclusive .venv/bin/python -m bench.profile_ssd_put``.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.harness import PhaseTimes
from bench.ssd_store import Ours
from storage_nodes.ssd import allocator, blockio, index, lookup, writer

_ACC = PhaseTimes()
_timed = _ACC.wrap


def _instrument() -> None:
    import liburing as lu

    for cls, name in (
        (allocator.SlotAllocator, "reserve"),
        (blockio.BlockIO, "write_slots"),
        (lookup.LiveIndex, "present_set"),
        (writer.GroupCommit, "write"),
        (index.Index, "begin_write"),
    ):
        label = {"write": "groupcommit", "begin_write": "lmdb_write_begin"}.get(name, name)
        setattr(cls, name, _timed(getattr(cls, name), label))
    from storage_nodes.ssd import uring

    lu.io_uring_submit = _timed(lu.io_uring_submit, "submit")
    uring._wait_cqes = _timed(uring._wait_cqes, "wait_cqe")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("bench/out/profile-put"))
    ap.add_argument("--ws", type=int, default=512 << 20, help="bytes stored first")
    ap.add_argument("--qd", type=int, default=32, help="blocks per put")
    ap.add_argument("--calls", type=int, default=300, help="puts per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--callers", type=int, default=1, help="threads putting at once")
    ap.add_argument(
        "--no-checksums",
        action="store_true",
        help="let the tier hash the payloads (the write-back passes the commit's checksums)",
    )
    a = ap.parse_args()
    _instrument()
    ours = Ours(a.dir, 256 << 10, a.ws, "auto", "fast")
    if a.callers < 1 or a.qd % a.callers:
        ap.exit(2, "profile_ssd_put: error: --callers must divide --qd\n")
    per = a.qd // a.callers
    sums = None if a.no_checksums else ours.checksums(a.qd)

    def loop(k: int) -> None:
        src = ours.src[k * per * ours.bb : (k + 1) * per * ours.bb]
        mine = None if sums is None else sums[k * per : (k + 1) * per]
        for _ in range(a.calls):
            keys = [ours.rng.randbytes(16) for _ in range(per)]
            ours.tier.put(ours.ns, keys, src, checksums=mine)

    try:
        for r in range(a.rounds):
            _ACC.clear()
            t0 = time.perf_counter()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            with ThreadPoolExecutor(a.callers) as pool:
                list(pool.map(loop, range(a.callers)))
            wall = time.perf_counter() - t0
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            n = a.calls
            print(
                f"round {r}: {wall / n * 1e3:.2f} ms/call, "
                f"{n * a.qd * ours.bb / wall / 1e6:.0f} MB/s; CPU user "
                f"{(r1.ru_utime - r0.ru_utime) / n * 1e3:.2f} sys "
                f"{(r1.ru_stime - r0.ru_stime) / n * 1e3:.2f} ms/call; "
                + ", ".join(f"{k} {v / n * 1e3:.2f}" for k, v in sorted(_ACC.items()))
            )
    finally:
        ours.close()
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
