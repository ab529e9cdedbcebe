"""Engines over one shared in-process store, and single requests whose logits and forward
tokens are recorded, for comparing a cached run with a cold prefill."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.connector.store_link import (
    KVStoreLink,
    NullStoreLink,
    PrimaryOnlyLink,
    StoreLink,
)
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.sampling_params import SamplingParams
from engine.core.sequence import Sequence
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel
from kvstore.tier import KVStore

BT = 16


def config(keep: int | None = None, *, exact: bool = False, force: bool = False,
           pool_tokens: int = 2048, budget: int = 96) -> EngineConfig:
    return EngineConfig(pool_tokens=pool_tokens, block_tokens=BT, max_batched_tokens=budget,
                        attention_backend="torch", replay_keep_tokens=keep,
                        replay_force=force, cache_all_layers=exact)


def engine(lm: LoadedModel, cfg: EngineConfig, store: KVStore | None = None, *,
           tails: bool = True) -> LLMEngine:
    ns = engine_namespace(lm.spec, cfg.block_tokens, "",
                          cfg.replay_policy(lm.spec.layer_windows))
    kind = KVStoreLink if tails else PrimaryOnlyLink
    link: StoreLink = (NullStoreLink(ns) if store is None
                       else kind(store, ns, "test", close_store=False))
    return LLMEngine(lm.model, cfg, link)


@dataclass
class Run:
    seq: Sequence
    logits: torch.Tensor  # [new tokens, vocab]
    forward_tokens: int  # counted by the runner over the whole request

    @property
    def prefill_forward_tokens(self) -> int:
        """Forwarded tokens minus one per decode step (the request ran alone)."""
        return self.forward_tokens - (len(self.seq.output_ids) - 1)


def request(eng: LLMEngine, prompt: list[int], new: int = 4) -> Run:
    rows: list[torch.Tensor] = []

    def observe(seqs: list[Sequence], logits: torch.Tensor) -> None:
        rows.extend(row.clone() for row in logits)

    eng.runner.logits_observers.append(observe)
    before = eng.runner.counters["forward_tokens_total"]
    try:
        (seq,) = eng.generate([prompt], SamplingParams(max_new_tokens=new, ignore_eos=True))
    finally:
        eng.runner.logits_observers.remove(observe)
    eng.check_integrity()
    return Run(seq, torch.stack(rows), eng.runner.counters["forward_tokens_total"] - before)


def cold(lm: LoadedModel, prompt: list[int], new: int = 4) -> Run:
    with engine(lm, config(exact=True)) as eng:
        return request(eng, prompt, new)


def fill(lm: LoadedModel, cfg: EngineConfig, store: KVStore, prefix: list[int], *,
         tails: bool = False) -> None:
    """Commit ``prefix``'s full blocks (computed cold) to ``store`` under ``cfg``'s policy;
    in bounded mode without the window tail unless ``tails`` (a hit at the prefix's end then
    replays: what these tests measure); exact mode stores every layer."""
    bounded = cfg.replay_policy(lm.spec.layer_windows).is_bounded
    with engine(lm, cfg, store, tails=tails or not bounded) as eng:
        request(eng, prefix, 1)
        eng.drain()


def tokens(n: int, seed: int, vocab: int = 256) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()
