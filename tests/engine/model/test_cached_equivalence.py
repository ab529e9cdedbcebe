"""Gemma 3 through the whole engine against transformers: cold, on a pool hit and on a store
hit in exact mode, with prompts several sliding windows long.

The checkpoints are transformers-written Gemma 3s (``hf_checkpoints``) whose sliding
windows (8 to 24 tokens) the prompt outgrows many times over, so a hit's sliding layers
need the KV of the window before the hit (exact mode stores it in its own namespace) and a
misplaced window, RoPE or norm shows in the logits. Logits within tolerance and greedy
tokens equal up to the first near-tie, against ``generate`` on the whole prompt. Bounded
replay (the default for hybrid models) takes its keep from Gemma's windows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from engine.kv.namespace import engine_namespaces
from engine.model import load_model
from engine.model.loader import LoadedModel
from kvstore.embedded import open_embedded
from tests.engine.model.compare import assert_greedy_close, assert_logits_close
from tests.engine.model.hf_checkpoints import load_reference
from tests.engine.replay.harness import BT, Run, config, engine, fill, tokens
from tests.engine.replay.harness import request as run_request

CASES = ["gemma3_window", "gemma3_hybrid_softcap", "gemma3_hybrid_legacy_rope"]
PROMPT = 150
HIT_BLOCKS = 7  # 112 tokens: far past every window
NEW = 6


@pytest.fixture(scope="module", params=CASES)
def gemma(request: pytest.FixtureRequest, hf_checkpoint,  # type: ignore[no-untyped-def]
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoadedModel, object]]:
    path = hf_checkpoint(request.param)
    lm = load_model(path, dtype="float32",
                    revision_cache_dir=tmp_path_factory.mktemp("revisions-gemma"))
    yield lm, load_reference(path)


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


def test_the_prompt_outgrows_every_window(gemma) -> None:  # type: ignore[no-untyped-def]
    lm, _ = gemma
    windows = [w for w in lm.spec.layer_windows if w is not None]
    assert windows and max(windows) * 4 < HIT_BLOCKS * BT < PROMPT
    assert lm.spec.full_attention_layers  # hybrid: the exact mode's two namespaces
    ns = engine_namespaces(lm.spec, BT, config(exact=True).replay_policy(lm.spec.layer_windows))
    assert ns.sliding is not None


def test_cold_and_pool_hit_match_transformers(gemma) -> None:  # type: ignore[no-untyped-def]
    lm, ref = gemma
    prompt = tokens(PROMPT, 11)
    want = _reference(ref, prompt)
    with engine(lm, config(exact=True)) as eng:
        cold = run_request(eng, prompt, NEW)
        assert cold.seq.stats.computed_tokens == PROMPT
        _check(cold, want, "cold")
        hit = run_request(eng, prompt, NEW)
    assert hit.seq.stats.hit_tokens["hbm"] == (PROMPT - 1) // BT * BT
    _check(hit, want, "pool hit")


def test_store_hit_in_exact_mode_matches_transformers(gemma) -> None:  # type: ignore[no-untyped-def]
    lm, ref = gemma
    prompt = tokens(PROMPT, 12)
    want = _reference(ref, prompt)
    cfg = config(exact=True)
    store = open_embedded(dram_bytes=64 << 20)
    try:
        fill(lm, cfg, store, prompt[: HIT_BLOCKS * BT])
        with engine(lm, cfg, store) as eng:
            run = run_request(eng, prompt, NEW)
    finally:
        store.close()
    s = run.seq.stats
    assert s.hit_tokens["dram"] == HIT_BLOCKS * BT and s.replayed_tokens == 0
    assert s.computed_tokens == PROMPT - HIT_BLOCKS * BT
    _check(run, want, "store hit, exact")


def test_bounded_replay_takes_the_gemma_windows(gemma) -> None:  # type: ignore[no-untyped-def]
    """The default policy bounds the replay by Gemma's largest window (+ the margin); a keep
    covering the whole hit replays from 0 and matches transformers again."""
    lm, ref = gemma
    prompt = tokens(PROMPT, 13)
    keep = max(w for w in lm.spec.layer_windows if w is not None) + 12
    policy = config().replay_policy(lm.spec.layer_windows)
    assert policy.is_bounded and policy.keep_tokens == keep
    want = _reference(ref, prompt)
    for cfg, replayed in ((config(), keep), (config(1000), HIT_BLOCKS * BT)):
        store = open_embedded(dram_bytes=64 << 20)
        try:
            fill(lm, cfg, store, prompt[: HIT_BLOCKS * BT])
            with engine(lm, cfg, store) as eng:
                run = run_request(eng, prompt, NEW)
        finally:
            store.close()
        assert run.seq.stats.hit_tokens["dram"] == HIT_BLOCKS * BT
        assert run.seq.stats.replayed_tokens == replayed
    _check(run, want, "store hit, keep covering the hit")
