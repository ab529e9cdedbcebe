"""Where a get's time goes: per call of ``qd`` 256 KiB blocks, the time before its first
read reaches the kernel (head), after its last completion (tail), blocked on
completions, CPU, and how much of the run no read of ours was in flight at all (a
diagnosis, not a ratio; the ratio against fio is ``bench.bench_ssd --ops get``).

The loop is ``bench.ssd_store``'s (the one ``bench.bench_ssd`` measures): ``--callers
N`` threads each read ``qd/N`` random stored blocks per call. A call counts as "in
flight" from its first io_uring submission to the return of its last wait for
completions; the union of those intervals over all callers is the time the device had
something of ours to do, and the rest of the wall time is the device idle on our account
(fio's queue never empties). Head, tail and blocked time are summed over the callers,
per ``qd`` blocks read.
Run alone: ``.venv/bin/python -m bench.profile_ssd_get``.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from typing import Any

from bench.harness import check_callers, profile_args, timed_round
from bench.ssd_store import Ours
from storage_nodes.ssd import SSDTier, uring

_local = threading.local()
_lock = threading.Lock()
_calls: list[tuple[float, float, float, float, float]] = []  # start, submit, last, end, wait


def _instrument() -> None:
    submit, wait, get = uring._submit, uring._wait_cqes, SSDTier.get_into

    def timed_submit(ring: Any) -> None:
        if getattr(_local, "first", None) is None:
            _local.first = time.perf_counter()
        submit(ring)

    def timed_wait(ring: Any) -> None:
        if not hasattr(_local, "waited"):  # not inside a get (the data syncer's thread)
            return wait(ring)
        t = time.perf_counter()
        wait(ring)
        _local.last = time.perf_counter()
        _local.waited += _local.last - t

    def timed_get(self: SSDTier, *a: Any, **k: Any) -> int:
        _local.first, _local.last, _local.waited = None, None, 0.0
        t = time.perf_counter()
        try:
            return get(self, *a, **k)
        finally:
            end = time.perf_counter()
            with _lock:
                _calls.append((t, _local.first or t, _local.last or end, end, _local.waited))

    uring._submit = timed_submit
    uring._wait_cqes = timed_wait
    SSDTier.get_into = timed_get  # type: ignore[method-assign]


def _total(f: Any, ms: float) -> float:
    """``f`` summed over the calls, in ms per call of ``qd`` blocks (``ms``: the scale)."""
    return sum(f(c) for c in _calls) * ms


def _idle(calls: list[tuple[float, float, float, float, float]], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] covered by no call's in-flight interval."""
    busy, end = 0.0, t0
    for _, first, last, _, _ in sorted(calls, key=lambda c: c[1]):
        lo, hi = max(first, end), last
        if hi > lo:
            busy += hi - lo
            end = hi
    return (t1 - t0) - busy


def main() -> int:
    ap = profile_args(
        __doc__, "profile_ssd_get", "bench/out/profile-get", 1 << 30, "calls per caller per round"
    )
    a = ap.parse_args()
    per = check_callers(ap, a)
    ours = Ours(a.dir, 256 << 10, a.ws, "auto", "fast")
    _instrument()

    def loop(k: int) -> None:
        rng = random.Random(k)
        view = ours.dst[k * per * ours.bb : (k + 1) * per * ours.bb]
        for _ in range(a.calls):
            if ours.tier.get_into(ours.ns, rng.sample(ours.keys, per), view) != per:
                raise RuntimeError("profile get: a miss")

    try:
        for r in range(a.rounds):
            _calls.clear()
            t0 = time.perf_counter()
            got = timed_round(loop, a.callers)
            t1 = t0 + got.wall_s
            n = len(_calls) / a.callers  # per call of qd blocks in all
            ms = 1e3 / n

            print(
                f"round {r} ({a.callers} x {per}): {(t1 - t0) * ms:.2f} ms per {a.qd} blocks, "
                f"{a.calls * a.callers * per * ours.bb / (t1 - t0) / 1e6:.0f} MB/s; "
                f"CPU user {got.user_s * ms:.2f} sys {got.sys_s * ms:.2f}; "
                f"head {_total(lambda c: c[1] - c[0], ms):.2f} "
                f"tail {_total(lambda c: c[3] - c[2], ms):.2f} "
                f"blocked {_total(lambda c: c[4], ms):.2f}; "
                f"none in flight {_idle(_calls, t0, t1) * ms:.2f} ms",
                flush=True,
            )
    finally:
        ours.close()
        shutil.rmtree(a.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
