"""Engine fixtures: a private engine cache directory for every test, and the ``tiny``
checkpoint that ``kvengine make-model`` writes, made once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.model.loader import LoadedModel, load_model
from engine.model.make_model import make_model


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                   ) -> None:
    """Revision digests and default store directories never land in the user's cache."""
    monkeypatch.setenv("KVENGINE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight Qwen3 ``tiny`` checkpoint (float32, ChatML template)."""
    return make_model("qwen3", "tiny", tmp_path_factory.mktemp("models") / "tiny-qwen3").path


@pytest.fixture(scope="session")
def tiny(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    yield load_model(tiny_dir, revision_cache_dir=tmp_path_factory.mktemp("revisions"))
