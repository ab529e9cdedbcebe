"""Teacher-forced fidelity of a cached run, next to the noise floor of cold runs (issue 30).

One *case* is one prompt (``engine.entrypoints.fidelity_prompts``: a coding agent's session of real
text) at one context. Its **reference** is a cold prefill, ``max_batched_tokens`` = 2,048
tokens per step, alone in its engine, then ``N`` tokens generated greedily. Every other run
is **teacher-forced** on the reference's tokens: the reference's token ``i`` is fed as its
input ``i + 1`` whatever the run itself would have picked, so position ``i``'s next-token
distributions are compared on the same inputs all along. Per run, over the ``N`` positions:

- the mean and the 99th percentile of ``KL(reference ‖ run)`` (nats);
- top-1 agreement: the share of positions whose argmax equals the reference's;
- greedy agreement length: the positions before the first argmax difference. Up to it the
  forced inputs are the ones a free-running greedy run would have fed itself, so this *is*
  the free-running greedy agreement, from the same run.

The runs: the **noise floor**, cold prefills that differ only in how the engine scheduled
them: ``chunk``, ``max_batched_tokens`` = 512; ``batch``, the same request behind two other
requests (other sessions) in one engine, sharing each step's token budget. And, per
``keep`` (0 = exact mode), a **cached** run: a fresh engine whose store holds the prompt's
blocks (all but the last partial one), so the hit replays ``keep`` tokens and computes the
rest. The stores are filled by the cold runs themselves (each runs in the engine of one
``keep`` over an empty store and commits the prompt): the first ``keep`` (the default one
in the CLI) by the reference, the next ones by ``chunk`` and ``batch`` (their prefix KV
carries that run's scheduling noise, the floor's size), any further ones by a dedicated
cold run with the reference's schedule. ``fill`` names it per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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

REFERENCE_CHUNK_TOKENS = 2048
NOISE_CHUNK_TOKENS = 512
BATCH_OTHERS_TOKENS = (384, 640)  # the other requests of the ``batch`` run


@dataclass(frozen=True, slots=True)
class ForcedSettings:
    keeps_tokens: tuple[int, ...]  # 0 = exact mode
    new_tokens: int = 64
    block_tokens: int = 64
    reference_chunk_tokens: int = REFERENCE_CHUNK_TOKENS
    noise_chunk_tokens: int = NOISE_CHUNK_TOKENS
    store_dram_bytes: int = 4 << 30


@dataclass(frozen=True, slots=True)
class ForcedRun:
    """One run against the reference, at one context."""

    context_tokens: int
    run: str  # "chunk", "batch" (noise floor) or "keep N"
    mode: str  # "cold", "exact" or "bounded"
    keep_tokens: int | None
    fill: str | None  # the cold run that filled the store (cached runs)
    hit_tokens: int
    replayed_tokens: int
    positions: int
    kl_mean: float  # nats, mean over the positions
    kl_p99: float
    top1_agreement: float
    greedy_agreement_tokens: int  # positions before the first argmax difference

    def as_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Trace:
    logits: torch.Tensor  # [positions, vocab] float32, CPU
    hit_tokens: int
    replayed_tokens: int

    @property
    def tokens(self) -> list[int]:
        return self.logits.argmax(-1).tolist()


def compare(ref: Trace, got: Trace) -> tuple[float, float, float, int]:
    """(mean KL, p99 KL, top-1 agreement, greedy agreement length) of ``got`` against
    ``ref``, position by position (both forced on the same tokens)."""
    a = ref.logits.double()
    b = got.logits.double()
    kl = (a.softmax(-1) * (a.log_softmax(-1) - b.log_softmax(-1))).sum(-1).clamp_min(0)
    same = a.argmax(-1) == b.argmax(-1)
    first = int((~same).nonzero()[0, 0]) if not bool(same.all()) else len(same)
    return (kl.mean().item(), torch.quantile(kl, 0.99).item(), same.double().mean().item(),
            first)


def _engine(lm: LoadedModel, cfg: EngineConfig, store: KVStore | None) -> LLMEngine:
    policy = cfg.replay_policy(lm.spec.layer_windows)
    ns = engine_namespace(lm.spec, cfg.block_tokens, "", policy)
    # The replay's drift is measured: a bounded engine keeps no window tails here (a hit at
    # one would replay nothing).
    kind = PrimaryOnlyLink if policy.is_bounded else KVStoreLink
    link: StoreLink = (NullStoreLink(ns) if store is None
                       else kind(store, ns, "fidelity", close_store=False))
    return LLMEngine(lm.model, cfg, link)


def run_forced(eng: LLMEngine, prompt: list[int], new_tokens: int,
               forced: list[int] | None = None, others: Sequence[list[int]] = ()) -> Trace:
    """``prompt`` through ``eng`` for ``new_tokens`` steps (greedy, or ``forced``: its token
    ``i`` replaces what step ``i`` sampled), queued behind ``others`` (free-running)."""
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    rows: list[torch.Tensor] = []
    background = [eng.add_request(p, params) for p in others]
    seq = eng.add_request(prompt, params)

    def observe(seqs: list, logits: torch.Tensor) -> None:  # type: ignore[type-arg]
        rows.extend(logits[i].float().cpu() for i, s in enumerate(seqs) if s is seq)

    plain_run = eng.runner.run

    def forced_run(batch):  # type: ignore[no-untyped-def]
        out = plain_run(batch)
        if forced is not None and seq.seq_id in out:
            out[seq.seq_id] = forced[len(rows) - 1]
        return out

    eng.runner.logits_observers.append(observe)
    eng.runner.run = forced_run  # type: ignore[method-assign]
    try:
        while not seq.is_finished or any(not s.is_finished for s in background):
            eng.step()
    finally:
        eng.runner.run = plain_run  # type: ignore[method-assign]
        eng.runner.logits_observers.remove(observe)
    s = seq.stats
    return Trace(torch.stack(rows), sum(s.hit_tokens.values()), s.replayed_tokens)


class ForcedRunner:
    """The reference, the noise floor and the cached runs of one prompt."""

    def __init__(self, lm: LoadedModel, settings: ForcedSettings,
                 others: Callable[[int], list[list[int]]]) -> None:
        self.lm = lm
        self.s = settings
        self.others = others  # context -> the other requests of the ``batch`` run

    def config(self, keep: int | None, pool_tokens: int, chunk: int) -> EngineConfig:
        """``keep`` None: exact mode with no store (plain cold runs); keeps are forced:
        the CLI refuses the unsafe ones before (unless ``--force``)."""
        return EngineConfig(pool_tokens=pool_tokens, block_tokens=self.s.block_tokens,
                            max_batched_tokens=chunk, replay_keep_tokens=keep or 0,
                            replay_force=True, cache_all_layers=not keep,
                            cache_generated_tokens=False)

    def mode(self, keep: int) -> str:
        return self.config(keep, self.s.block_tokens, 1).replay_policy(
            self.lm.spec.layer_windows).mode.value

    def run_case(self, prompt: list[int], on_run: Callable[[str], None] | None = None,
                 on_row: Callable[[ForcedRun], None] | None = None,
                 skip: frozenset[str] = frozenset()) -> list[ForcedRun]:
        """The case's rows; each cached run right after the cold run that fills its store,
        so a case cut short still has the default keep next to the reference. ``skip``:
        runs already measured (by name): not run again, unless a later keep needs that cold
        run to fill its store (then it runs, unrecorded). ``on_row`` sees each row as it
        is made (a results file survives a run stopped halfway)."""
        s = self.s
        n = len(prompt)
        others = self.others(n)
        bt = s.block_tokens
        need = sum(-(-(len(p) + s.new_tokens) // bt) for p in [prompt, *others])
        pool = (need + 64) * bt  # + a replay's reserve of private blocks
        keeps = [k for k in s.keeps_tokens if f"keep {k}" not in skip]
        stores = {k: open_embedded(dram_bytes=s.store_dram_bytes) for k in keeps}
        fills = dict(zip(keeps, ("reference", "chunk", "batch"), strict=False))
        step = on_run or (lambda _name: None)
        out: list[ForcedRun] = []

        def cold(name: str, chunk: int, forced: list[int] | None,
                 extra: Sequence[list[int]] = ()) -> Trace:
            keep = next((k for k, f in fills.items() if f == name), None)
            store = stores[keep] if keep is not None else None
            with _engine(self.lm, self.config(keep, pool, chunk), store) as eng:
                t = run_forced(eng, prompt, s.new_tokens, forced, extra)
            step(name)
            return t

        def row(run: str, mode: str, keep: int | None, fill: str | None, t: Trace) -> None:
            kl, p99, top1, greedy = compare(ref, t)
            r = ForcedRun(n, run, mode, keep, fill, t.hit_tokens, t.replayed_tokens,
                          len(t.logits), kl, p99, top1, greedy)
            out.append(r)
            if on_row is not None:
                on_row(r)

        def cached(keep: int) -> None:
            if keep not in fills:  # a dedicated fill, scheduled as the reference
                fills[keep] = f"fill {keep}"
                cold(f"fill {keep}", s.reference_chunk_tokens, forced)
            cfg = self.config(keep, pool, s.reference_chunk_tokens)
            with _engine(self.lm, cfg, stores[keep]) as eng:
                t = run_forced(eng, prompt, s.new_tokens, forced)
            step(f"keep {keep}")
            row(f"keep {keep}", self.mode(keep), keep, fills[keep], t)

        try:
            ref = cold("reference", s.reference_chunk_tokens, None)
            forced = ref.tokens
            floors = (("chunk", s.noise_chunk_tokens, ()),
                      ("batch", s.reference_chunk_tokens, others))
            if keeps:
                cached(keeps[0])
            for i, (name, chunk, extra) in enumerate(floors, start=1):
                filling = len(keeps) > i
                if name not in skip or filling:
                    t = cold(name, chunk, forced, extra)
                    if name not in skip:
                        row(name, "cold", None, None, t)
                if filling:
                    cached(keeps[i])
            for keep in keeps[3:]:
                cached(keep)
        finally:
            for st in stores.values():
                st.close()
        return out
