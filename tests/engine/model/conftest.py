"""Fixtures for the model tests: transformers-written checkpoints, built once per session
(the private revision cache is ``tests/engine/conftest.py``'s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.model.hf_checkpoints import CASES, write_case


@pytest.fixture(scope="session")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``hf_checkpoint(name) -> Path``: the case's directory (written on first use)."""
    root = tmp_path_factory.mktemp("hf")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = write_case(CASES[name], root)
        return made[name]

    return get
