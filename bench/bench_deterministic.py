"""What ``--deterministic`` costs: tokens/s with and without it, from the same run.

Per model (trained SmolLM2-135M-Instruct and the ``small`` preset, bfloat16): cold prefill
tokens/s of one ``--prompt-tokens`` prompt, and decode tokens/s of 1 and of 8 requests
(``--decode-prompt-tokens`` each, ``--new-tokens`` each; the rate counts the steps after
every request has its first token). Each figure is the median of ``--rounds`` rounds that
interleave the standard and the deterministic engine; the ratio deterministic / standard is
printed beside it, with the load average (other jobs share the cores)::

    nice -n 10 python -m bench.bench_deterministic --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench.harness import machine
from engine.connector.store_link import NullStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.kv.namespace import engine_namespace
from engine.model.fetch import default_models_dir
from engine.model.loader import LoadedModel, load_model


def _engine(lm: LoadedModel, deterministic: bool) -> LLMEngine:
    cfg = EngineConfig(pool_tokens=32768, max_batched_tokens=2048, deterministic=deterministic)
    ns = engine_namespace(lm.spec, cfg.block_tokens, "", cfg.replay_policy(
        lm.spec.layer_windows))
    return LLMEngine(lm.model, cfg, NullStoreLink(ns))


def _prompt(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab, (n,), generator=g).tolist()


def prefill_rate(eng: LLMEngine, prompt: list[int]) -> float:
    t = time.perf_counter()
    eng.generate([prompt], SamplingParams(max_new_tokens=1, ignore_eos=True))
    return len(prompt) / (time.perf_counter() - t)


def decode_rate(eng: LLMEngine, prompts: list[list[int]], new: int) -> float:
    seqs = [eng.add_request(p, SamplingParams(max_new_tokens=new, ignore_eos=True))
            for p in prompts]
    while any(not s.output_ids for s in seqs):
        eng.step()
    t = time.perf_counter()
    while any(not s.is_finished for s in seqs):
        eng.step()
    return sum(len(s.output_ids) - 1 for s in seqs) / (time.perf_counter() - t)


def measure(lm: LoadedModel, args: argparse.Namespace) -> dict[str, dict[bool, float]]:
    vocab = lm.spec.vocab_size
    cases: dict[str, Callable[[LLMEngine, int], float]] = {
        f"prefill {args.prompt_tokens} tok": lambda e, r: prefill_rate(
            e, _prompt(args.prompt_tokens, r, vocab)),
        "decode, 1 request": lambda e, r: decode_rate(
            e, [_prompt(args.decode_prompt_tokens, 50 + r, vocab)], args.new_tokens),
        "decode, 8 requests": lambda e, r: decode_rate(
            e, [_prompt(args.decode_prompt_tokens, 60 + 8 * r + i, vocab) for i in range(8)],
            args.new_tokens),
    }
    out: dict[str, dict[bool, list[float]]] = {c: {False: [], True: []} for c in cases}
    engines = {d: _engine(lm, d) for d in (False, True)}
    try:
        for e in engines.values():  # warm-up: first-call allocations, the start-up check
            prefill_rate(e, _prompt(64, 999, vocab))
        for r in range(args.rounds):
            for i, (name, fn) in enumerate(cases.items()):
                for det in ((False, True) if r % 2 == 0 else (True, False)):
                    out[name][det].append(fn(engines[det], 1000 * r + i))
    finally:
        for e in engines.values():
            e.close()
    return {c: {d: statistics.median(v) for d, v in per.items()} for c, per in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--decode-prompt-tokens", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--models", default="smollm2-135m-instruct,small",
                   help="installed model names (kvengine fetch-model) or 'small' (made in "
                        "a temporary cache if missing)")
    args = p.parse_args(argv)
    print(f"# {machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.models.split(","):
        path = _model_dir(name)
        lm = load_model(path, dtype="bfloat16", progress=False)
        figures = measure(lm, args)
        load = os.getloadavg()[0]
        print(f"\n{name} (bfloat16)                 standard  deterministic   ratio  "
              f"load avg")
        for case, by in figures.items():
            print(f"  {case:28s} {by[False]:9.1f} {by[True]:13.1f}  {by[True] / by[False]:6.2f}"
                  f"  {load:.1f}   tok/s")
        sys.stdout.flush()
    return 0


def _model_dir(name: str) -> Path:
    if name != "small":
        return default_models_dir() / name
    from engine.model.make_model import make_model
    from engine.model.revision import default_cache_dir

    out = default_cache_dir() / "models" / "small-qwen3"
    if not (out / "config.json").is_file():
        make_model("qwen3", "small", out)
    return out


if __name__ == "__main__":
    sys.exit(main())
