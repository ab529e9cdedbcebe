"""Shared by the store-link tests: a real DRAM store behind ``WrappedStore``, whose hooks
make it misbehave on cue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine.engine_harness import WrappedStore, dram_store


@pytest.fixture
def store() -> Iterator[WrappedStore]:
    inner = dram_store()
    yield WrappedStore(inner)
    inner.close()
