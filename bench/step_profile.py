"""Where a decode step's time goes, and what it costs, per step, on two source trees.

A decode step's time is taken as a difference of two ``generate`` calls on fresh random
prompts of the same length: ``--new-tokens`` + 1 tokens minus 1 token, over
``--new-tokens`` steps (the prefill cancels). ``--profile`` prints the per-function table
of that difference (cProfile's own time, ms per step, and calls per step): what the lead
used to split a step into kernels and the Python around them.

``--trees A,B`` runs this script on two source trees (e.g. an export of the branch point
and the worktree: ``git archive <commit> | tar -x -C /tmp/base``), one subprocess per tree
and per round, interleaved (A B, then B A, …), and prints the median ms per step of each at
every batch size with the ratio B / A from the same rounds. ``--cpu-time`` (with
``KVENGINE_THREADS=1``) times the step thread's CPU time instead of the wall clock: on a
host other tenants keep busy it still measures the step's work. The compiled extensions are
read from each tree itself (an export needs its ``kernels/*.so`` copied beside it).

``--paths`` compares, in one process and interleaved over ``--rounds``, the eager step on
its layer plans (``engine.model.eager_step``) with the module path it replaces.

``PYTHONPATH=. python -m bench.step_profile --model ~/.cache/kvengine/models/smollm2-135m-instruct
[--batches 1,8] [--new-tokens 128] [--prompt-tokens 512] [--profile] [--trees A,B --rounds 3]``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _engine(model_dir: Path, dtype: str, pool_tokens: int):  # type: ignore[no-untyped-def]
    from engine.connector.store_link import NullStoreLink
    from engine.core.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.kv.namespace import engine_namespace
    from engine.model.loader import load_model

    lm = load_model(model_dir, dtype=dtype)
    config = EngineConfig(pool_tokens=pool_tokens)
    return LLMEngine(lm.model, config, NullStoreLink(engine_namespace(lm.spec,
                                                                      config.block_tokens))), lm


def measure(args: argparse.Namespace) -> dict[str, float]:
    """ms per decode step at each batch size (median of ``--repeats`` differences)."""
    from engine.core.sampling_params import SamplingParams

    batches = [int(b) for b in args.batches.split(",")]
    eng, lm = _engine(args.model, args.dtype,
                      max(batches) * (args.prompt_tokens + args.new_tokens + 32) * 2)
    seed = [0]

    def run(n: int, tokens: int) -> float:
        seed[0] += 1
        g = torch.Generator().manual_seed(seed[0])
        prompts = torch.randint(0, lm.spec.vocab_size, (n, args.prompt_tokens),
                                generator=g).tolist()
        clock = time.thread_time if args.cpu_time else time.perf_counter
        t0 = clock()
        eng.generate(prompts, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
        return clock() - t0

    out: dict[str, float] = {}
    if args.paths:
        return _paths_ab(args, batches, run)
    try:
        run(max(batches), 3)  # warm-up: weights prepared, first calls paid
        for n in batches:
            diffs = [(run(n, args.new_tokens + 1) - run(n, 1)) / args.new_tokens
                     for _ in range(args.repeats)]
            out[str(n)] = 1e3 * statistics.median(diffs)
        if args.profile:
            for n in batches:
                print(f"\n# profile, {n} requests (ms per step, calls per step)")
                _profile_table(lambda k, n=n: run(n, k), args.new_tokens, args.top)
    finally:
        eng.close()
    return out


def _paths_ab(args: argparse.Namespace, batches: list[int], run) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """In one process, interleaved: the eager step on its layer plans against the module
    path (``EagerLayers.usable`` forced False), ms per step each and the ratio."""
    from engine.model.eager_step import EagerLayers

    usable = EagerLayers.usable
    per: dict[tuple[int, str], list[float]] = {}
    try:
        run(max(batches), 3)
        for r in range(args.rounds):
            for n in batches:
                for path in (("plans", "modules") if r % 2 == 0 else ("modules", "plans")):
                    EagerLayers.usable = usable if path == "plans" else (  # type: ignore[method-assign]
                        lambda self: False)
                    d = [(run(n, args.new_tokens + 1) - run(n, 1)) / args.new_tokens
                         for _ in range(args.repeats)]
                    per.setdefault((n, path), []).append(1e3 * statistics.median(d))
            print(f"  round {r + 1}: " + ", ".join(f"{p}@{n} {v[-1]:.2f}"
                                                  for (n, p), v in per.items())
                  + f"; load {_load()}", file=sys.stderr, flush=True)
    finally:
        EagerLayers.usable = usable  # type: ignore[method-assign]
    print("| requests | module path ms/step | plans ms/step | plans / modules |\n"
          "|---|---|---|---|")
    out = {}
    for n in batches:
        m, p = (statistics.median(per[(n, x)]) for x in ("modules", "plans"))
        print(f"| {n} | {m:.2f} | {p:.2f} | {p / m:.2f}× |")
        out[str(n)] = p
    return out


def _profile_table(run, steps: int, top: int) -> None:  # type: ignore[no-untyped-def]
    stats = []
    for tokens in (steps + 1, 1):
        prof = cProfile.Profile()
        prof.enable()
        run(tokens)
        prof.disable()
        stats.append(pstats.Stats(prof).stats)  # type: ignore[attr-defined]
    long, short = stats
    rows = []
    for fn, (_, calls, own, cum, _) in long.items():
        s = short.get(fn, (0, 0, 0.0, 0.0, None))
        rows.append(((own - s[2]) / steps * 1e3, (cum - s[3]) / steps * 1e3,
                     (calls - s[1]) / steps, fn))
    total = sum(r[0] for r in rows)
    print(f"total own time {total:.2f} ms/step (under cProfile)")
    print("| own ms | cum ms | calls | function |\n|---|---|---|---|")
    for own, cum, calls, (file, line, name) in sorted(rows, key=lambda r: -r[0])[:top]:
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}" if line else file
        print(f"| {own:.3f} | {cum:.3f} | {calls:.0f} | {where} {name} |")


def compare(args: argparse.Namespace, trees: list[str]) -> int:
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    print(f"# step_profile A/B: {args.model.name} ({args.dtype}), {args.prompt_tokens}-token "
          f"prompts, {args.new_tokens} steps, {args.rounds} rounds; load {_load()}", flush=True)
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            cmd = [sys.executable, "-m", "bench.step_profile", "--model", str(args.model),
                   "--dtype", args.dtype, "--batches", args.batches, "--new-tokens",
                   str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens),
                   "--repeats", str(args.repeats), "--json"]
            if args.cpu_time:
                cmd.append("--cpu-time")
            env = dict(os.environ, PYTHONPATH=tree)
            done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                                  check=False)
            if done.returncode != 0:
                print(f"step_profile: {tree} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            results[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  round {r + 1} {tree}: {results[tree][-1]} load {_load()}",
                  file=sys.stderr, flush=True)
    a, b = trees
    print("| requests | A ms/step | B ms/step | B / A |\n|---|---|---|---|")
    for n in args.batches.split(","):
        ma = statistics.median(x[n] for x in results[a])
        mb = statistics.median(x[n] for x in results[b])
        print(f"| {n} | {ma:.2f} | {mb:.2f} | {mb / ma:.2f}× |")
    print(f"# A = {a}\n# B = {b}\n# load at end {_load()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="step_profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a checkpoint directory")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--batches", default="1,8", help="concurrent requests per case")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128, help="decode steps measured")
    p.add_argument("--repeats", type=int, default=3, help="differences per figure (median)")
    p.add_argument("--profile", action="store_true", help="print the per-function table")
    p.add_argument("--top", type=int, default=40, help="rows of the table")
    p.add_argument("--trees", default="", help="two source trees to compare, A,B")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds with --trees")
    p.add_argument("--json", action="store_true", help="one JSON line of ms per step")
    p.add_argument("--paths", action="store_true",
                   help="in one process: the eager layer plans against the module path")
    p.add_argument("--cpu-time", action="store_true",
                   help="the step thread's CPU time instead of wall time (needs "
                        "KVENGINE_THREADS=1: on a loaded host it measures the work, not "
                        "the scheduler)")
    args = p.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
        if min(batches) < 1 or args.new_tokens < 1 or args.repeats < 1 or args.rounds < 1:
            raise ValueError("batches, new tokens, repeats and rounds must be positive")
        trees = [t for t in args.trees.split(",") if t]
        if trees and (len(trees) != 2 or not all(Path(t).is_dir() for t in trees)):
            raise ValueError("--trees needs two existing directories")
        if args.cpu_time and os.environ.get("KVENGINE_THREADS") != "1":
            raise ValueError("--cpu-time needs KVENGINE_THREADS=1 (one compute thread)")
        if not args.model.is_dir():
            raise ValueError(f"no checkpoint directory at {args.model}")
    except ValueError as exc:
        print(f"step_profile: {exc}", file=sys.stderr)
        return 2
    if trees:
        return compare(args, trees)
    ms = measure(args)
    if args.json:
        print(json.dumps(ms))
    else:
        print(f"# ms per decode step {ms}; load {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
