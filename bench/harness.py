"""Shared benchmark discipline (DESIGN §12): seeded, interleaved, median of >= 3 runs,
every figure a ratio against a limit or a peer measured in the same run."""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvstore.keys import Namespace


def median_interleaved(cases: dict[str, Callable[[], float]], runs: int = 5) -> dict[str, float]:
    """Run each case once per round, rounds interleaved, and return the median of each.

    Interleaving spreads machine noise (another tenant, a frequency change) evenly over
    the cases being compared, which matters more than the run count on a 2-core VM.
    Each callable returns its own figure (seconds, or a rate).
    """
    results: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(max(3, runs)):
        for name, fn in cases.items():
            results[name].append(fn())
    return {name: statistics.median(v) for name, v in results.items()}


def on_callers(
    loop: Callable[[int, list[float]], int], callers: int
) -> tuple[int, float, list[float]]:
    """``loop(k, lat)`` on ``callers`` threads at once (inline for one), each appending its
    calls' latencies to ``lat`` and returning the units it moved; returns (units, seconds
    of the whole run, every latency). Benches use it for depth shared by N callers."""
    lats: list[list[float]] = [[] for _ in range(callers)]
    t0 = time.perf_counter()
    if callers == 1:
        done = loop(0, lats[0])
    else:
        with ThreadPoolExecutor(callers) as pool:
            done = sum(pool.map(loop, range(callers), lats))
    return done, time.perf_counter() - t0, [x for lat in lats for x in lat]


def byte_namespace(model_id: str, block_bytes: int) -> Namespace:
    """A namespace whose blocks are exactly ``block_bytes`` (a multiple of 128): uint8 K and
    V of 64 tokens x 1 head, so ``head_dim`` alone sets the size. The storage benches use
    it to store opaque blocks of a chosen size."""
    if block_bytes <= 0 or block_bytes % 128:
        raise ValueError(f"block size {block_bytes} is not a positive multiple of 128 bytes")
    return Namespace(
        model_id=model_id,
        model_revision="r",
        kv_dtype="uint8",
        kv_layout="mha",
        cached_layers=(0,),
        kv_heads=1,
        head_dim=block_bytes // 128,
        block_tokens=64,
    )


def timed(fn: Callable[[], object], repeat: int = 1) -> float:
    """Seconds per call of ``fn`` over ``repeat`` calls."""
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t0) / repeat


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


_PHASE_LOCK = threading.Lock()


class PhaseTimes(dict[str, float]):
    """Wall seconds per label, summed over the calls of the functions ``wrap`` timed
    (the profiles: where a call's time goes, phase by phase)."""

    def wrap(self, fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        lock = _PHASE_LOCK  # timed calls may run on several threads at once

        def run(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t
                with lock:
                    self[label] = self.get(label, 0.0) + dt

        return run


def profile_args(
    doc: str, prog: str, default_dir: str, default_ws: int, calls_help: str
) -> argparse.ArgumentParser:
    """A parser with the options every ``profile_ssd_*`` diagnosis takes (``--dir --ws
    --qd --calls --rounds --callers``), for the caller to add its own to; after parsing,
    ``check_callers`` refuses a ``--callers`` that does not divide ``--qd``."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    ap.add_argument("--dir", type=Path, default=Path(default_dir))
    ap.add_argument("--ws", type=int, default=default_ws, help="bytes stored first")
    ap.add_argument("--qd", type=int, default=32, help="blocks in flight (over all callers)")
    ap.add_argument("--calls", type=int, default=300, help=calls_help)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--callers", type=int, default=1, help="threads calling at once")
    return ap


def check_callers(ap: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """``qd // callers`` (blocks per call of one caller), or exit 2 with one line."""
    if a.callers < 1 or a.qd % a.callers:
        ap.exit(2, f"{ap.prog}: error: --callers must divide --qd\n")
    return int(a.qd // a.callers)


@dataclass(frozen=True)
class Round:
    """One timed round of callers: wall and CPU seconds (user, system) of the process."""

    wall_s: float
    user_s: float
    sys_s: float


def timed_round(loop: Callable[[int], None], callers: int) -> Round:
    """``loop(k)`` on ``callers`` threads at once, timed (wall and the process's CPU)."""
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(loop, range(callers)))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return Round(wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime)
