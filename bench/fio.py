"""fio as the benches' peer: one fio run's throughput and latency (``run_job`` and
``rates`` for the SSD and shared-FS benches), the file laid out before any measured
round, quiet between cases, and rounds interleaved with alternating order (so ours and
fio's follow each other's writes equally often)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def fio(
    path: Path, rw: str, bs: int, qd: int, size: int, seconds: float, *, batch: bool = False
) -> dict[str, float]:
    """fio on ``path``; ``batch``: ``qd`` writes and their fdatasync go in together and all
    complete before the next batch (a group commit's shape)."""
    depth = qd + 1 if batch else qd
    args = [
        "fio",
        "--name=b",
        f"--filename={path}",
        f"--size={size}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--iodepth={depth}",
        "--ioengine=io_uring",
        "--direct=1",
        f"--runtime={runtime_arg(seconds)}",
        "--time_based",
        "--norandommap",
        "--randrepeat=0",
        "--output-format=json",
    ]
    if rw == "randwrite":
        args.append(f"--fdatasync={qd}")
    if batch:
        args += [f"--iodepth_batch_submit={depth}", f"--iodepth_batch_complete_min={depth}"]
    mbps, p50_ns, p99_ns = rates(run_job(args), rw)
    return {"MBps": mbps, "p50_us": p50_ns / 1e3, "p99_us": p99_ns / 1e3}


def run_job(args: list[str]) -> dict[str, Any]:
    """Run fio (``args`` with ``--output-format=json``); its first job's report."""
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    job: dict[str, Any] = json.loads(out[out.index("{") :])["jobs"][0]
    return job


def rates(job: dict[str, Any], rw: str) -> tuple[float, float, float]:
    """A job's MB/s and median and 99th-percentile completion latency (ns) for ``rw``."""
    j = job["read" if rw == "randread" else "write"]
    pct = j["clat_ns"].get("percentile", {})
    return j["bw_bytes"] / 1e6, pct.get("50.000000", 0), pct.get("99.000000", 0)


def runtime_arg(seconds: float) -> str:
    """fio's ``--runtime`` in milliseconds: a bare ``1.5`` is read as whole seconds (fio
    ran 1.0 s against our 1.5 s, and a case that starts on a rested disk gets a larger
    share of its burst in a shorter run)."""
    return f"{round(seconds * 1000)}ms"


def lay_out(path: Path, size: int) -> None:
    """Have fio create its file now, so no measured round pays for the layout."""
    subprocess.run(
        ["fio", "--name=b", f"--filename={path}", f"--size={size}", "--create_only=1"],
        capture_output=True,
        check=True,
    )


def settle(seconds: float) -> None:
    """Let the disk go quiet between cases: what the last case wrote is flushed first."""
    os.sync()
    time.sleep(seconds)


def alternating_rounds(
    cases: dict[str, Callable[[], float]], runs: int, settle_s: float
) -> dict[str, float]:
    """Each case once per round, rounds interleaved; odd rounds run the cases in reverse
    order, so no case always follows the same neighbour (a write case leaves the disk
    busier than a read). Returns each case's median."""
    results: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    for r in range(max(3, runs)):
        for name in order if r % 2 == 0 else order[::-1]:
            settle(settle_s)
            results[name].append(cases[name]())
    return {name: statistics.median(v) for name, v in results.items()}
