"""Fixtures for the bounded-replay engine tests: a deep-enough hybrid checkpoint written by
transformers (4 layers, sliding and full alternating, a 24-token window) so that a replay
really differs from a cold prefill, and the ``tiny --hybrid`` checkpoint ``kvengine
make-model`` writes.

The ``tiny`` preset has two layers with the sliding one first: its window's KV depends only
on the embeddings, so any keep ≥ the window reproduces a cold prefill exactly; only
the deeper checkpoint shows drift.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.model.loader import LoadedModel, load_model
from engine.model.make_model import make_model
from tests.engine.model.hf_checkpoints import BASE, Case, write_case

DEEP = Case("qwen2_replay", "Qwen2Config", "Qwen2ForCausalLM", dict(
    BASE, num_hidden_layers=4, use_sliding_window=True, sliding_window=24,
    max_window_layers=4, max_position_embeddings=2048,
    layer_types=["sliding_attention", "full_attention"] * 2))


@pytest.fixture(scope="session")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    path = write_case(DEEP, tmp_path_factory.mktemp("hf-replay"))
    yield load_model(path, revision_cache_dir=tmp_path_factory.mktemp("revisions-replay"))


@pytest.fixture(scope="session")
def tiny_hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-qwen2-hybrid"
    return make_model("qwen2", "tiny", out, hybrid=True).path
