"""The engine on ``cpu_paged`` gives the torch backend's tokens and logits.

The tiny Qwen3 checkpoint of ``kvengine make-model`` (4 query and 2 KV heads of 16) in its
hybrid form (even layers slide over 128 tokens), a two-agent session whose prompts share a
long header (pool prefix hits) and whose turns extend each other, prefilled in 48-token
chunks, so decode runs over windows, prefix hits and ragged batches. The random tiny model
repeats one token greedily whatever attention does, so every step's logits are compared
too, as the engine's tests compare it with transformers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.connector.store_link import NullStoreLink
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.kv.namespace import engine_namespace
from engine.model.loader import LoadedModel, load_model
from engine.model.make_model import make_model
from kernels.backend import get_backend
from kernels.cpu_paged import decode, prefill
from tests.engine.sessions import Recorded, agent_session, assert_same_session, play_recorded

pytestmark = pytest.mark.skipif(decode._ext is None, reason="kernels._paged_decode not built")


def _play(lm: LoadedModel, backend: str | None, budget: int = 48) -> Recorded:
    config = EngineConfig(pool_tokens=1024, max_batched_tokens=budget,
                          attention_backend=backend)
    link = NullStoreLink(engine_namespace(lm.spec, config.block_tokens))
    with LLMEngine(lm.model, config, link) as engine:
        assert engine.backend.name == (backend or "cpu_paged")
        return play_recorded(engine, lm, agent_session(turns_each=2))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_paged_gives_the_torch_backends_tokens(
        dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    model = make_model("qwen3", "tiny", tmp_path / "tiny", hybrid=True).path
    lm = load_model(model, dtype=dtype, revision_cache_dir=tmp_path / "revisions")
    ref = _play(lm, "torch")
    ours = _play(lm, None)  # the CPU default
    assert ours.turns[1].hit_tokens["hbm"] > 0  # the second agent reuses the header
    assert [t.token_ids for t in ours.turns] == [t.token_ids for t in ref.turns]
    if dtype == "float32":
        assert assert_same_session(ours, ref, "cpu_paged vs torch") == len(ref.turns)
    else:  # bfloat16 activations round at other places than the reference's: a looser bound
        for mine, theirs in zip(ours.logits(), ref.logits(), strict=True):
            torch.testing.assert_close(mine.float(), theirs.float(), atol=2e-2, rtol=2e-2)


class _PathsRan:
    """``decode._ext`` with a record of what each ``paged_decode`` call reported it ran."""

    def __init__(self, ext: object) -> None:
        self._ext = ext
        self.fast: list[bool] = []

    def paged_decode(self, *args: object) -> bool:
        ran = self._ext.paged_decode(*args)  # type: ignore[attr-defined]
        self.fast.append(ran)
        return ran

    def __getattr__(self, name: str) -> object:
        return getattr(self._ext, name)


def test_fast_prefill_path_gives_the_torch_backends_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``small`` preset (head_dim 64) in bfloat16: the prefill and decode kernels'
    AVX-512 BF16 paths where the CPU has them, over sliding and full layers, in 64-token
    chunks after cached prefixes."""
    monkeypatch.setenv("KVENGINE_CACHE_DIR", str(tmp_path / "cache"))
    model = make_model("qwen3", "small", tmp_path / "small", hybrid=True).path
    lm = load_model(model, dtype="bfloat16", revision_cache_dir=tmp_path / "revisions")
    calls = []
    real = prefill.paged_prefill

    def counted(*a: object, **k: object) -> torch.Tensor:
        calls.append(1)
        return real(*a, **k)  # type: ignore[arg-type]

    ref = _play(lm, "torch", budget=64)
    monkeypatch.setattr(prefill, "paged_prefill", counted)
    get_backend("cpu_paged")  # its self-check's calls (both paths) before the record starts
    paths = _PathsRan(decode._ext)
    monkeypatch.setattr(decode, "_ext", paths)
    ours = _play(lm, None, budget=64)
    assert calls  # the kernel served the prefill
    assert paths.fast and all(ran == decode.bf16_path() for ran in paths.fast)
    assert ours.turns[1].hit_tokens["hbm"] > 0
    assert [t.token_ids for t in ours.turns] == [t.token_ids for t in ref.turns]
    for mine, theirs in zip(ours.logits(), ref.logits(), strict=True):
        torch.testing.assert_close(mine.float(), theirs.float(), atol=5e-2, rtol=5e-2)
