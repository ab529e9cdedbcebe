"""Structured decoding's cost (issue 34).

- ``libs``: the grammar libraries that install here (llguidance, xgrammar), each filling the
  next-token masks of 8 requests per step along a valid JSON document of a schema (the
  checkpoint's tokenizer), then taking the step's tokens: µs per step and per token.
- ``sampler``: the sampler's step for 8 rows free and under a JSON schema, next to the
  model's decode step for 8 requests: the step's cost ratio with the mask.
- ``engine``: 8 concurrent requests on the engine, free sampling vs the same requests under
  a JSON schema (llguidance, as ``kvengine serve`` runs it): output tokens/s of each and the
  ratio. Target: free / structured ≤ 1.3.

Each figure is the median of ``--rounds`` interleaved rounds, printed next to its peer::

    M=~/.cache/kvengine/models/smollm2-135m-instruct
    python -m bench.bench_grammar_mask libs --model $M
    python -m bench.bench_grammar_mask sampler --model $M
    python -m bench.bench_grammar_mask engine --model $M
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

BATCH = 8
SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "required": ["name", "files", "ok"],
    "properties": {
        "name": {"type": "string"},
        "ok": {"type": "boolean"},
        "files": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["path", "lines"],
            "properties": {"path": {"type": "string"},
                           "lines": {"type": "integer", "minimum": 0},
                           "kind": {"enum": ["source", "test", "doc"]}}}},
    },
}
# In the schema's property order: llguidance writes properties in that order.
DOC = {"name": "kvstore engine", "ok": True, "files": [
    {"path": f"engine/server/file_{i}.py", "lines": 100 + i, "kind": "source"}
    for i in range(12)]}


def _doc_tokens(tokenizer_json: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json).encode(json.dumps(DOC),
                                                     add_special_tokens=False).ids


def bench_llguidance(tokenizer_json: str, vocab: int, eos: int, tokens: list[int]
                     ) -> tuple[float, float]:
    """(seconds from the schema to 8 matchers and their first masks, seconds per step of 8
    after it)."""
    import llguidance
    import llguidance.torch as llt

    from engine.structured.spec import json_schema

    tok = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=eos)
    ex = llguidance.LLExecutor()
    bitmask = llt.allocate_token_bitmask(BATCH, vocab)
    t0 = time.perf_counter()
    grammar = json_schema(SCHEMA).grammar()
    matchers = [llguidance.LLMatcher(tok, grammar) for _ in range(BATCH)]
    llt.fill_next_token_bitmask_par(ex, [(m, i) for i, m in enumerate(matchers)], bitmask)
    t1 = time.perf_counter()
    for j, t in enumerate(tokens):
        if j:
            llt.fill_next_token_bitmask_par(ex, [(m, i) for i, m in enumerate(matchers)],
                                            bitmask)
        llt.consume_token_par(ex, [(m, t) for m in matchers])
    assert not any(m.is_error() for m in matchers), matchers[0].get_error()
    return t1 - t0, (time.perf_counter() - t1) / (len(tokens) - 1)


def bench_xgrammar(model_dir: Path, vocab: int, eos: int, tokens: list[int]
                   ) -> tuple[float, float]:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(model_dir / "tokenizer.json"))
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    batch = xgr.BatchGrammarMatcher()
    bitmask = xgr.allocate_token_bitmask(BATCH, vocab)
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False,
                                            separators=(", ", ": "))
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(BATCH)]
    batch.batch_fill_next_token_bitmask(matchers, bitmask)
    t1 = time.perf_counter()
    for j, t in enumerate(tokens):
        if j:
            batch.batch_fill_next_token_bitmask(matchers, bitmask)
        for m in matchers:
            assert m.accept_token(t)
    return t1 - t0, (time.perf_counter() - t1) / (len(tokens) - 1)


def libs(args: argparse.Namespace) -> dict[str, Any]:
    from engine.model.loader import load_model

    lm = load_model(args.model, progress=False)
    tj = lm.tokenizer.backend.to_str()
    vocab, eos = lm.spec.vocab_size, lm.spec.eos_token_ids[0]
    tokens = _doc_tokens(tj)
    out: dict[str, list[tuple[float, float]]] = {"llguidance": [], "xgrammar": []}
    for _ in range(args.rounds):
        out["llguidance"].append(bench_llguidance(tj, vocab, eos, tokens))
        out["xgrammar"].append(bench_xgrammar(Path(args.model), vocab, eos, tokens))
    res: dict[str, Any] = {}
    for k, v in out.items():
        first = statistics.median(a for a, _ in v)
        step = statistics.median(b for _, b in v)
        res[k] = {"ms_schema_to_first_masks_of_8": first * 1e3,
                  "us_per_step_of_8": step * 1e6, "us_per_token": step * 1e6 / BATCH}
    res["doc_tokens"] = len(tokens)
    return res


def engine_ratio(args: argparse.Namespace) -> dict[str, Any]:
    from engine.connector.store_link import NullStoreLink
    from engine.core.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.core.sampling_params import SamplingParams
    from engine.kv.namespace import engine_namespace
    from engine.model.loader import load_model
    from engine.structured.backend import GrammarBackend
    from engine.structured.spec import json_schema

    lm = load_model(args.model, dtype=args.dtype, progress=False)
    spec = lm.spec
    eng = LLMEngine(lm.model, EngineConfig(pool_tokens=4096, block_tokens=16),
                    NullStoreLink(engine_namespace(spec, 16)))
    eng.grammar = GrammarBackend(lm.tokenizer.backend.to_str(), spec.vocab_size,
                                 spec.eos_token_ids[0])
    prompt = lm.tokenizer.encode_chat([{"role": "user", "content":
                                        "List the files of a Python project as JSON."}])
    constraint = json_schema(SCHEMA)

    def run(structured: bool, seed: int) -> float:
        # ignore_eos on both: every request writes --tokens tokens, so the batch keeps its
        # 8 rows throughout (a grammar that ends early would shrink it and time that
        # instead; after its end the mask allows only the end-of-sequence token).
        params = [SamplingParams(max_new_tokens=args.tokens, temperature=1.0, seed=seed + i,
                                 ignore_eos=True,
                                 constraint=constraint if structured else None)
                  for i in range(BATCH)]
        seqs = [eng.add_request(prompt, p) for p in params]
        while any(not s.is_finished for s in seqs):
            eng.step()  # the prefill too: both runs pay the same one
        t0 = min(s.stats.first_token_s or 0 for s in seqs)
        t1 = max(s.stats.last_token_s or 0 for s in seqs)
        n = sum(len(s.output_ids) - 1 for s in seqs)
        return n / (t1 - t0)

    run(False, 0)  # warm up
    run(True, 0)
    free, structured = [], []
    for r in range(args.rounds):
        free.append(run(False, 100 * r))
        structured.append(run(True, 100 * r))
    eng.close()
    f, s = statistics.median(free), statistics.median(structured)
    return {"free_tokens_per_s": f, "structured_tokens_per_s": s, "free_over_structured": f / s,
            "batch": BATCH, "tokens": args.tokens, "dtype": args.dtype,
            "threads": torch.get_num_threads()}


def sampler_cost(args: argparse.Namespace) -> dict[str, Any]:
    """The sampler's step for 8 rows with and without a JSON schema (llguidance, as the
    engine runs it), on logits of the checkpoint's width whose argmax walks a valid
    document, next to the model's own decode step for 8 requests: what structured decoding
    adds to a step, the ratio robust to a busy machine's noise (the parts are timed
    apart, each the median of many)."""
    from engine.connector.store_link import NullStoreLink
    from engine.core.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.core.sampler import sample
    from engine.core.sampling_params import SamplingParams
    from engine.core.sequence import Sequence
    from engine.kv.namespace import engine_namespace
    from engine.model.loader import load_model
    from engine.structured.backend import GrammarBackend
    from engine.structured.spec import json_schema

    lm = load_model(args.model, dtype=args.dtype, progress=False)
    spec = lm.spec
    tj = lm.tokenizer.backend.to_str()
    backend = GrammarBackend(tj, spec.vocab_size, spec.eos_token_ids[0])
    tokens = _doc_tokens(tj)
    constraint = json_schema(SCHEMA)
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(BATCH, spec.vocab_size, generator=gen)

    def walk(structured: bool) -> float:
        seqs = []
        for i in range(BATCH):
            p = SamplingParams(max_new_tokens=10_000, temperature=0.0, seed=i,
                               constraint=constraint if structured else None)
            seq = Sequence([1, 2, 3], p)
            if structured:
                seq.constraint = backend.matcher(constraint)
            seqs.append(seq)
        times = []
        for t in tokens:
            logits = base.clone()
            logits[:, t] += 30.0  # the document's token is the argmax
            t0 = time.perf_counter()
            out = sample(logits, seqs)
            times.append(time.perf_counter() - t0)
            assert out == [t] * BATCH
            for seq in seqs:
                seq.token_ids.append(t)
        return statistics.median(times)

    free = statistics.median(walk(False) for _ in range(args.rounds))
    structured = statistics.median(walk(True) for _ in range(args.rounds))
    eng = LLMEngine(lm.model, EngineConfig(pool_tokens=4096, block_tokens=16),
                    NullStoreLink(engine_namespace(spec, 16)))
    prompt = lm.tokenizer.encode_chat([{"role": "user", "content": "Say something."}])
    seqs = [eng.add_request(prompt, SamplingParams(max_new_tokens=40, ignore_eos=True))
            for _ in range(BATCH)]
    while any(len(s.output_ids) < 2 for s in seqs):
        eng.step()  # the prefills
    steps = []
    while not all(s.is_finished for s in seqs):
        t0 = time.perf_counter()
        eng.step()
        steps.append(time.perf_counter() - t0)
    eng.close()
    step = statistics.median(steps)
    return {"sampler_free_ms": free * 1e3, "sampler_structured_ms": structured * 1e3,
            "decode_step_of_8_ms": step * 1e3,
            "structured_over_free_step": (step - free + structured) / step,
            "doc_tokens": len(tokens), "dtype": args.dtype,
            "threads": torch.get_num_threads()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("libs", "sampler", "engine"))
    p.add_argument("--model", required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64, help="new tokens per request (engine)")
    p.add_argument("--dtype", default="float32",
                   help="engine: the weights' dtype (bfloat16 matmuls are slow on CPUs)")
    args = p.parse_args()
    run = {"libs": libs, "sampler": sampler_cost, "engine": engine_ratio}[args.what]
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    main()
