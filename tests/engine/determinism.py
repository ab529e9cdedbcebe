"""One request's logits under every condition deterministic mode promises to hide: alone,
among seven others, its prefill chunked at 128 tokens, its prefix from the pool, and its
prefix from a store another engine filled (exact mode: every layer stored)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence as Request
from engine.model.loader import LoadedModel
from kvstore.embedded import open_embedded
from tests.engine.replay.harness import engine, tokens

BT = 16
CHUNK = 128
OTHERS = 7


#: The attention backend the runs without ``--deterministic`` pin: the torch reference, whose
#: prefix/diagonal split changes a row's reduction order with chunking and cached prefixes.
#: The CPU default (``cpu_paged``: the C prefill kernel walks key tiles in one fixed order)
#: no longer differs under these conditions on these models, so it cannot show that they bite.
REFERENCE_BACKEND = "torch"


def config(deterministic: bool, budget: int = 2048) -> EngineConfig:
    return EngineConfig(pool_tokens=16384, block_tokens=BT, max_batched_tokens=budget,
                        replay_keep_tokens=0, cache_all_layers=True,
                        deterministic=deterministic,
                        attention_backend=None if deterministic else REFERENCE_BACKEND)


@dataclass(frozen=True)
class Outcome:
    logits: torch.Tensor  # [new tokens, vocab] float32
    token_ids: tuple[int, ...]
    hit_tokens: dict[str, int]  # by tier


def run(eng: LLMEngine, prompt: list[int], params: SamplingParams,
        others: Sequence[list[int]] = ()) -> Outcome:
    """``prompt`` (first) with ``others`` in one continuous batch; its rows only."""
    rows: dict[int, list[torch.Tensor]] = {}

    def observe(seqs: list[Request], logits: torch.Tensor) -> None:
        for seq, row in zip(seqs, logits, strict=True):
            rows.setdefault(seq.seq_id, []).append(row.clone())

    eng.runner.logits_observers.append(observe)
    try:
        seqs = eng.generate([prompt, *others], params)
    finally:
        eng.runner.logits_observers.remove(observe)
    eng.check_integrity()
    mine = seqs[0]
    return Outcome(torch.stack(rows[mine.seq_id]), tuple(mine.output_ids),
                   dict(mine.stats.hit_tokens))


def others_for(prompt_tokens: int, vocab: int) -> list[list[int]]:
    """Seven requests of ragged lengths (some shorter, some longer than the prompt)."""
    return [tokens(prompt_tokens // 3 + 37 * i, 100 + i, vocab) for i in range(OTHERS)]


def outcomes(lm: LoadedModel, prompt: list[int], params: SamplingParams,
             deterministic: bool, *, cached: bool = True) -> dict[str, Outcome]:
    """The request under each condition; ``hit`` tokens of its prefix come from a cache.
    ``cached=False`` leaves out the two cached-prefix conditions (three engines, not five:
    for a model too slow on a loaded machine to run all five)."""
    vocab = lm.spec.vocab_size
    hit = (len(prompt) * 2 // 3) // BT * BT
    out: dict[str, Outcome] = {}
    with engine(lm, config(deterministic)) as eng:
        out["alone"] = run(eng, prompt, params)
    with engine(lm, config(deterministic)) as eng:
        out["among 7 others"] = run(eng, prompt, params, others_for(len(prompt), vocab))
    with engine(lm, config(deterministic, budget=CHUNK)) as eng:
        out[f"chunked at {CHUNK}"] = run(eng, prompt, params)
    if not cached:
        return out
    with engine(lm, config(deterministic)) as eng:
        run(eng, prompt[:hit], SamplingParams(max_new_tokens=1, ignore_eos=True))
        out["prefix from the pool"] = run(eng, prompt, params)
        assert out["prefix from the pool"].hit_tokens["hbm"] == hit
    store = open_embedded(dram_bytes=256 << 20)
    try:
        with engine(lm, config(deterministic), store) as eng:  # another engine fills it
            run(eng, prompt[:hit], SamplingParams(max_new_tokens=1, ignore_eos=True))
            eng.drain()
        with engine(lm, config(deterministic), store) as eng:
            out["prefix from the store"] = run(eng, prompt, params)
        assert out["prefix from the store"].hit_tokens["dram"] == hit
    finally:
        store.close()
    return out


def differing(results: dict[str, Outcome]) -> list[str]:
    """The conditions whose logits are not bitwise those of ``alone``."""
    base = results["alone"].logits
    return [name for name, o in results.items()
            if o.logits.shape != base.shape or not torch.equal(o.logits, base)]
