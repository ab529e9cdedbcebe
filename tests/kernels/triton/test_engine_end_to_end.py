"""The engine on the Triton backend gives the torch backend's tokens and logits.

The tiny Qwen3 checkpoint of ``kvengine make-model`` (float32, 4 query and 2 KV heads of
16) in its hybrid form (even layers slide over 128 tokens), a two-agent session whose
prompts share a long header (pool prefix hits) and whose turns extend each other, prefilled
in 48-token chunks: every kernel the engine calls (write_kv_slots, chunked prefill over a
cached prefix, windows, decode) runs on Triton, here in its interpreter. The random tiny
model repeats one token greedily whatever attention does, so the logits of every step are
compared too (float32, 1e-4), as the engine's tests compare it with transformers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.kernels.triton.conftest import DEVICE

try:
    from engine.connector.store_link import NullStoreLink
    from engine.core.config import EngineConfig
    from engine.core.llm_engine import LLMEngine
    from engine.kv.namespace import engine_namespace
    from engine.model.loader import LoadedModel, load_model
    from engine.model.make_model import make_model
    from tests.engine.sessions import Recorded, agent_session, assert_same_session, play_recorded
except ImportError as exc:  # a GPU machine with the kernels' dependencies only
    pytest.skip(f"the engine cannot be imported here: {exc}", allow_module_level=True)


def _play(lm: LoadedModel, backend: str) -> Recorded:
    config = EngineConfig(pool_tokens=1024, max_batched_tokens=48, attention_backend=backend)
    link = NullStoreLink(engine_namespace(lm.spec, config.block_tokens))
    with LLMEngine(lm.model, config, link) as engine:
        assert engine.backend.name == backend
        return play_recorded(engine, lm, agent_session(turns_each=2))


def test_triton_gives_the_torch_backends_tokens(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    model = make_model("qwen3", "tiny", tmp_path / "tiny", hybrid=True).path
    lm = load_model(model, device=DEVICE, revision_cache_dir=tmp_path / "revisions")
    ref = _play(lm, "torch")
    ours = _play(lm, "triton")
    assert ours.turns[1].hit_tokens["hbm"] > 0  # the second agent reuses the header
    assert [t.token_ids for t in ours.turns] == [t.token_ids for t in ref.turns]
    assert assert_same_session(ours, ref, "triton vs torch") == len(ref.turns)
