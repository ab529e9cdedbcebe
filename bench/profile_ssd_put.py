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
Run alone: ``.venv/bin/python -m bench.profile_ssd_put``.
"""

from __future__ import annotations

import shutil

from bench.harness import PhaseTimes, check_callers, profile_args, timed_round
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
    ap = profile_args(
        __doc__, "profile_ssd_put", "bench/out/profile-put", 512 << 20, "puts per round"
    )
    ap.add_argument(
        "--no-checksums",
        action="store_true",
        help="let the tier hash the payloads (the write-back passes the commit's checksums)",
    )
    a = ap.parse_args()
    per = check_callers(ap, a)
    _instrument()
    ours = Ours(a.dir, 256 << 10, a.ws, "auto", "fast")
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
            got = timed_round(loop, a.callers)
            wall = got.wall_s
            n = a.calls
            print(
                f"round {r}: {wall / n * 1e3:.2f} ms/call, "
                f"{n * a.qd * ours.bb / wall / 1e6:.0f} MB/s; CPU user "
                f"{got.user_s / n * 1e3:.2f} sys {got.sys_s / n * 1e3:.2f} ms/call; "
                + ", ".join(f"{k} {v / n * 1e3:.2f}" for k, v in sorted(_ACC.items()))
            )
    finally:
        ours.close()
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
