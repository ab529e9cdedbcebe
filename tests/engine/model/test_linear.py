"""The engine's linears on ``bf16gemv`` (the CPU default where it is built) give oneDNN's
tokens, and logits within bf16 rounding of them.

The tiny Qwen3 of ``kvengine make-model`` in bfloat16, a two-agent session prefilled in
48-token chunks (prefill products of up to 48 rows, decode of 1–2 rows, pool prefix hits),
played twice on separately loaded models (a ``PreparedWeight`` keeps the kernel it first
chose): once with ``KERNELS_LINEAR=onednn``, once with the default. The random tiny model's
greedy tokens say little on their own, so every step's logits are compared too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.connector.store_link import NullStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.kv.namespace import engine_namespace
from engine.model.linear import Linear
from engine.model.loader import LoadedModel, load_model
from kernels import gemv
from kernels.linear import PreparedWeight, _onednn_bf16
from tests.engine.sessions import Recorded, agent_session, play_recorded

pytestmark = pytest.mark.skipif(not (gemv.usable_as_default() and _onednn_bf16()),
                                reason="bf16gemv is not the default here, or no oneDNN bf16")


def _play(model_dir: Path, tmp_path: Path, kernel: str | None,
          monkeypatch: pytest.MonkeyPatch) -> Recorded:
    if kernel is None:
        monkeypatch.delenv("KERNELS_LINEAR", raising=False)
    else:
        monkeypatch.setenv("KERNELS_LINEAR", kernel)
    lm: LoadedModel = load_model(model_dir, dtype="bfloat16",
                                 revision_cache_dir=tmp_path / "revisions")
    config = EngineConfig(pool_tokens=1024, max_batched_tokens=48)
    link = NullStoreLink(engine_namespace(lm.spec, config.block_tokens))
    with LLMEngine(lm.model, config, link) as engine:
        recorded = play_recorded(engine, lm, agent_session(turns_each=2))
    # Every prepared product, the tied logits' included, ran on the kernel asked for.
    prepared = [p for m in lm.model.modules() for p in vars(m).values()
                if isinstance(p, PreparedWeight)]
    assert any(isinstance(m, Linear) for m in lm.model.modules())
    assert {p._cached.kernel.name for p in prepared if p._cached is not None} == {
        kernel or "bf16gemv"}
    return recorded


def test_bf16gemv_gives_onednns_tokens(tiny_dir: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ref = _play(tiny_dir, tmp_path, "onednn", monkeypatch)
    ours = _play(tiny_dir, tmp_path, None, monkeypatch)
    assert [t.token_ids for t in ours.turns] == [t.token_ids for t in ref.turns]
    for mine, theirs in zip(ours.logits(), ref.logits(), strict=True):
        torch.testing.assert_close(mine.float(), theirs.float(), atol=2e-2, rtol=2e-2)
