"""Engine cold-prefill TTFT on two attention backends, A/B in one process.

Two engines over the same loaded model, one per backend (default ``torch``, ATen's flash
kernel over gathered chunks, against ``cpu_paged``, whose prefill is the compiled kernel
reading the pool in place), take turns, prompt size by prompt size: a fresh random prompt of
N token ids (never in the pool), one new token, the engine's step budget (``--budget``,
default 2 048 as ``bench_engine vllm``: a 6 K prompt is three chunks). TTFT is the wall
time of that call; the process's CPU seconds are taken beside it (on a shared host the wall
figure includes waiting for a core). Each figure is the median of ``--rounds`` rounds whose
order alternates (each round's pair is printed too); the ratio (first / second: how much
faster the second is) comes from the same rounds. The load average is printed at start and
end: absolute figures on a shared machine are inflated, the ratio much less.

``python -m bench.bench_prefill_backends --model ~/.cache/kvengine/models/smollm2-135m-instruct
[--dtype bfloat16] [--backends torch,cpu_paged] [--sizes 4096,6000] [--budget 2048]
[--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.harness import machine
from engine.connector.store_link import NullStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.kv.namespace import engine_namespace
from kernels.threads import thread_plan

ONE_TOKEN = SamplingParams(max_new_tokens=1, ignore_eos=True)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench_prefill_backends", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a checkpoint directory")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--backends", default="torch,cpu_paged", help="two backend names")
    p.add_argument("--sizes", default="4096,6000", help="prompt tokens per case")
    p.add_argument("--budget", type=int, default=2048, help="tokens per engine step")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    names = args.backends.split(",")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        if len(names) != 2 or min(sizes) < 1 or args.rounds < 1 or args.budget < 1:
            raise ValueError("two backends, positive sizes, rounds and budget")
    except ValueError as exc:
        print(f"bench_prefill_backends: {exc}", file=sys.stderr)
        return 2
    from engine.model.loader import load_model

    lm = load_model(args.model, dtype=args.dtype)
    # Every prompt of the run stays in its engine's pool (fresh ids never hit it).
    pool = (sum(sizes) * (args.rounds + 1) + 1024) // 64 * 64 + 64
    engines = {}
    for name in names:
        config = EngineConfig(pool_tokens=pool, max_batched_tokens=args.budget,
                              attention_backend=name)
        engines[name] = LLMEngine(lm.model, config,
                                  NullStoreLink(engine_namespace(lm.spec, config.block_tokens)))
    print(f"# cold prefill A/B on {args.model.name} ({args.dtype}): {machine()}, step threads "
          f"{thread_plan().compute_threads}, budget {args.budget}, {args.rounds} rounds "
          f"(median); load {_load()}", flush=True)
    seed = [0]

    def ttft(eng: LLMEngine, n: int) -> tuple[float, float]:
        seed[0] += 1
        g = torch.Generator().manual_seed(seed[0])
        ids = torch.randint(0, lm.spec.vocab_size, (n,), generator=g).tolist()
        c0, t0 = time.process_time(), time.perf_counter()
        (seq,) = eng.generate([ids], ONE_TOKEN)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if seq.stats.computed_tokens < n:  # a pool hit would not be a cold prefill
            raise RuntimeError(f"prompt of {n} computed only {seq.stats.computed_tokens}")
        return wall, cpu

    walls: dict[tuple[int, str], list[float]] = {}
    cpus: dict[tuple[int, str], list[float]] = {}
    try:
        for eng in engines.values():  # warm-up: first-call costs are not the steady state
            ttft(eng, min(sizes[0], 512))
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for n in sizes:
                for name in order:
                    wall, cpu = ttft(engines[name], n)
                    walls.setdefault((n, name), []).append(wall)
                    cpus.setdefault((n, name), []).append(cpu)
            last = {f"{name}@{n}": round(walls[(n, name)][-1], 2)
                    for n in sizes for name in names}
            print(f"  round {r + 1}: {last}, load {_load()}", file=sys.stderr, flush=True)
    finally:
        for eng in engines.values():
            eng.close()
    a, b = names
    print(f"| prompt | {a} TTFT s | {b} TTFT s | {b} faster by | {a} CPU s | {b} CPU s "
          f"| CPU ratio |\n|---|---|---|---|---|---|---|")
    for n in sizes:
        wa, wb = (statistics.median(walls[(n, x)]) for x in names)
        ca, cb = (statistics.median(cpus[(n, x)]) for x in names)
        print(f"| {n} | {wa:.2f} | {wb:.2f} | {wa / wb:.2f}× | {ca:.2f} | {cb:.2f} "
              f"| {ca / cb:.2f}× |")
    print(f"# load at end {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
