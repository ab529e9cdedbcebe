"""``kvstore loadgen`` against a real daemon (issue "Trace-driven load generator", item 4).

The whole Mooncake conversation trace (12,031 requests), verified, at ``--bytes-per-token
32`` (16 KiB blocks, ~3 GB written) with 8 concurrent streams, against ``kvstore serve``
with DRAM 1 GiB over an SSD tier of 4 GiB (holds every block of the trace). Peer measured
in the same rounds: the same replay into the same tiers embedded in the load generator's
process (no gRPC, no second process). Limits: the measured token hit rate within 1 point
of the simulator's prediction for the daemon's capacities, and 0 wrong bytes.

A third configuration, run once, makes the SSD the binding tier (DRAM 64 MiB, SSD 1 GiB =
52,428 blocks of the 182,790 the trace writes) at concurrency 1, to measure the systematic
gap explained in ``kvstore/loadgen/README.md``.

Run: ``.venv/bin/python -m bench.bench_loadgen`` (``--quick``: the first 1,500 requests,
3 rounds; ``--json`` for the raw figures). Every run uses a fresh SSD directory under
``$TMPDIR`` and removes it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness import machine
from kvstore.testing.daemon_process import DaemonProcess

REPO = Path(__file__).resolve().parents[1]
GAP_LIMIT_POINTS = 1.0
BPT = "32"


def traces_dir() -> Path | None:
    """$KVSTORE_TRACES_DIR, else ../shared/traces beside the repo (as the tests find them)."""
    env = os.environ.get("KVSTORE_TRACES_DIR")
    path = Path(env) if env else REPO.parent / "shared" / "traces"
    return path if path.is_dir() else None


def loadgen(trace: Path, store: str, extra: list[str]) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "kvstore",
        "loadgen",
        "--json",
        str(trace),
        "--store",
        store,
        "--verify",
        "--bytes-per-token",
        BPT,
        *extra,
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"loadgen failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout)


def run_daemon(trace: Path, dram: str, ssd: str, concurrency: int, limit: list[str]) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    try:
        with DaemonProcess(
            ["--dram", dram, "--ssd-dir", str(tmp / "ssd"), "--ssd-capacity", ssd]
        ) as d:
            return loadgen(trace, d.url, ["--concurrency", str(concurrency), *limit])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_embedded(trace: Path, dram: str, ssd: str, concurrency: int, limit: list[str]) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-loadgen-"))
    try:
        return loadgen(
            trace,
            "embedded",
            [
                "--dram",
                dram,
                "--ssd-dir",
                str(tmp / "ssd"),
                "--ssd-capacity",
                ssd,
                "--concurrency",
                str(concurrency),
                *limit,
            ],
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def figures(body: dict[str, Any]) -> dict[str, float]:
    tp, lat = body["throughput"], body["latency"]
    out = {
        "token_hit_rate": body["token_hit_rate"],
        "predicted_token_hit_rate": body["predicted"]["token_hit_rate"],
        "gap_points": body["gap_points"],
        "wrong_bytes": body["wrong_bytes"],
        "errors": sum(body["errors"].values()),
        "requests_per_s": tp["requests_per_s"],
        "mb_per_s": tp["mb_per_s"],
        "write_mb_per_s": tp["write_mb_per_s"],
        "read_mb_per_s": tp["read_mb_per_s"],
        "bytes_written": tp["bytes_written"],
        "bytes_read": tp["bytes_read"],
        "wall_s": tp["wall_s"],
    }
    for call in ("lookup", "get", "commit"):
        out[f"{call}_p50_ms"] = lat[call]["p50_ms"]
        out[f"{call}_p99_ms"] = lat[call]["p99_ms"]
    return out


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = traces_dir()
    trace = root / "mooncake" / "conversation_trace.jsonl" if root else None
    if trace is None or not trace.exists():
        print("bench_loadgen: sample traces not found (KVSTORE_TRACES_DIR); skipped")
        return 0
    limit = ["--requests", "1500"] if args.quick else []
    rounds = max(3, args.rounds)
    runs: dict[str, list[dict[str, float]]] = {"daemon": [], "embedded": []}
    for _ in range(rounds):  # interleaved: machine noise falls on both cases alike
        runs["daemon"].append(figures(run_daemon(trace, "1GiB", "4GiB", 8, limit)))
        runs["embedded"].append(figures(run_embedded(trace, "1GiB", "4GiB", 8, limit)))
    med = {k: median_of(v) for k, v in runs.items()}
    evict = figures(run_daemon(trace, "64MiB", "1GiB", 1, limit))
    wrong = sum(r["wrong_bytes"] for v in runs.values() for r in v) + evict["wrong_bytes"]
    out = {
        "machine": machine(),
        "rounds": rounds,
        "daemon": med["daemon"],
        "embedded": med["embedded"],
        "ssd_bound_concurrency_1": evict,
        "wrong_bytes_all_runs": wrong,
        "gap_vs_limit": abs(med["daemon"]["gap_points"]) / GAP_LIMIT_POINTS,
        "daemon_vs_embedded_requests_per_s": med["daemon"]["requests_per_s"]
        / med["embedded"]["requests_per_s"],
    }
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(table(out))
    return 0 if wrong == 0 and out["gap_vs_limit"] <= 1.0 else 1


def table(out: dict[str, Any]) -> str:
    d, e, s = out["daemon"], out["embedded"], out["ssd_bound_concurrency_1"]
    rows = [
        f"machine: {out['machine']}; median of {out['rounds']} interleaved rounds",
        f"{'figure':<30}{'daemon x8':>14}{'embedded x8':>14}{'SSD-bound x1':>14}",
    ]
    for k, fmt in (
        ("token_hit_rate", "{:.4%}"),
        ("predicted_token_hit_rate", "{:.4%}"),
        ("gap_points", "{:+.4f}"),
        ("wrong_bytes", "{:.0f}"),
        ("errors", "{:.0f}"),
        ("requests_per_s", "{:,.1f}"),
        ("mb_per_s", "{:,.1f}"),
        ("write_mb_per_s", "{:,.1f}"),
        ("read_mb_per_s", "{:,.1f}"),
        ("bytes_written", "{:,.0f}"),
        ("wall_s", "{:.1f}"),
        ("lookup_p50_ms", "{:.2f}"),
        ("lookup_p99_ms", "{:.2f}"),
        ("get_p50_ms", "{:.2f}"),
        ("get_p99_ms", "{:.2f}"),
        ("commit_p50_ms", "{:.2f}"),
        ("commit_p99_ms", "{:.2f}"),
    ):
        rows.append(f"{k:<30}" + "".join(f"{fmt.format(x[k]):>14}" for x in (d, e, s)))
    rows.append(
        f"|gap| / 1-point limit: {out['gap_vs_limit']:.4f}; daemon/embedded req/s: "
        f"{out['daemon_vs_embedded_requests_per_s']:.2f}; wrong bytes in all runs: "
        f"{out['wrong_bytes_all_runs']}"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
