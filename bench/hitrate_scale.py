"""``kvstore hitrate`` at production scale (issue #35): one exact point, the 11-point LRU
sweep and 1 % SHARDS sampling on the public kv-cache-tester sample and on that sample scaled
by replicating sessions (each copy is its own file, so its own key namespace: shifted keys),
against today's per-request simulator; and a >= 1e9-access stream in bounded memory.

Every run is a fresh interpreter (``wait4`` gives its peak RSS). Used by
``bench/bench_hitrate.py --scale``; ``python -m bench.hitrate_scale --baseline …`` and
``--stream …`` are its child processes.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from operator import itemgetter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SWEEP = "ssd=1GiB..1PiB:x4"
ISSUE_SESSIONS = 710


CPU_S: dict[str, float] = {}  # the last child's user + system seconds, by its flags


def child(argv: list[str]) -> tuple[float, int, dict]:
    """Run ``python argv`` in a fresh process: wall seconds, peak RSS bytes, its JSON (its
    CPU seconds, which the box's other load inflates less, go to ``CPU_S``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, *argv], stdout=subprocess.PIPE, stderr=err, env=env, cwd=REPO
        )
        assert proc.stdout is not None
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise RuntimeError(f"{argv}: exit {proc.returncode}: {err.read().decode()[-500:]}")
    CPU_S[" ".join(argv[2:])] = usage.ru_utime + usage.ru_stime
    return seconds, usage.ru_maxrss * 1024, json.loads(out)


def cli(path: Path, *flags: str) -> tuple[float, int, dict]:
    return child(["-m", "kvstore.hitrate", str(path), "--json", "--no-progress", *flags])


def scaled_copy(src: Path, sessions: int, dst: Path) -> Path:
    """``sessions`` session files cycling through ``src``'s (a copy is a new namespace)."""
    files = sorted(src.glob("*.json"))
    if dst.exists() and len(list(dst.glob("*.json"))) == sessions:
        return dst
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    link = os.link if os.stat(files[0]).st_dev == os.stat(dst).st_dev else shutil.copy
    for i in range(sessions):
        f = files[i % len(files)]
        link(f, dst / f"r{i // len(files):04d}_{f.name}")
    return dst


def max_error_points(exact: dict[str, Any], sampled: dict[str, Any]) -> float:
    pairs = zip([exact, *exact.get("sweep", [])], [sampled, *sampled.get("sweep", [])], strict=True)
    return max(100 * abs(a["token_hit_rate"] - b["token_hit_rate"]) for a, b in pairs)


def same_figures(today: dict, new: dict) -> tuple[bool, float]:
    """Every field today's output has, equal; the float mean ratio to within (returned)
    relative difference — today's single-pass sweep sums it per block, the simulator and
    the new engine per request."""
    worst = 0.0

    def walk(a: Any, b: Any) -> bool:
        nonlocal worst
        if isinstance(a, dict):
            return all(k in b and walk(v, b[k]) for k, v in a.items())
        if isinstance(a, list):
            return len(a) == len(b) and all(walk(x, y) for x, y in zip(a, b, strict=True))
        if isinstance(a, float) and a != b:
            worst = max(worst, abs(a - b) / max(abs(a), 1e-300))
            return math.isclose(a, b, rel_tol=1e-9)
        return bool(a == b)

    return walk(today, new), worst


def median_of(runs: int, path: Path, *flags: str) -> tuple[float, int, dict]:
    """Median seconds and largest peak RSS of ``runs`` fresh runs (interleaving is left out:
    each run is seconds long, and the box's other load shows in the spread anyway)."""
    done = []
    for _ in range(runs):
        s, rss, body = cli(path, *flags)
        done.append((s, rss, body, CPU_S[" ".join([str(path), "--json", "--no-progress", *flags])]))
    done.sort(key=lambda d: d[0])
    mid = done[len(done) // 2]
    CPU_S["median"] = mid[3]
    return mid[0], max(d[1] for d in done), mid[2]


def report(
    traces: Path,
    *,
    work: Path,
    sessions: int,
    baseline_scaled: bool,
    stream_accesses: int,
    runs: int = 3,
) -> dict[str, object]:
    """Every figure of the issue, as one flat dict (seconds, bytes, points)."""
    out: dict[str, object] = {}
    sample = traces / "kv-cache-tester"
    scaled = scaled_copy(sample, sessions, work / f"kvct{sessions}")
    sets = [("sample", sample, True), (f"scaled{sessions}", scaled, baseline_scaled)]
    for name, path, with_baseline in sets:
        one_s, one_rss, one = median_of(runs, path)
        out[f"{name}_exact_point_cpu_s"] = CPU_S["median"]
        sw_s, sw_rss, sw = median_of(runs, path, "--sweep", SWEEP)
        out[f"{name}_sweep11_cpu_s"] = CPU_S["median"]
        s1_s, s1_rss, s1 = median_of(runs, path, "--sweep", SWEEP, "--sample", "0.01")
        out[f"{name}_sample1pct_cpu_s"] = CPU_S["median"]
        acc = s1["method"]["block_accesses"]
        out.update(
            {
                f"{name}_sessions": len(list(path.glob("*.json"))),
                f"{name}_block_accesses": acc,
                f"{name}_token_hit_rate": one["token_hit_rate"],
                f"{name}_exact_point_s": one_s,
                f"{name}_exact_point_rss_mb": one_rss / 2**20,
                f"{name}_sweep11_s": sw_s,
                f"{name}_sweep11_rss_mb": sw_rss / 2**20,
                f"{name}_sample1pct_sweep11_s": s1_s,
                f"{name}_sample1pct_rss_mb": s1_rss / 2**20,
                f"{name}_sample1pct_accesses_per_s": acc / s1_s,
                f"{name}_sample1pct_max_error_points": max_error_points(sw, s1),
                f"{name}_sample1pct_stated_bound_points": s1["method"]["error_bound_points"],
            }
        )
        if with_baseline:
            b1_s, b1_rss, b1 = child(["-m", "bench.hitrate_scale", "--baseline", "one", str(path)])
            bs_s, bs_rss, bs = child(
                ["-m", "bench.hitrate_scale", "--baseline", "sweep", str(path)]
            )
            eq1, _ = same_figures(b1, one)
            eqs, worst = same_figures(bs, sw)
            out.update(
                {
                    f"{name}_today_point_s": b1_s,
                    f"{name}_today_point_rss_mb": b1_rss / 2**20,
                    f"{name}_today_sweep11_s": bs_s,
                    f"{name}_today_sweep11_rss_mb": bs_rss / 2**20,
                    f"{name}_point_equal_to_today": eq1 and b1 == _strip(one),
                    f"{name}_sweep_equal_to_today": eqs,
                    f"{name}_sweep_mean_ratio_max_rel_diff": worst,
                }
            )
    if stream_accesses:
        for rate in (1.0, 0.01):
            _s_s, s_rss, st = child(
                [
                    "-m",
                    "bench.hitrate_scale",
                    "--stream",
                    str(sample),
                    str(stream_accesses),
                    str(rate),
                ]
            )
            tag = "stream_exact" if rate == 1 else "stream_1pct"
            out[f"{tag}_accesses"] = st["accesses"]
            out[f"{tag}_s"] = st["seconds"]
            out[f"{tag}_accesses_per_s"] = st["accesses_per_s"]
            out[f"{tag}_peak_rss_mb"] = s_rss / 2**20
            out[f"{tag}_peak_rss_after_tenth_mb"] = (st["peak_rss_after_tenth"] or 0) / 2**20
            out[f"{tag}_token_hit_rate"] = st["token_hit_rate"]
    return out


def _strip(new: dict) -> dict:
    return {k: v for k, v in new.items() if k != "method"}  # sampled runs only


# -- child processes -----------------------------------------------------------------------


def baseline_main(mode: str, path: str) -> None:
    """Today's code: the per-request simulator (one point) or its single-pass sweep."""
    from kvstore.hitrate.config import SimConfig
    from kvstore.hitrate.readers import open_inputs
    from kvstore.hitrate.report import Prices, to_json
    from kvstore.hitrate.simulator import Simulator
    from kvstore.hitrate.sweep import StackSweep, parse_sweep

    reader = open_inputs([path])
    config = SimConfig()
    if mode == "one":
        sim = Simulator(config)
        sim.feed(reader.requests())
        print(json.dumps(to_json(sim.result(), config, Prices())))
        return
    sweep = StackSweep(config, [parse_sweep(SWEEP)])
    sweep.feed(reader.requests())
    body = to_json(
        sweep.base.result(), config, Prices(), sweep=sweep.points(), sweep_method="stack"
    )
    print(json.dumps(body))


def stream_main(src: str, accesses: int, rate: float) -> None:
    """Sessions of ``src`` replayed again and again, each copy with its own keys and
    starting after the previous copies' retention has run out, until ``accesses`` block
    accesses: a long day of traffic whose working set stays bounded."""
    import resource

    from kvstore.hitrate.batches import batches_of
    from kvstore.hitrate.config import SimConfig
    from kvstore.hitrate.onepass import OnePass
    from kvstore.hitrate.readers import open_inputs

    reader = open_inputs([src])
    sessions = [reader._prepare(p) for p in reader.paths]  # type: ignore[attr-defined]
    per_round = sum(s.accesses for s in sessions)
    span_s = max(d[0] for s in sessions for d in s.deltas) + 72 * 3600.0 + 1
    rounds = -(-accesses // per_round)
    rss_at: dict[str, int] = {}

    def rows():  # type: ignore[no-untyped-def]
        base = 0
        for r in range(rounds):
            streams = []
            for i, s in enumerate(sessions):
                streams.append(_shifted(s.rows(base, i), r * span_s))
                base += s.hi + 1
            yield from heapq.merge(*streams, key=itemgetter(0))
            if r == rounds // 10:
                rss_at["tenth"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    engine = OnePass([SimConfig()], sample_rate=rate)
    t0 = time.perf_counter()
    engine.feed(batches_of(rows()))
    seconds = time.perf_counter() - t0
    stats = engine.stats()
    print(
        json.dumps(
            {
                "accesses": stats.accesses,
                "seconds": seconds,
                "accesses_per_s": stats.accesses / seconds,
                "live_blocks": stats.live_blocks,
                "stack_bytes": stats.memory_bytes,
                "peak_rss_after_tenth": rss_at.get("tenth"),
                "token_hit_rate": engine.results()[0].token_hit_rate,
            }
        )
    )


def _shifted(rows, dt: float):  # type: ignore[no-untyped-def]
    for t, big_l, keys, b in rows:
        yield t + dt, big_l, keys, b


def main() -> None:
    ap = argparse.ArgumentParser(
        description="the child processes of bench_hitrate.py --scale: one baseline run of "
                    "today's simulator, or one bounded-memory stream")
    ap.add_argument("--baseline", nargs=2, metavar=("one|sweep", "PATH"))
    ap.add_argument("--stream", nargs=3, metavar=("SRC", "ACCESSES", "RATE"))
    a = ap.parse_args()
    if a.baseline:
        baseline_main(*a.baseline)
    elif a.stream:
        stream_main(a.stream[0], int(float(a.stream[1])), float(a.stream[2]))


if __name__ == "__main__":
    main()
