"""``kvstore hitrate`` speed (issue "Hit-rate replay tool", item 5).

1. Simulator throughput in block accesses per second (a block access = one block of one
   request's chain, looked up and committed) on one core, against the issue's limits:
   >= 2 M/s for a single ``lru`` tier and >= 1 M/s with three tiers (HBM, DRAM, SSD with
   72 h retention). Workload: seeded agent-style sessions whose chains grow each turn.
2. The Mooncake conversation trace end to end (a fresh interpreter, parse + replay +
   report) against the 1 s limit, through ``python -m kvstore.hitrate`` and through
   ``python -m kvstore hitrate`` (which also imports every other subcommand's module).
3. An 11-point DRAM sweep of that trace: single pass (stack distances) against one
   replay per point.

4. ``--scale`` (issue #35, ``bench/hitrate_scale.py``): one exact point, the 11-point
   ``--sweep ssd=1GiB..1PiB:x4`` and 1 % sampling, in seconds and peak RSS, on the public
   kv-cache-tester sample and on it scaled to ``--sessions`` (710: the issue's set) by
   replicating sessions, against today's simulator (``--baseline-scaled`` also runs it on
   the scaled set: ~20 min); and ``--stream-accesses`` (default 1e9) block accesses
   streamed through the engine in bounded memory.

5. ``--s3fifo-only`` (issue #35, ``bench/hitrate_s3fifo.py``): one S3-FIFO point and the
   11-point S3-FIFO sweep, native, against an LRU exact point from the same rounds and
   against one ``Simulator`` replay per point (before), on the sample and the scaled set.

Run: ``.venv/bin/python -m bench.bench_hitrate`` (``--quick`` for a smoke run;
``--scale-only`` for item 4 alone).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import machine, median_interleaved, timed
from kvstore.hitrate.config import SimConfig
from kvstore.hitrate.readers import open_inputs
from kvstore.hitrate.request import Request
from kvstore.hitrate.simulator import Simulator
from kvstore.hitrate.sweep import StackSweep, parse_sweep
from kvstore.units import Capacity

REPO = Path(__file__).resolve().parents[1]
B = 64
ACCESS_LIMIT_SINGLE = 2e6
ACCESS_LIMIT_THREE = 1e6
END_TO_END_LIMIT_S = 1.0


def agent_sessions(n_requests: int, seed: int = 0) -> list[Request]:
    """Sessions that re-send their whole context plus a few new blocks each turn."""
    rng = random.Random(seed)
    sessions: list[list[int]] = []
    next_id = 0
    reqs = []
    for i in range(n_requests):
        if not sessions or rng.random() < 0.05:
            sessions.append([])
        s = sessions[min(len(sessions) - 1, int(rng.expovariate(1 / 20)))]
        grow = rng.randint(1, 6)
        s.extend(range(next_id, next_id + grow))
        next_id += grow
        if len(s) > 400:  # context window: the session starts over
            del s[: len(s) - 40]
        reqs.append(Request(float(i), len(s) * B - rng.randint(0, B - 1), list(s), B))
    return reqs


def accesses(reqs: list[Request]) -> int:
    return sum(len(r.keys) for r in reqs)


def replay_rate(reqs: list[Request], config: SimConfig) -> float:
    n = accesses(reqs)

    def once() -> None:
        Simulator(config).feed(reqs)

    return n / timed(once)


def end_to_end_s(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, cwd=REPO)
    return time.perf_counter() - t0


def traces_dir() -> Path:
    return Path(os.environ.get("KVSTORE_TRACES_DIR", REPO.parent / "shared" / "traces"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--scale", action="store_true", help="also issue #35's figures")
    ap.add_argument("--scale-only", action="store_true", help="only issue #35's figures")
    ap.add_argument(
        "--s3fifo-only", action="store_true", help="only the S3-FIFO point and sweep figures"
    )
    ap.add_argument("--sessions", type=int, default=710)
    ap.add_argument("--baseline-scaled", action="store_true")
    ap.add_argument("--stream-accesses", type=float, default=1e9)
    ap.add_argument("--work-dir", default="/tmp/kvstore-bench-hitrate")
    args = ap.parse_args()
    if args.s3fifo_only:
        return s3fifo_main(args)
    if args.scale_only:
        return scale_main(args)
    runs = 3 if args.quick else 5
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core

    reqs = agent_sessions(3_000 if args.quick else 12_000)
    # Sized so that every tier both hits and evicts (about 40 % of tokens hit in DRAM).
    single = SimConfig(
        hbm=Capacity(bytes_=0), dram=Capacity(tokens=3_000 * B), ssd=Capacity(bytes_=0)
    )
    three = SimConfig(
        hbm=Capacity(tokens=500 * B),
        dram=Capacity(tokens=3_000 * B),
        ssd=Capacity(tokens=30_000 * B),
        retention_s=72 * 3600.0,
    )
    out: dict[str, object] = {"machine": machine(), "block_accesses": accesses(reqs)}
    for name, cfg in (("single", single), ("three", three)):
        sim = Simulator(cfg)
        sim.feed(reqs)
        out[f"{name}_token_hit_rate"] = sim.result().token_hit_rate
    trace = traces_dir() / "mooncake" / "conversation_trace.jsonl"
    moon = list(open_inputs([str(trace)]).requests()) if trace.exists() else []
    cases = {"single": lambda: replay_rate(reqs, single), "three": lambda: replay_rate(reqs, three)}
    if moon:
        cases["moon_single"] = lambda: replay_rate(moon, single)
        cases["moon_three"] = lambda: replay_rate(moon, three)
    med = median_interleaved(cases, runs)
    out["single_lru_accesses_per_s"] = med["single"]
    out["single_vs_limit"] = med["single"] / ACCESS_LIMIT_SINGLE
    out["three_tier_accesses_per_s"] = med["three"]
    out["three_vs_limit"] = med["three"] / ACCESS_LIMIT_THREE
    if moon:
        out["mooncake_single_lru_accesses_per_s"] = med["moon_single"]
        out["mooncake_single_vs_limit"] = med["moon_single"] / ACCESS_LIMIT_SINGLE
        out["mooncake_three_tier_accesses_per_s"] = med["moon_three"]
        out["mooncake_three_vs_limit"] = med["moon_three"] / ACCESS_LIMIT_THREE

    if moon:
        py = sys.executable
        flags = [str(trace), "--hbm", "0", "--dram", "0", "--ssd", "inf", "--json"]
        e2e = median_interleaved(
            {
                "standalone": lambda: end_to_end_s([py, "-m", "kvstore.hitrate", *flags]),
                "kvstore_cli": lambda: end_to_end_s([py, "-m", "kvstore", "hitrate", *flags]),
            },
            runs,
        )
        out["trace_end_to_end_s"] = e2e["standalone"]
        out["trace_end_to_end_vs_limit"] = END_TO_END_LIMIT_S / e2e["standalone"]
        out["trace_via_kvstore_cli_s"] = e2e["kvstore_cli"]
        out["trace_via_kvstore_cli_vs_limit"] = END_TO_END_LIMIT_S / e2e["kvstore_cli"]

        spec = parse_sweep("dram=64MiB..64GiB:x2")
        base = SimConfig(hbm=Capacity(bytes_=0), dram=Capacity(bytes_=0), ssd=Capacity())

        def stack() -> float:
            return timed(lambda: StackSweep(base, [spec]).feed(moon))

        def per_point() -> float:
            def all_points() -> None:
                for c in spec.points:
                    Simulator(base.with_capacity("dram", c)).feed(moon)

            return timed(all_points)

        sw = median_interleaved({"stack": stack, "per_point": per_point}, runs)
        out["sweep_points"] = len(spec.points)
        out["sweep_stack_s"] = sw["stack"]
        out["sweep_per_point_s"] = sw["per_point"]
        out["sweep_per_point_vs_stack"] = sw["per_point"] / sw["stack"]
    else:
        out["trace"] = f"skipped: {trace} not found"

    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            shown = f"{v:,.3f}" if isinstance(v, float) and not math.isinf(v) else v
            print(f"{k:36} {shown}")
    ok = out["single_vs_limit"] >= 1 and out["three_vs_limit"] >= 1  # type: ignore[operator]
    if args.scale:
        ok = scale_main(args) == 0 and ok
    return 0 if ok else 1


def scale_main(args: argparse.Namespace) -> int:
    from bench.hitrate_scale import report

    traces = traces_dir()
    if not (traces / "kv-cache-tester").is_dir():
        print(f"scale: skipped, {traces / 'kv-cache-tester'} not found")
        return 0
    out: dict[str, object] = {"machine": machine()}
    out.update(
        report(
            traces,
            work=Path(args.work_dir),
            sessions=args.sessions,
            baseline_scaled=args.baseline_scaled,
            stream_accesses=int(args.stream_accesses),
            runs=1 if args.quick else 3,
        )
    )
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            shown = f"{v:,.3f}" if isinstance(v, float) else v
            print(f"{k:44} {shown}")
    return 0


def s3fifo_main(args: argparse.Namespace) -> int:
    from bench.hitrate_s3fifo import report

    traces = traces_dir()
    if not (traces / "kv-cache-tester").is_dir():
        print(f"s3fifo: skipped, {traces / 'kv-cache-tester'} not found")
        return 0
    out: dict[str, object] = {"machine": machine(), "load_average": os.getloadavg()}
    out.update(
        report(
            traces,
            work=Path(args.work_dir),
            sessions=args.sessions,
            baseline_scaled=args.baseline_scaled,
            runs=1 if args.quick else 3,
        )
    )
    out["load_average_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            shown = f"{v:,.3f}" if isinstance(v, float) else v
            print(f"{k:44} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
