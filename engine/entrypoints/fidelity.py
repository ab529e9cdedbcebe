"""How far a cached run's logits drift from a cold prefill (issue 12, DESIGN §11).

One *case* is a prompt, a hit length and a number of turns. Its reference is cold: every
turn's prompt prefilled from nothing in a fresh engine without a store, ``N`` tokens
generated greedily. Turn ``t + 1``'s prompt is turn ``t``'s, the cold answer, then new
user tokens, so every policy sees the same inputs. Then, per ``keep`` (0 = exact mode),
a store is filled with the hit's blocks (computed cold under that policy) and every turn
runs in a fresh engine over that store: the first turn hits the filled prefix, later turns
hit what the earlier ones committed, KV computed after a replay included, so drift
compounds as in a real conversation.

Per turn: the largest and mean absolute logit difference and the mean KL divergence
``KL(cold ‖ cached)`` of the next-token distributions over the steps whose inputs are still
the same (up to and including the first step the greedy tokens differ), and the greedy
agreement: the share of the ``N`` tokens generated before the first difference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

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
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel
from kvstore.embedded import open_embedded
from kvstore.tier import KVStore


@dataclass(frozen=True, slots=True)
class FidelityCase:
    """One prompt (token ids) whose first ``hit_blocks`` blocks are cached before turn 1."""

    prompt_index: int
    prompt_ids: tuple[int, ...]
    hit_fraction: float


@dataclass(frozen=True, slots=True)
class FidelitySettings:
    keeps_tokens: tuple[int, ...]  # 0 = exact mode (every layer cached)
    turns: int  # turns per session: turn 1 hits the filled prefix, later ones earlier turns
    turn_tokens: int  # new user tokens appended per later turn
    new_tokens: int  # tokens generated (greedy) per turn
    seed: int
    block_tokens: int = 64
    max_batched_tokens: int = 2048
    store_dram_bytes: int = 1 << 30


@dataclass(frozen=True, slots=True)
class TurnFidelity:
    keep_tokens: int
    mode: str  # "exact" or "bounded"
    prompt_index: int
    hit_fraction: float
    turn: int  # from 1
    prompt_tokens: int
    hit_tokens: int
    replayed_tokens: int
    compared_steps: int
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    kl_divergence: float  # mean over the compared steps, nats
    greedy_agreement: float  # share of the new tokens before the first difference


@dataclass(frozen=True, slots=True)
class Generated:
    token_ids: list[int]
    logits: torch.Tensor  # [new tokens, vocab], float32 on the CPU
    hit_tokens: int
    replayed_tokens: int


def compare(cold: Generated, cached: Generated) -> tuple[int, float, float, float, float]:
    """(compared steps, max |Δ|, mean |Δ|, mean KL(cold ‖ cached), greedy agreement)."""
    n = len(cold.token_ids)
    same = next((i for i, (a, b) in enumerate(zip(cold.token_ids, cached.token_ids,
                                                  strict=True)) if a != b), n)
    steps = min(same + 1, n)  # the first differing step still had the same input
    a = cold.logits[:steps].double()
    b = cached.logits[:steps].double()
    diff = (a - b).abs()
    kl = (a.softmax(-1) * (a.log_softmax(-1) - b.log_softmax(-1))).sum(-1)
    return (steps, diff.max().item(), diff.mean().item(), kl.clamp_min(0).mean().item(),
            same / n)


def _engine(lm: LoadedModel, cfg: EngineConfig, store: KVStore | None) -> LLMEngine:
    policy = cfg.replay_policy(lm.spec.layer_windows)
    ns = engine_namespace(lm.spec, cfg.block_tokens, "", policy)
    # The replay's drift is measured: a bounded engine keeps no window tails here (a hit at
    # one would replay nothing).
    kind = PrimaryOnlyLink if policy.is_bounded else KVStoreLink
    link: StoreLink = (NullStoreLink(ns) if store is None
                       else kind(store, ns, "fidelity", close_store=False))
    return LLMEngine(lm.model, cfg, link)


def _generate(eng: LLMEngine, prompt: list[int], new_tokens: int) -> Generated:
    rows: list[torch.Tensor] = []

    def observe(seqs: object, logits: torch.Tensor) -> None:
        rows.extend(row.float().cpu() for row in logits)

    eng.runner.logits_observers.append(observe)
    try:
        (seq,) = eng.generate([prompt], SamplingParams(max_new_tokens=new_tokens,
                                                       ignore_eos=True))
    finally:
        eng.runner.logits_observers.remove(observe)
    s = seq.stats
    return Generated(list(seq.output_ids), torch.stack(rows), sum(s.hit_tokens.values()),
                     s.replayed_tokens)


class FidelityRunner:
    """Runs the cases of one model under every ``keep`` of the settings."""

    def __init__(self, lm: LoadedModel, settings: FidelitySettings) -> None:
        self.lm = lm
        self.s = settings
        self._gen = torch.Generator().manual_seed(settings.seed)
        # Refusals (a model without full-attention layers, a bad keep) before any work.
        for keep in settings.keeps_tokens:
            self.config(keep, pool_tokens=settings.block_tokens)

    def config(self, keep: int, pool_tokens: int) -> EngineConfig:
        """Exact mode for keep 0; a bounded keep below the safe default is measured too
        (forced): showing that drift is what the report is for."""
        return EngineConfig(pool_tokens=pool_tokens, block_tokens=self.s.block_tokens,
                            max_batched_tokens=self.s.max_batched_tokens,
                            replay_keep_tokens=keep, replay_force=True,
                            cache_all_layers=keep == 0)

    def user_tokens(self, n: int) -> list[int]:
        return torch.randint(0, self.lm.spec.vocab_size, (n,), generator=self._gen).tolist()

    def run_case(self, case: FidelityCase) -> list[TurnFidelity]:
        s = self.s
        prompts: list[list[int]] = []
        cold: list[Generated] = []
        prompt = list(case.prompt_ids)
        longest = len(prompt) + s.turns * (s.new_tokens + s.turn_tokens)
        pool = (-(-longest // s.block_tokens) + 64) * s.block_tokens  # + replay reserve
        for t in range(s.turns):
            if t:
                prompt = prompt + cold[-1].token_ids + self.user_tokens(s.turn_tokens)
            prompts.append(prompt)
            with _engine(self.lm, self.config(0, pool), None) as eng:
                cold.append(_generate(eng, prompt, s.new_tokens))
        hit_blocks = min(int(len(case.prompt_ids) * case.hit_fraction) // s.block_tokens,
                         (len(case.prompt_ids) - 1) // s.block_tokens)
        rows: list[TurnFidelity] = []
        for keep in s.keeps_tokens:
            cfg = self.config(keep, pool)
            mode = cfg.replay_policy(self.lm.spec.layer_windows).mode.value
            store = open_embedded(dram_bytes=s.store_dram_bytes)
            try:
                if hit_blocks:
                    with _engine(self.lm, cfg, store) as eng:  # the cached prefix, cold
                        _generate(eng, list(case.prompt_ids[: hit_blocks * s.block_tokens]), 1)
                for t, (p, ref) in enumerate(zip(prompts, cold, strict=True)):
                    with _engine(self.lm, cfg, store) as eng:  # close() commits the turn
                        got = _generate(eng, p, s.new_tokens)
                    steps, mx, mean, kl, agree = compare(ref, got)
                    rows.append(TurnFidelity(keep, mode, case.prompt_index, case.hit_fraction,
                                             t + 1, len(p), got.hit_tokens, got.replayed_tokens,
                                             steps, mx, mean, kl, agree))
            finally:
                store.close()
        return rows

    def run(self, cases: Iterable[FidelityCase],
            on_case: Callable[[], None] | None = None) -> list[TurnFidelity]:
        out: list[TurnFidelity] = []
        for case in cases:
            out.extend(self.run_case(case))
            if on_case is not None:
                on_case()
        return out


@dataclass(frozen=True, slots=True)
class FidelitySummary:
    """Every case's turn ``turn`` under one ``keep``."""

    keep_tokens: int
    mode: str
    turn: int
    runs: int
    mean_replayed_tokens: float
    max_abs_logit_diff: float
    mean_abs_logit_diff: float
    mean_kl_divergence: float
    max_kl_divergence: float
    mean_greedy_agreement: float
    min_greedy_agreement: float

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def summarize(rows: list[TurnFidelity]) -> list[FidelitySummary]:
    groups: dict[tuple[int, int], list[TurnFidelity]] = {}
    for r in rows:
        groups.setdefault((r.keep_tokens, r.turn), []).append(r)
    out = []
    for (keep, turn), g in sorted(groups.items()):
        n = len(g)
        out.append(FidelitySummary(
            keep, g[0].mode, turn, n, sum(r.replayed_tokens for r in g) / n,
            max(r.max_abs_logit_diff for r in g), sum(r.mean_abs_logit_diff for r in g) / n,
            sum(r.kl_divergence for r in g) / n, max(r.kl_divergence for r in g),
            sum(r.greedy_agreement for r in g) / n, min(r.greedy_agreement for r in g)))
    return out
