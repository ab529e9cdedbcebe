"""The hybrid pool (issue 30 item 3): what a pool holds at equal bytes, and a TTFT sanity
check that nothing got slower.

Capacity (``capacity``): engines over a stand-in model with a real model's KV shapes
(Gemma 3 270M by default: 18 layers, 15 sliding over 512 tokens, 1 KV head of 256), the
same ``--pool-tokens`` of bytes, one with today's one-group pool and one with the hybrid
pool; distinct prompts of ``--prompt-tokens`` are prefilled one after another until the
pool evicts, and the tokens it then holds indexed are counted (blocks × block tokens), with
the longest prompt each admits. Also the bytes per cached token of each pool and of the
store in each replay mode.

TTFT (``ttft``): the real model (``--model``), exact mode, no store: a cold prompt of
``--ttft-tokens`` and the same prompt again (a pool hit), one-group and hybrid engines
interleaved, ``--rounds`` rounds; medians and the hybrid / one-group ratio.

    python -m bench.bench_hybrid_pool capacity
    python -m bench.bench_hybrid_pool ttft --model ~/.cache/kvengine/models/gemma3-270m
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

from engine.connector.store_link import NullStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.kv.kv_groups import KVGroupLayout
from engine.kv.namespace import engine_namespace
from engine.model import load_model
from engine.model.spec import ModelSpec
from tests.engine.fake_model import FakeModel, fake_spec

GEMMA3_270M = tuple(None if (i + 1) % 6 == 0 else 512 for i in range(18))


def _engine(model: torch.nn.Module, spec: ModelSpec, cfg: EngineConfig) -> LLMEngine:
    ns = engine_namespace(spec, cfg.block_tokens, "", cfg.replay_policy(spec.layer_windows))
    return LLMEngine(model, cfg, NullStoreLink(ns))  # type: ignore[arg-type]


def bytes_per_token(spec: ModelSpec, layers: int, elem: int = 2) -> int:
    return layers * 2 * spec.num_kv_heads * spec.head_dim * elem


def capacity(args: argparse.Namespace) -> None:
    # Head size 16 instead of 256: every page shrinks alike, so the counts are Gemma 3's
    # and the pools fit in a shared machine's memory; bytes are printed for 256.
    spec = replace(fake_spec(layers=18, context=1 << 20, windows=GEMMA3_270M),
                   num_kv_heads=1, head_dim=16)
    real = replace(spec, head_dim=256)
    base = EngineConfig(pool_tokens=args.pool_tokens, block_tokens=args.block_tokens,
                        max_batched_tokens=args.budget, attention_backend="torch",
                        cache_all_layers=True)
    print(f"Gemma 3 270M KV shapes, pool of {args.pool_tokens} tokens x 18 layers of bytes, "
          f"block {args.block_tokens}, budget {args.budget}, prompts of "
          f"{args.prompt_tokens} tokens\n")
    print("| pool | pages | longest prompt admitted | tokens held indexed | vs one-group |")
    print("|---|---|---|---|---|")
    held: dict[bool, int] = {}
    for hybrid in (False, True):
        cfg = replace(base, hybrid_pool=hybrid)
        with _engine(FakeModel(spec), spec, cfg) as eng:
            limit = (eng.kv.num_blocks - eng.kv.max_reserve_blocks) * cfg.block_tokens
            for r in range(10_000):
                prompt = [(r * 7919 + 31 * i) % 90 + 1 for i in range(args.prompt_tokens)]
                eng.generate([prompt], SamplingParams(max_new_tokens=1))
                if eng.blocks.pool.counters["evicted_blocks_total"]:
                    break
            held[hybrid] = eng.blocks.pool.num_cached * cfg.block_tokens
            eng.check_integrity()
            print(f"| {'hybrid' if hybrid else 'one group'} | {eng.blocks.pool.num_blocks} | "
                  f"{limit} | {held[hybrid]} | {held[hybrid] / held[False]:.2f}x |")
        del eng  # one pool in memory at a time
    lay = KVGroupLayout.for_windows(GEMMA3_270M)
    full, alls = bytes_per_token(real, 3), bytes_per_token(real, 18)
    win = lay.window_tokens
    print("\nBytes per cached token (bfloat16): one-group pool "
          f"{alls}; hybrid pool {full} per token past the window plus "
          f"{alls - full} per token of each running request's last {win} (+ chunk); store: "
          f"exact {alls} (full {full} + sliding {alls - full}), bounded {full}.")


def ttft(args: argparse.Namespace) -> None:
    lm = load_model(Path(args.model).expanduser(), dtype=args.dtype)
    from engine.model.tokenizer import Tokenizer
    from tests.engine.model.real_models import real_text
    ids = Tokenizer.from_dir(Path(args.model).expanduser()).encode(real_text(args.ttft_tokens * 5))
    ids = ids[: args.ttft_tokens]
    base = EngineConfig(pool_tokens=args.pool_tokens, block_tokens=args.block_tokens,
                        max_batched_tokens=args.budget, cache_all_layers=True)
    runs: dict[tuple[bool, str], list[float]] = {}
    for _ in range(args.rounds):
        for hybrid in (False, True):
            with _engine(lm.model, lm.spec, replace(base, hybrid_pool=hybrid)) as eng:
                for case in ("cold", "pool hit"):
                    (seq,) = eng.generate([ids], SamplingParams(max_new_tokens=1))
                    runs.setdefault((hybrid, case), []).append(seq.stats.ttft_s)
    print(f"{args.model}, {len(ids)}-token prompt, {args.dtype}, exact mode, "
          f"{args.rounds} round(s)\n")
    print("| case | one-group TTFT s | hybrid TTFT s | hybrid / one-group |\n|---|---|---|---|")
    for case in ("cold", "pool hit"):
        a = statistics.median(runs[(False, case)])
        b = statistics.median(runs[(True, case)])
        print(f"| {case} | {a:.3f} | {b:.3f} | {b / a:.2f} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_hybrid_pool", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("capacity", "ttft"))
    p.add_argument("--pool-tokens", type=int, default=65536)
    p.add_argument("--block-tokens", type=int, default=64)
    p.add_argument("--budget", type=int, default=2048, help="tokens per step")
    p.add_argument("--prompt-tokens", type=int, default=8192, help="capacity: prompt size")
    p.add_argument("--model", default="~/.cache/kvengine/models/gemma3-270m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--ttft-tokens", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args(argv)
    (capacity if args.what == "capacity" else ttft)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
