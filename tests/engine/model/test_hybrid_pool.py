"""The hybrid pool (``engine.kv.sliding_tables``) changes no token: small transformers-
written Gemma 3s (windows of 8 to 24 tokens, prompts of 150) give the same greedy tokens
and bitwise the same logits with the pool that keeps the sliding layers to their window as
with the one-group pool, cold, on a pool hit and on a store hit, in exact and in bounded
mode — while every page no request holds is poisoned with NaN before each step, so a table
naming a page given back would turn the logits into NaN."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from engine.core.llm_engine import LLMEngine
from engine.model import load_model
from engine.model.loader import LoadedModel
from kvstore.embedded import open_embedded
from tests.engine.replay.harness import BT, Run, config, engine, fill, request, tokens

NEW = 5
PROMPT = 150
HIT = 7 * BT  # past every window


@pytest.fixture(scope="module", params=["gemma3_window", "gemma3_hybrid_softcap",
                                        "gemma3_hybrid_legacy_rope"])
def gemma(request: pytest.FixtureRequest, hf_checkpoint,  # type: ignore[no-untyped-def]
          tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(hf_checkpoint(request.param), dtype="float32",
                      revision_cache_dir=tmp_path_factory.mktemp("revisions"))


def poison_free_pages(eng: LLMEngine) -> None:
    """Before each forward: NaN into every page nobody holds (free, not cached), zeros back
    into held pages a previous poisoning reached (a page is written before it is read, but
    the kernels may read the unwritten tail of a request's last block, masked)."""
    run = eng.runner.run
    pool, storage = eng.blocks.pool, eng.cache.storage

    def poisoned(batch: Any) -> dict[int, int]:
        empty = [b.block_id for b in pool.blocks if b.ref_cnt == 0 and b.key is None]
        held = [b.block_id for b in pool.blocks if b.ref_cnt > 0]
        if held:
            ids = torch.tensor(held)
            storage.index_copy_(2, ids, storage.index_select(2, ids).nan_to_num(0.0))
        if empty:
            storage[:, :, torch.tensor(empty)] = float("nan")
        return run(batch)

    eng.runner.run = poisoned  # type: ignore[method-assign]


def _runs(lm: LoadedModel, hybrid: bool, keep: int | None) -> list[Run]:
    """Cold, then a pool hit, in one engine; then a store hit in a fresh engine."""
    cfg = replace(config(keep, exact=keep is None), hybrid_pool=hybrid)
    prompt = tokens(PROMPT, 21)
    out = []
    with engine(lm, cfg) as eng:
        assert eng.cache.layout.is_hybrid == hybrid
        if hybrid:
            poison_free_pages(eng)
        out.append(request(eng, prompt, NEW))
        out.append(request(eng, prompt, NEW))
    store = open_embedded(dram_bytes=64 << 20)
    try:
        fill(lm, cfg, store, prompt[:HIT])
        with engine(lm, cfg, store) as eng:
            if hybrid:
                poison_free_pages(eng)
            out.append(request(eng, prompt, NEW))
    finally:
        store.close()
    return out


@pytest.mark.parametrize("mode", ["exact", "bounded"])
def test_the_hybrid_pool_changes_no_logit_and_reads_no_freed_page(
        gemma: LoadedModel, mode: str) -> None:
    windows = [w for w in gemma.spec.layer_windows if w is not None]
    keep = None if mode == "exact" else max(windows) + 12
    one_group = _runs(gemma, hybrid=False, keep=keep)
    hybrid = _runs(gemma, hybrid=True, keep=keep)
    for what, a, b in zip(("cold", "pool hit", "store hit"), one_group, hybrid, strict=True):
        assert torch.isfinite(b.logits).all(), what
        assert b.seq.output_ids == a.seq.output_ids, what
        assert torch.equal(b.logits, a.logits), what
        assert b.seq.stats.hit_tokens == a.seq.stats.hit_tokens, what
        assert b.forward_tokens == a.forward_tokens, what
    assert hybrid[1].seq.stats.hit_tokens["hbm"] > 0
    assert hybrid[2].seq.stats.hit_tokens["dram"] == HIT
