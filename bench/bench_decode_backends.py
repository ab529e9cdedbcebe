"""Engine decode tokens/s on two attention backends, A/B in one process.

Two engines over the same loaded model, one per backend (default ``torch`` against
``cpu_paged``, the compiled paged-decode kernel), take turns, case by case: 1 and 8
concurrent requests of ``--prompt-tokens`` random prompt tokens (fresh each call), each
generating ``--new-tokens`` + 1 tokens; a request's decode rate is its tokens after the first
over the time from its first token to its last (``SequenceStats.decode_tokens_per_s``), and a
case's rate is the sum over its requests. (Not ``bench_engine vllm``'s difference of two
calls: on a loaded host the prefill's noise swamps the decode's time at 8 requests.) Each
figure is the median of ``--rounds`` interleaved rounds (each round's pair is printed too);
the ratio (second / first) comes from the same rounds. The load average is printed at start
and end: on a shared machine absolute figures are inflated, the ratio much less.

``cpu_paged_portable`` names ``cpu_paged`` with its decode kernel forced onto the portable
path (``kernels.cpu_paged.CpuPagedPortableBackend``; registered here, not in the registry):
``--backends cpu_paged_portable,cpu_paged`` is the A/B of the AVX-512 BF16 decode path.

With ``--linears A,B`` the two engines differ in their linear kernel instead (``onednn``,
``bf16gemv``, ``dense``: ``kernels/linear.py``), on the default attention backend: each gets
its own copy of the model, whose weights are prepared for its kernel during its warm-up
(``KERNELS_LINEAR`` set meanwhile; a prepared weight keeps the kernel it was prepared for).

``--cpu-time`` (needs ``KVENGINE_THREADS=1``, so the step's whole compute is the calling
thread's) rates decode by the step thread's CPU time instead of wall time: a call of
``--new-tokens`` + 1 tokens minus a call of 1 token on prompts of the same length (prefill's
CPU time cancels). On a host whose other tenants keep the cores busy, wall time measures the
scheduler; CPU time still measures the work (memory contention still shows).

``python -m bench.bench_decode_backends --model ~/.cache/kvengine/models/smollm2-135m-instruct
[--dtype bfloat16] [--backends torch,cpu_paged | --linears onednn,bf16gemv] [--batches 1,8]
[--rounds 3] [--new-tokens 64] [--cpu-time]``
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
from kernels.backend import BackendEntry, register_backend
from kernels.threads import thread_plan

#: Backends this bench registers when asked for by name (A/B peers, not served ones).
BENCH_BACKENDS = {
    "cpu_paged_portable": BackendEntry("kernels.cpu_paged", "CpuPagedPortableBackend",
                                       ("cpu",)),
}


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _linear_kernels(model: torch.nn.Module) -> str:
    """The kernels the model's prepared weights run on (what the A/B really compared)."""
    from kernels.linear import PreparedWeight

    names = {p._cached.kernel.name for m in model.modules() for p in vars(m).values()
             if isinstance(p, PreparedWeight) and p._cached is not None}
    return ", ".join(sorted(names)) or "none prepared"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_decode_backends", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="a checkpoint directory")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--backends", default="torch,cpu_paged", help="two backend names")
    p.add_argument("--batches", default="1,8", help="concurrent requests per case")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--linears", default="",
                   help="two linear kernels to compare instead of attention backends")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cpu-time", action="store_true",
                   help="rate by the step thread's CPU time (needs KVENGINE_THREADS=1)")
    args = p.parse_args(argv)
    names = (args.linears or args.backends).split(",")
    try:
        batches = [int(b) for b in args.batches.split(",")]
        if len(names) != 2 or min(batches) < 1 or args.rounds < 1 or args.new_tokens < 1:
            raise ValueError("two backends, positive batches, rounds and new tokens")
        if args.cpu_time and thread_plan().compute_threads != 1:
            raise ValueError("--cpu-time needs KVENGINE_THREADS=1 (one compute thread)")
    except ValueError as exc:
        print(f"bench_decode_backends: {exc}", file=sys.stderr)
        return 2
    for name in names:
        if name in BENCH_BACKENDS and not args.linears:
            register_backend(name, BENCH_BACKENDS[name])
    from engine.model.loader import load_model

    lm = load_model(args.model, dtype=args.dtype)
    pool = max(batches) * (args.prompt_tokens + args.new_tokens + 32) * 2
    engines = {}
    for name in names:
        model = load_model(args.model, dtype=args.dtype).model if args.linears else lm.model
        config = EngineConfig(pool_tokens=pool,
                              attention_backend=None if args.linears else name)
        engines[name] = LLMEngine(model, config,
                                  NullStoreLink(engine_namespace(lm.spec, config.block_tokens)))
    print(f"# decode A/B on {args.model.name} ({args.dtype}): {machine()}, step threads "
          f"{thread_plan().compute_threads}, {args.prompt_tokens}-token prompts, "
          f"{args.new_tokens} new tokens, {args.rounds} rounds (median); load {_load()}",
          flush=True)
    seed = [0]

    def prompts(n: int) -> list[list[int]]:
        seed[0] += 1
        g = torch.Generator().manual_seed(seed[0])
        return torch.randint(0, lm.spec.vocab_size, (n, args.prompt_tokens),
                             generator=g).tolist()

    def rate(eng: LLMEngine, n: int, tokens: int) -> float:
        if args.cpu_time:
            return cpu_rate(eng, n, tokens)
        seqs = eng.generate(prompts(n), SamplingParams(max_new_tokens=tokens, ignore_eos=True))
        return sum(seq.stats.decode_tokens_per_s(len(seq.output_ids)) for seq in seqs)

    def cpu_rate(eng: LLMEngine, n: int, tokens: int) -> float:
        spent = []
        for count in (tokens, 1):
            t0 = time.thread_time()
            eng.generate(prompts(n), SamplingParams(max_new_tokens=count, ignore_eos=True))
            spent.append(time.thread_time() - t0)
        return n * (tokens - 1) / max(spent[0] - spent[1], 1e-9)

    try:
        for name, eng in engines.items():  # warm-up: first calls are not the steady state
            before = os.environ.get("KERNELS_LINEAR")
            if args.linears:  # the weights are prepared, for this kernel, on first use
                os.environ["KERNELS_LINEAR"] = name
            try:
                rate(eng, max(batches), 2)
            finally:
                if args.linears:
                    os.environ.pop("KERNELS_LINEAR", None)
                    if before is not None:
                        os.environ["KERNELS_LINEAR"] = before
            if args.linears:
                print(f"# {name}: linears on {_linear_kernels(eng.runner.model)}", flush=True)
        rates: dict[tuple[int, str], list[float]] = {}
        for r in range(args.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for n in batches:
                for name in order:
                    rates.setdefault((n, name), []).append(
                        rate(engines[name], n, args.new_tokens + 1))
            last = {f"{name}@{n}": round(rates[(n, name)][-1], 2)
                    for n in batches for name in names}
            print(f"  round {r + 1}: {last}, load {_load()}", file=sys.stderr, flush=True)
    finally:
        for eng in engines.values():
            eng.close()
    a, b = names
    print(f"| requests | {a} tok/s | {b} tok/s | {b} / {a} |\n|---|---|---|---|")
    for n in batches:
        ma, mb = (statistics.median(rates[(n, x)]) for x in names)
        print(f"| {n} | {ma:.1f} | {mb:.1f} | {mb / ma:.2f}× |")
    print(f"# load at end {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
