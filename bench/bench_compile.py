"""The decode step eager against compiled (``--compile``), in one process, interleaved.

One model, one KV pool, one hand-built decode batch per request count (every sequence at
``--context`` tokens, its blocks spread over the pool): each round times ``--steps`` steps
of the eager model, then of each compiled variant, in turn, so the machine's load falls on
all alike. Prints the median step time of ≥ 3 rounds and each variant's ratio to eager, at
each thread count and request count, then the compile's cold-start cost (seconds to build
the graphs; run it twice to see inductor's on-disk cache: the second process is warm).

    PYTHONPATH=. python bench/bench_compile.py \
        --model ~/.cache/kvengine/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import kernels
from engine.core.forward_batch import DecodeMeta, ForwardBatch
from engine.kv.cache import KVCache, KVCacheShape
from engine.model.base import CausalLM
from engine.model.compiled import CompiledModel, CompileOptions, InductorStep
from engine.model.loader import load_model

BLOCK_TOKENS = 64

VARIANTS = {
    "compiled": CompileOptions(),
    "compiled+freeze": CompileOptions(freezing=True),
    "compiled-inductor-linear": CompileOptions(linear_mode="inductor", freezing=True),
    "compiled-autotune": CompileOptions(mode="max-autotune-no-cudagraphs"),
    "compiled+cpp-wrapper": CompileOptions(cpp_wrapper=True),
}


def decode_batch(kv: KVCache, requests: int, context: int, backend: kernels.AttentionBackend
                 ) -> ForwardBatch:
    per_seq = -(-(context + 1) // BLOCK_TOKENS)
    tables = torch.arange(requests * per_seq, dtype=torch.int32).view(requests, per_seq)
    pos = torch.full((requests,), context, dtype=torch.int64)
    slots = tables[:, context // BLOCK_TOKENS].long() * BLOCK_TOKENS + context % BLOCK_TOKENS
    return ForwardBatch(
        input_ids=torch.randint(0, 1000, (requests,)), positions=pos, slot_mapping=slots,
        num_prefill_tokens=0, prefill=None,
        decode=DecodeMeta(block_tables=tables, seq_lens=(pos + 1).to(torch.int32)),
        logits_indices=torch.arange(requests), backend=backend)


def time_steps(model: CausalLM, batch: ForwardBatch, kv: KVCache, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        model(batch, kv)
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_compile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="checkpoint directory")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--context", type=int, default=512, help="tokens each sequence holds")
    p.add_argument("--requests", type=int, nargs="+", default=[1, 8])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="steps timed per round")
    p.add_argument("--variants", nargs="+", default=["compiled"], choices=sorted(VARIANTS))
    args = p.parse_args(argv)

    loaded = load_model(args.model, dtype=args.dtype)
    model, spec = loaded.model, loaded.spec
    blocks = max(args.requests) * (-(-(args.context + 1) // BLOCK_TOKENS))
    kv = KVCache(KVCacheShape(spec.num_layers, blocks, BLOCK_TOKENS, spec.num_kv_heads,
                              spec.head_dim, spec.dtype), torch.device("cpu"))
    backend = kernels.resolve_backend(None, torch.device("cpu"))
    compiled: dict[str, CompiledModel] = {}
    for name in args.variants:
        m = InductorStep(VARIANTS[name]).prepare(model)
        assert isinstance(m, CompiledModel)
        compiled[name] = m
    batches = {n: decode_batch(kv, n, args.context, backend) for n in args.requests}
    # Warm every graph (and measure the builds) before timing anything.
    cold: dict[str, list[float]] = {}
    for name, m in compiled.items():
        for b in batches.values():
            t0 = time.perf_counter()
            m(b, kv)
            cold.setdefault(name, []).append(round(time.perf_counter() - t0, 2))
        if m.failed:
            print(f"{name}: compile failed, dropped")
    for n, b in batches.items():
        ref = model(b, kv)
        for name, m in compiled.items():
            diff = (m(b, kv) - ref).abs().max().item()
            print(f"{name} requests={n}: max |logit diff| vs eager {diff:.4f}")
    results = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for n, b in batches.items():
            times: dict[str, list[float]] = {"eager": [], **{k: [] for k in compiled}}
            for _ in range(args.rounds):
                times["eager"].append(time_steps(model, b, kv, args.steps))
                for name, m in compiled.items():
                    times[name].append(time_steps(m, b, kv, args.steps))
            med = {k: statistics.median(v) for k, v in times.items()}
            row = {"threads": threads, "requests": n,
                   "eager_ms": round(med["eager"] * 1e3, 2),
                   **{f"{k}_ms": round(v * 1e3, 2) for k, v in med.items() if k != "eager"},
                   **{f"{k}_speedup": round(med["eager"] / v, 3)
                      for k, v in med.items() if k != "eager"}}
            results.append(row)
            print(json.dumps(row), flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(json.dumps({"first_calls_s": cold, "loadavg": load,
                      "graphs": {k: [(e.tokens, round(e.seconds, 2), e.ok) for e in m.events]
                                 for k, m in compiled.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
