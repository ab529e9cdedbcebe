"""Gemma 3 through the whole engine against transformers: cold, on a pool hit and on a store
hit in exact mode, with prompts longer than the sliding windows.

The checkpoints are transformers-written Gemma 3s (``hf_checkpoints``) whose sliding
windows (8 to 24 tokens, and 512 at gemma-3-270m's layer shapes) the prompt outgrows, so a
hit's sliding layers need the KV of the window before the hit (exact mode stores it in its
own namespace) and a misplaced window, RoPE or norm shows in the logits. Logits within
tolerance and greedy tokens equal up to the first near-tie, against ``generate`` on the
whole prompt. Bounded replay (the default for hybrid models) takes its keep from Gemma's
windows. The 270m-shapes case costs ~45 s on two busy cores (a 600-token prompt at hidden
640, head_dim 256), hence ``slow``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.core.config import EngineConfig
from engine.kv.namespace import engine_namespaces
from engine.model import load_model
from engine.model.loader import LoadedModel
from kvstore.embedded import open_embedded
from tests.engine.model.compare import assert_greedy_close, assert_logits_close
from tests.engine.model.hf_checkpoints import load_reference
from tests.engine.replay.harness import BT, Run, config, engine, fill, tokens
from tests.engine.replay.harness import request as run_request

# Per case: prompt tokens and hit blocks (past every window: 112 tokens, or 560 for the
# 512-token window of the 270m shapes).
CASES = {"gemma3_window": (150, 7), "gemma3_hybrid_softcap": (150, 7),
         "gemma3_hybrid_legacy_rope": (150, 7), "gemma3_270m_shapes": (600, 35)}
SMALL = ["gemma3_window", "gemma3_hybrid_softcap", "gemma3_hybrid_legacy_rope"]
NEW = 6


@dataclass
class Gemma:
    lm: LoadedModel
    ref: Any
    prompt_tokens: int
    hit_blocks: int


def _load(name: str, hf_checkpoint, root: Path) -> Gemma:  # type: ignore[no-untyped-def]
    path = hf_checkpoint(name)
    lm = load_model(path, dtype="float32", revision_cache_dir=root)
    return Gemma(lm, load_reference(path), *CASES[name])


@pytest.fixture(scope="module", params=[
    pytest.param(n, marks=pytest.mark.slow) if n not in SMALL else n for n in sorted(CASES)])
def gemma(request: pytest.FixtureRequest, hf_checkpoint,  # type: ignore[no-untyped-def]
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gemma]:
    yield _load(request.param, hf_checkpoint, tmp_path_factory.mktemp("revisions-gemma"))


@pytest.fixture(scope="module", params=SMALL)
def small_gemma(request: pytest.FixtureRequest, hf_checkpoint,  # type: ignore[no-untyped-def]
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gemma]:
    yield _load(request.param, hf_checkpoint, tmp_path_factory.mktemp("revisions-gemma"))


def _reference(ref: Any, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt)),
                           max_new_tokens=NEW, do_sample=False, output_logits=True,
                           return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), torch.stack([x[0] for x in out.logits])


def _check(run: Run, ref: tuple[list[int], torch.Tensor], what: str) -> None:
    ref_tokens, ref_logits = ref
    agreed = assert_greedy_close(run.seq.output_ids, run.logits, ref_tokens, ref_logits, what)
    assert_logits_close(run.logits[: agreed + 1], ref_logits[: agreed + 1], what)


def test_the_prompt_outgrows_every_window(gemma: Gemma) -> None:
    lm = gemma.lm
    windows = [w for w in lm.spec.layer_windows if w is not None]
    assert windows and max(windows) < gemma.hit_blocks * BT < gemma.prompt_tokens
    assert lm.spec.full_attention_layers  # hybrid: the exact mode's two namespaces
    ns = engine_namespaces(lm.spec, BT, config(exact=True).replay_policy(lm.spec.layer_windows))
    assert ns.sliding is not None


def test_cold_and_pool_hit_match_transformers(gemma: Gemma) -> None:
    lm, n = gemma.lm, gemma.prompt_tokens
    prompt = tokens(n, 11)
    want = _reference(gemma.ref, prompt)
    with engine(lm, config(exact=True)) as eng:
        cold = run_request(eng, prompt, NEW)
        assert cold.seq.stats.computed_tokens == n
        _check(cold, want, "cold")
        hit = run_request(eng, prompt, NEW)
    assert hit.seq.stats.hit_tokens["hbm"] == (n - 1) // BT * BT
    _check(hit, want, "pool hit")


def _store_hit(lm: LoadedModel, cfg: EngineConfig, prompt: list[int], hit: int,
               dram_bytes: int) -> Run:
    """``prompt`` run in a fresh engine over a store filled with its first ``hit`` tokens
    (computed by another engine of the same config)."""
    store = open_embedded(dram_bytes=dram_bytes)
    try:
        fill(lm, cfg, store, prompt[:hit])
        with engine(lm, cfg, store) as eng:
            return run_request(eng, prompt, NEW)
    finally:
        store.close()


def test_store_hit_in_exact_mode_matches_transformers(gemma: Gemma) -> None:
    lm, n, hit = gemma.lm, gemma.prompt_tokens, gemma.hit_blocks * BT
    prompt = tokens(n, 12)
    want = _reference(gemma.ref, prompt)
    run = _store_hit(lm, config(exact=True), prompt, hit, dram_bytes=256 << 20)
    s = run.seq.stats
    assert s.hit_tokens["dram"] == hit and s.replayed_tokens == 0
    assert s.computed_tokens == n - hit
    _check(run, want, "store hit, exact")


def test_bounded_replay_takes_the_gemma_windows(small_gemma: Gemma) -> None:
    """Opted into (exact is the default), the safe keep bounds the replay by Gemma's largest
    window (+ the margin); a keep covering the whole hit replays from 0 and matches
    transformers again."""
    lm, hit = small_gemma.lm, small_gemma.hit_blocks * BT
    prompt = tokens(small_gemma.prompt_tokens, 13)
    keep = max(w for w in lm.spec.layer_windows if w is not None) + 12
    assert not config().replay_policy(lm.spec.layer_windows).is_bounded
    policy = config(keep).replay_policy(lm.spec.layer_windows)
    assert policy.is_bounded and policy.keep_tokens == keep
    want = _reference(small_gemma.ref, prompt)
    for cfg, replayed in ((config(keep), keep), (config(1000), hit)):
        run = _store_hit(lm, cfg, prompt, hit, dram_bytes=64 << 20)
        assert run.seq.stats.hit_tokens["dram"] == hit
        assert run.seq.stats.replayed_tokens == replayed
    _check(run, want, "store hit, keep covering the hit")
