"""``kvstore hitrate --policy s3fifo`` speed (issue #35: "policies without the inclusion
property keep a per-point simulation, made fast").

On the public kv-cache-tester sample and on it scaled to ``--sessions`` (710: the issue's
set; ``bench.hitrate_scale.scaled_copy``), each figure a fresh ``python -m kvstore.hitrate
… --json --no-progress`` process: one S3-FIFO point (``--ssd inf``, 72 h: the same flags as
the LRU exact point, run in the same rounds as the peer), and the 11-point S3-FIFO sweep
``--sweep ssd=1GiB..1PiB:x4``; median of ``runs`` interleaved rounds. Against "before": one
``Simulator`` replay per point (the fallback without the native module, and the only path
before it), on the sample always and on the scaled set with ``--baseline-scaled`` (its
point only: the 11-point sweep would take ~20 min), its JSON compared field for field.

Used by ``bench/bench_hitrate.py --s3fifo``; ``python -m bench.hitrate_s3fifo --baseline
one|sweep PATH`` is its child process.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.hitrate_scale import CPU_S, SWEEP, child, cli, scaled_copy


def _round(path: Path) -> dict[str, tuple[float, float, int, dict]]:
    """One interleaved round: (wall s, CPU s, peak RSS bytes, JSON) per figure."""
    out = {}
    for name, flags in (
        ("lru_point", ()),
        ("s3fifo_point", ("--policy", "s3fifo")),
        ("s3fifo_sweep11", ("--policy", "s3fifo", "--sweep", SWEEP)),
    ):
        s, rss, body = cli(path, *flags)
        out[name] = (s, CPU_S[" ".join([str(path), "--json", "--no-progress", *flags])], rss, body)
    return out


def report(
    traces: Path, *, work: Path, sessions: int, baseline_scaled: bool, runs: int = 3
) -> dict[str, object]:
    out: dict[str, object] = {}
    sample = traces / "kv-cache-tester"
    scaled = scaled_copy(sample, sessions, work / f"kvct{sessions}")
    for name, path, baseline in (
        ("sample", sample, ("one", "sweep")),
        (f"scaled{sessions}", scaled, ("one",) if baseline_scaled else ()),
    ):
        rounds = [_round(path) for _ in range(runs)]
        for fig in rounds[0]:
            out[f"{name}_{fig}_s"] = statistics.median(r[fig][0] for r in rounds)
            out[f"{name}_{fig}_cpu_s"] = statistics.median(r[fig][1] for r in rounds)
            out[f"{name}_{fig}_rss_mb"] = max(r[fig][2] for r in rounds) / 2**20
        out[f"{name}_s3fifo_point_vs_lru_point"] = (
            out[f"{name}_s3fifo_point_s"] / out[f"{name}_lru_point_s"]  # type: ignore[operator]
        )
        out[f"{name}_s3fifo_sweep11_vs_lru_point"] = (
            out[f"{name}_s3fifo_sweep11_s"] / out[f"{name}_lru_point_s"]  # type: ignore[operator]
        )
        out[f"{name}_s3fifo_token_hit_rate"] = rounds[0]["s3fifo_point"][3]["token_hit_rate"]
        for mode in baseline:
            s, rss, body = child(["-m", "bench.hitrate_s3fifo", "--baseline", mode, str(path)])
            fig = "s3fifo_point" if mode == "one" else "s3fifo_sweep11"
            out[f"{name}_before_{fig}_s"] = s
            out[f"{name}_before_{fig}_rss_mb"] = rss / 2**20
            out[f"{name}_{fig}_speedup"] = s / out[f"{name}_{fig}_s"]  # type: ignore[operator]
            out[f"{name}_{fig}_equal_to_before"] = body == rounds[0][fig][3]
    return out


def baseline_main(mode: str, path: str) -> None:
    """Before: one ``Simulator`` replay per point (what the CLI ran for S3-FIFO)."""
    from kvstore.hitrate.config import SimConfig
    from kvstore.hitrate.readers import open_inputs
    from kvstore.hitrate.report import Prices, to_json
    from kvstore.hitrate.simulator import Simulator
    from kvstore.hitrate.sweep import SweepPoint, parse_sweep

    reader = open_inputs([path])
    config = SimConfig(policy="s3fifo")
    spec = parse_sweep(SWEEP)
    configs = [config]
    if mode == "sweep":
        configs += [config.with_capacity("ssd", c) for c in spec.points]
    results = []
    for cfg in configs:
        sim = Simulator(cfg)
        sim.feed(reader.requests())
        results.append(sim.result())
    points = [SweepPoint("ssd", c, r) for c, r in zip(spec.points, results[1:], strict=False)]
    body = to_json(
        results[0], config, Prices(), sweep=points, sweep_method="replay" if points else None
    )
    print(json.dumps(body))


def main() -> None:
    ap = argparse.ArgumentParser(
        description="the child process of bench_hitrate.py --s3fifo: today's per-point "
        "S3-FIFO simulator, one point or the 11-point sweep"
    )
    ap.add_argument("--baseline", nargs=2, metavar=("one|sweep", "PATH"), required=True)
    baseline_main(*ap.parse_args().baseline)


if __name__ == "__main__":
    main()
